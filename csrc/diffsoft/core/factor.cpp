// Cholesky factorizations; see factor.h.
#include "diffsoft/core/factor.h"
#include "diffsoft/core/parallel.h"
#include "diffsoft/core/timers.h"

#include <Eigen/Dense>
#include <Eigen/SparseCholesky>
#ifdef DIFFSOFT_WITH_CHOLMOD
#include <Eigen/CholmodSupport>
#endif

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <stdexcept>

namespace diffsoft {

namespace {

// Up to this many unknowns a dense Cholesky factorization beats the sparse one (no ordering, no symbolic
// analysis, no triplet sorting): 2.3x faster at 50 unknowns, even at about 100, 2x slower at 128 (2D grid
// patterns, assembly included).
constexpr int64_t kDenseMax = 100;

// A solve's cost per n^2 in nanoseconds, to size a batch's chunks (core/parallel.h): about 1 us at n = 52.
constexpr double kSolveNs = 0.4;

using DenseLLT = Eigen::LLT<Eigen::MatrixXd, Eigen::Lower>;

// The factorizations of dense factors no longer in use, to be made again in their memory. A batch's factors
// are made on the threads of its loop and freed on the caller's, and the threads' malloc arenas (glibc) hand
// such freed memory back to the system: every Newton iteration then paid for fresh pages, which made 2 threads
// slower than 1 on 256 bipeds (0.86x, float32 steps; 1.4x once reused).
struct DenseSpares {
  std::mutex mutex;
  std::vector<std::unique_ptr<DenseLLT>> spares;

  std::unique_ptr<DenseLLT> take() {
    std::lock_guard<std::mutex> lock(mutex);
    if (spares.empty()) return std::make_unique<DenseLLT>();
    auto llt = std::move(spares.back());
    spares.pop_back();
    return llt;
  }
  void give_back(std::unique_ptr<DenseLLT> llt, int64_t most) {
    std::lock_guard<std::mutex> lock(mutex);
    if (static_cast<int64_t>(spares.size()) < most) spares.push_back(std::move(llt));
  }
};

struct DenseFactor : Factor {
  DenseFactor(std::shared_ptr<DenseSpares> spares, int64_t most)
      : llt(spares ? spares->take() : std::make_unique<DenseLLT>()), spares_(std::move(spares)), most_(most) {}
  ~DenseFactor() override {
    if (spares_) spares_->give_back(std::move(llt), most_);
  }
  Eigen::VectorXd solve(const Eigen::Ref<const Eigen::VectorXd>& b) const override { return llt->solve(b); }

  std::unique_ptr<DenseLLT> llt;  // compute() of a matrix of its size writes in its memory

