// Cholesky factorizations of sparse symmetric positive definite matrices, for Newton's steps and the
// adjoint solve: dense for small systems, else CHOLMOD's Cholesky (supernodal or simplicial, as its
// analysis's counts say), or Eigen's simplicial LDL^T in a build without SuiteSparse.
#pragma once

#include <torch/torch.h>

#include <Eigen/Core>
#include <Eigen/SparseCore>

#include "diffsoft/core/solver.h"

#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace diffsoft {

// A fixed sequence of entries of a symmetric n x n matrix's lower triangle (row >= col; repeats are summed),
// and where each lands in compressed columns (Eigen's and CHOLMOD's layout). Made once per pattern (it sorts),
// so that every later assembly of values in the same sequence is a scatter-add into nnz() values, without
// triplets or sorting: `values[place[k]] += value of entry k`.
struct LowerPattern {
  LowerPattern(int64_t n, const std::vector<std::pair<int, int>>& entries);  // entries: (row, col)
  int64_t n;
  std::vector<int> outer, inner;  // column starts (n + 1) and row indices (nnz)
  std::vector<int> place;         // entry k of the sequence -> its index in inner and values
  int64_t nnz() const { return static_cast<int64_t>(inner.size()); }
};

// Symbolic factorizations (fill-reducing ordering, supernodes) depend only on the sparsity pattern, the same
// at every step of a model: a FactorCache kept with the model (one per simulator) lets every sparse
// factorization after the first skip them. It also keeps the model's assembly pattern, and the numeric
// factors that are no longer used (a step's factor, freed when the next Newton iteration factors again):
// those are factored again in place rather than allocated anew, since a fresh factor of tens of megabytes
// costs as many page faults as the factorization's own arithmetic on a loaded machine. Opaque; thread-safe.
struct FactorCache {
  std::mutex mutex;
  std::shared_ptr<void> symbolic;  // the analysis, owned by the factorization back end that made it
  int64_t n = -1, nnz = -1;        // the pattern it was made for
  int64_t analyses = 0;            // how many were made (one per pattern, unless patterns alternate)
  std::shared_ptr<const LowerPattern> pattern;  // the model's assembly pattern, made once by its user
  int64_t spare_max = 1;           // how many unused numeric factors to keep (the largest batch factored)
  int64_t reused = 0;              // factorizations made in an unused factor's memory
  std::shared_ptr<void> dense;     // the unused memory of dense factors (factor.cpp's DenseSpares)
};

// A factored matrix: A^-1 b, and what making it and solving with it cost (counted, see FactorCounts).
struct Factor {
  virtual ~Factor() = default;
  virtual Eigen::VectorXd solve(const Eigen::Ref<const Eigen::VectorXd>& b) const = 0;
  FactorCounts counts;
};

// Factors the n x n symmetric matrix whose lower triangle (row >= col; duplicates are summed) is `lower`;
// null where it is not positive definite. cache may be null.
std::unique_ptr<Factor> factor_symmetric(int64_t n, const std::vector<Eigen::Triplet<double>>& lower,
                                         FactorCache* cache = nullptr);

// The same for the matrix with `pattern`'s compressed columns and these values (pattern.nnz() of them).
std::unique_ptr<Factor> factor_symmetric(const LowerPattern& pattern, const std::vector<double>& values,
                                         FactorCache* cache = nullptr);

bool has_cholmod();

// A dense factorization's cost per n^3 in nanoseconds (about 6 us at n = 52, float64 on one core), to size the
// chunks of a batch's loop of factorizations (core/parallel.h): an estimate, right to its order of magnitude.
constexpr double kDenseFactorNs = 0.04;

// The factors of a batch's matrices, one per row of the right-hand sides, each made on the first solve whose
// right-hand side needs it: a problem already converged (a zero right-hand side) is never factored, nor is
// Newton's last, converged point. make(need, factors) fills factors[r] (null: not positive definite) for
// the rows r with need[r].
class LazyFactors {
 public:
  using Maker = std::function<void(const std::vector<char>& need, std::vector<std::unique_ptr<Factor>>& factors)>;
  LazyFactors(int64_t rows, Maker make) : make_(std::move(make)), factors_(rows), made_(rows) {}

  // A^-1 b on (B, n) rows; NaN rows where A is not positive definite, zero rows for zero right-hand sides.
  torch::Tensor solve(const torch::Tensor& b_rows);
  int64_t count() const { return count_; }  // factorizations made so far
  FactorCounts counts() const;               // of the largest factor made so far (zeros before the first)

 private:
  Maker make_;
  std::vector<std::unique_ptr<Factor>> factors_;
  std::vector<char> made_;
  int64_t count_ = 0;
};

}  // namespace diffsoft