 private:
  std::shared_ptr<DenseSpares> spares_;
  int64_t most_;
};

#ifndef DIFFSOFT_WITH_CHOLMOD
struct SparseFactor : Factor {
  Eigen::SimplicialLDLT<Eigen::SparseMatrix<double>, Eigen::Lower, Eigen::AMDOrdering<int>> ldlt;
  Eigen::VectorXd solve(const Eigen::Ref<const Eigen::VectorXd>& b) const override { return ldlt.solve(b); }
};
#endif

// The lower triangle in compressed columns, as the back ends read it.
using LowerMap = Eigen::Map<const Eigen::SparseMatrix<double, Eigen::ColMajor, int>>;

#ifdef DIFFSOFT_WITH_CHOLMOD
// Above kDenseMax unknowns, CHOLMOD's Cholesky with a symbolic analysis shared through the model's FactorCache
// (Eigen's simplicial LDL^T where the build has no CHOLMOD): on 3D meshes its supernodal numeric factorization
// is 6x (8k unknowns) to 30x (30k) faster than Eigen's, and where it factors simplicially (small problems, 2D
// meshes) it is 1.4-1.9x faster than Eigen's, which orders each matrix anew (2D grid patterns of 112-1200
// unknowns, Eigen's ordering included).

// CHOLMOD's supernodal factorization (dense BLAS-3 kernels on supernodes) wins where the factor is dense,
// its simplicial one where the supernodes are small: the analysis picks supernodal where CHOLMOD's flop count
// per entry of L is at least this. Measured on this project's machine (OpenBLAS, 1 thread; grid patterns of
// triangle and tetrahedron meshes, 2 and 3 unknowns per vertex): simplicial is 2.5-4x faster at 31-71 flops
// per entry (2D sheets of 20x20 and 40x40 vertices, thin 3D bars), 1.2-1.5x at 93-121 (2D, 70x70 and
// 100x100); supernodal is 1.2x faster at 145-167 and 1.6-2.5x at 252-412 (3D blocks, DiffPD's cantilever).
// CHOLMOD's own default (40) is calibrated for other BLAS and matrices.
constexpr double kSupernodalFlopsPerEntry = 130;

// A CHOLMOD factor with its own workspace (cholmod_common), so that factors of a batch run in parallel.
struct CholmodNumeric {
  cholmod_common common;
  cholmod_factor* factor = nullptr;
  CholmodNumeric() {
    cholmod_start(&common);
    common.supernodal = CHOLMOD_AUTO;
    common.supernodal_switch = kSupernodalFlopsPerEntry;
    common.final_ll = true;  // simplicial as LL^T: its LDL^T would factor an indefinite matrix without a word
    common.print = 0;
  }
  ~CholmodNumeric() {
    if (factor) cholmod_free_factor(&factor, &common);
    cholmod_finish(&common);
  }
  CholmodNumeric(const CholmodNumeric&) = delete;
  CholmodNumeric& operator=(const CholmodNumeric&) = delete;
};

// The counts of an analysed factor: CHOLMOD's flop count of the ordering it chose, and the entries the
// supernodes store (what a solve sweeps, amalgamation's zeros included).
FactorCounts analysis_counts(const cholmod_common& c, const cholmod_factor& l) {
  return {int64_t(l.n), 0.0, double(l.is_super ? l.xsize : size_t(c.lnz)), c.fl, bool(l.is_super)};
}

// One symbolic analysis (what FactorCache::symbolic holds) and the numeric factors of its pattern that are no
// longer in use: a factor freed (a Newton iteration's, when the next one factors) goes back here, and the next
// factorization overwrites it in place (CHOLMOD refactors a numeric factor of the same pattern) instead of
// copying the analysis and allocating its values afresh. The page faults of that fresh allocation (about
// 240 MB per frame of DiffPD's cantilever, 23 us each on a virtual machine) had made the default forward
// 1.6-2.3x slower than keep_factors, which happened to keep the previous factor, and so the heap, alive.
struct CholmodSymbolic {
  CholmodNumeric analysis;
  FactorCounts counts;  // of the analysis: every factor of the pattern has them
  std::mutex mutex;
  std::vector<std::unique_ptr<CholmodNumeric>> spares;
  std::atomic<size_t> spare_max{1};  // written under the cache's mutex, read under this one

  std::unique_ptr<CholmodNumeric> take(bool& reused) {
    std::lock_guard<std::mutex> lock(mutex);
    reused = !spares.empty();
    if (reused) {
      auto numeric = std::move(spares.back());
      spares.pop_back();
      return numeric;
    }
    auto numeric = std::make_unique<CholmodNumeric>();
    numeric->factor = cholmod_copy_factor(analysis.factor, &numeric->common);
    return numeric;
  }
  void give_back(std::unique_ptr<CholmodNumeric> numeric) {
    std::lock_guard<std::mutex> lock(mutex);
    if (spares.size() < spare_max.load()) spares.push_back(std::move(numeric));
  }
};

class CholmodFactor : public Factor {
 public:
  // Analyses the lower triangle `a` (or takes the cached analysis of its pattern, and a spare factor of it),
  // then factors it; false where it is not positive definite.
  bool factor(const LowerMap& lower, FactorCache* cache) {
    cholmod_sparse a{};  // a view: CHOLMOD reads the matrix, never writes it
    a.nrow = a.ncol = static_cast<size_t>(lower.rows());
    a.nzmax = static_cast<size_t>(lower.nonZeros());
    a.p = const_cast<int*>(lower.outerIndexPtr());
    a.i = const_cast<int*>(lower.innerIndexPtr());
    a.x = const_cast<double*>(lower.valuePtr());
    a.stype = -1;
    a.itype = CHOLMOD_INT;
    a.xtype = CHOLMOD_REAL;
    a.dtype = CHOLMOD_DOUBLE;
    a.sorted = 1;
    a.packed = 1;
    if (!cache) {
      PhaseTimer timer(Phase::analysis);
      numeric_ = std::make_unique<CholmodNumeric>();
      numeric_->factor = cholmod_analyze(&a, &numeric_->common);
      if (numeric_->factor) counts = analysis_counts(numeric_->common, *numeric_->factor);
    } else {
      bool reused = false;
      {
        std::lock_guard<std::mutex> lock(cache->mutex);
        if (cache->symbolic && cache->n == lower.rows() && cache->nnz == lower.nonZeros()) {
          symbolic_ = std::static_pointer_cast<CholmodSymbolic>(cache->symbolic);
        } else {
          symbolic_ = std::make_shared<CholmodSymbolic>();
          PhaseTimer timer(Phase::analysis);
          symbolic_->analysis.factor = cholmod_analyze(&a, &symbolic_->analysis.common);
          if (!symbolic_->analysis.factor) return false;
          symbolic_->counts = analysis_counts(symbolic_->analysis.common, *symbolic_->analysis.factor);
          cache->symbolic = symbolic_, cache->n = lower.rows(), cache->nnz = lower.nonZeros();
          ++cache->analyses;
        }
        symbolic_->spare_max.store(static_cast<size_t>(std::max<int64_t>(1, cache->spare_max)));
      }
      counts = symbolic_->counts;
      numeric_ = symbolic_->take(reused);
      if (reused) {
        std::lock_guard<std::mutex> lock(cache->mutex);
        ++cache->reused;
      }
    }
    cholmod_common& c = numeric_->common;
    PhaseTimer timer(Phase::factorization);
    // A factor that failed (not positive definite) is not given back: CHOLMOD leaves it partly factored.
    ok_ = numeric_->factor && cholmod_factorize(&a, numeric_->factor, &c) && c.status == CHOLMOD_OK &&
          numeric_->factor->minor == numeric_->factor->n;
    return ok_;
  }
  ~CholmodFactor() override {
    if (ok_ && symbolic_) symbolic_->give_back(std::move(numeric_));
  }

  Eigen::VectorXd solve(const Eigen::Ref<const Eigen::VectorXd>& b) const override {
    Eigen::VectorXd in = b, out(b.size());
    cholmod_dense rhs = Eigen::viewAsCholmod(in);
    cholmod_dense* x = cholmod_solve(CHOLMOD_A, numeric_->factor, &rhs, &numeric_->common);
    if (!x) return Eigen::VectorXd::Constant(b.size(), std::numeric_limits<double>::quiet_NaN());
    out = Eigen::Map<const Eigen::VectorXd>(static_cast<const double*>(x->x), b.size());
    cholmod_free_dense(&x, &numeric_->common);
    return out;
  }

 private:
  std::shared_ptr<CholmodSymbolic> symbolic_;
  std::unique_ptr<CholmodNumeric> numeric_;
  bool ok_ = false;
};
#endif

std::unique_ptr<Factor> factor_lower(const LowerMap& a, FactorCache* cache) {
  const int64_t n = a.rows();
  if (n <= kDenseMax) {
    PhaseTimer timer(Phase::factorization);
    std::shared_ptr<DenseSpares> spares;
    int64_t most = 0;
    if (cache) {
      std::lock_guard<std::mutex> lock(cache->mutex);
      if (!cache->dense) cache->dense = std::make_shared<DenseSpares>();
      spares = std::static_pointer_cast<DenseSpares>(cache->dense);
      most = cache->spare_max;
    }
    auto factor = std::make_unique<DenseFactor>(std::move(spares), most);
    thread_local Eigen::MatrixXd scratch;  // for the same reason as DenseSpares
    scratch.setZero(n, n);
    double* const dense = scratch.data();  // (written through a local pointer, as hessian_blocks.cpp's scratch)
    for (int64_t j = 0; j < n; ++j)
      for (LowerMap::InnerIterator it(a, j); it; ++it) dense[j * n + it.row()] += it.value();
    factor->llt->compute(scratch);
    if (factor->llt->info() != Eigen::Success) return nullptr;
    factor->counts = {n, double(a.nonZeros()), n * (n + 1) / 2.0, n * (n + 1.0) * (2 * n + 1) / 6};
    return factor;
  }
#ifdef DIFFSOFT_WITH_CHOLMOD
  auto factor = std::make_unique<CholmodFactor>();
  if (!factor->factor(a, cache)) return nullptr;
  factor->counts.nnz_a = double(a.nonZeros());
  return factor;
#else
  (void)cache;
  PhaseTimer timer(Phase::factorization);  // the simplicial path analyses each matrix anew: counted here
  auto factor = std::make_unique<SparseFactor>();
  factor->ldlt.compute(a);
  if (factor->ldlt.info() != Eigen::Success || !(factor->ldlt.vectorD().minCoeff() > 0)) return nullptr;
  // L's columns (unit diagonal apart) as CHOLMOD counts a simplicial factorization's flops: sum of c_j^2.
  const auto& l = factor->ldlt.matrixL().nestedExpression();
  factor->counts = {n, double(a.nonZeros()), double(l.nonZeros() + n), 0.0};
  for (int64_t j = 0; j < n; ++j) {
    const double c = double(l.outerIndexPtr()[j + 1] - l.outerIndexPtr()[j] + 1);
    factor->counts.flops += c * c;
  }
  return factor;
#endif
}

}  // namespace

LowerPattern::LowerPattern(int64_t n_, const std::vector<std::pair<int, int>>& entries) : n(n_), outer(n_ + 1, 0) {
  // Entries sorted by (column, row); repeats share one place.
  std::vector<int64_t> order(entries.size());
  for (size_t k = 0; k < entries.size(); ++k) {
    const auto& e = entries[k];
    if (e.first < e.second || e.second < 0 || e.first >= n)
      throw std::invalid_argument("LowerPattern: an entry is outside the lower triangle of the matrix");
    order[k] = static_cast<int64_t>(k);
  }
  auto key = [&](int64_t k) { return int64_t(entries[k].second) * n + entries[k].first; };
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key(a) < key(b); });
  place.resize(entries.size());
  int64_t last = -1;
  for (int64_t k : order) {
    if (key(k) != last) {
      last = key(k);
      inner.push_back(entries[k].first);
      ++outer[entries[k].second + 1];
    }
    place[k] = static_cast<int>(inner.size()) - 1;
  }
  for (int64_t j = 0; j < n; ++j) outer[j + 1] += outer[j];
}

std::unique_ptr<Factor> factor_symmetric(int64_t n, const std::vector<Eigen::Triplet<double>>& lower,
                                         FactorCache* cache) {
  Eigen::SparseMatrix<double, Eigen::ColMajor, int> a(n, n);
  a.setFromTriplets(lower.begin(), lower.end());
  a.makeCompressed();
  return factor_lower(LowerMap(n, n, a.nonZeros(), a.outerIndexPtr(), a.innerIndexPtr(), a.valuePtr()), cache);
}

std::unique_ptr<Factor> factor_symmetric(const LowerPattern& pattern, const std::vector<double>& values,
                                         FactorCache* cache) {
  if (static_cast<int64_t>(values.size()) != pattern.nnz())
    throw std::invalid_argument("factor_symmetric: values must have one entry per nonzero of the pattern");
  return factor_lower(LowerMap(pattern.n, pattern.n, pattern.nnz(), pattern.outer.data(), pattern.inner.data(),
                               values.data()),
                      cache);
}

torch::Tensor LazyFactors::solve(const torch::Tensor& b_rows) {
  // Factors live on the CPU whatever the device of the right-hand sides.
  torch::Tensor b = b_rows.to(torch::kCPU, torch::kFloat64).contiguous();
  const int64_t rows = b.size(0), n = b.size(1);
  std::vector<char> need(rows);
  bool any = false;
  for (int64_t r = 0; r < rows; ++r) {
    need[r] = !made_[r] && Eigen::Map<const Eigen::VectorXd>(b.data_ptr<double>() + r * n, n).any();
    any = any || need[r];
  }
  if (any) make_(need, factors_);
  for (int64_t r = 0; r < rows; ++r) {
    made_[r] = made_[r] || need[r];
    count_ += need[r];
  }
  PhaseTimer timer(Phase::solves);
  torch::Tensor x = torch::zeros_like(b);
  for_each_in_batch(rows, kSolveNs * double(n) * double(n), [&](int64_t r) {
    Eigen::Map<Eigen::VectorXd> out(x.data_ptr<double>() + r * n, n);
    if (!made_[r]) return;  // a zero right-hand side
    if (factors_[r])
      out = factors_[r]->solve(Eigen::Map<const Eigen::VectorXd>(b.data_ptr<double>() + r * n, n));
    else
      out.setConstant(std::numeric_limits<double>::quiet_NaN());
  });
  return x.to(b_rows.options());
}

FactorCounts LazyFactors::counts() const {
  FactorCounts out;
  for (const auto& f : factors_)
    if (f && f->counts.flops > out.flops) out = f->counts;
  return out;
}

bool has_cholmod() {
#ifdef DIFFSOFT_WITH_CHOLMOD
  return true;
#else
  return false;
#endif
}

}  // namespace diffsoft
