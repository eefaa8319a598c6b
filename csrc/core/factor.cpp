// Cholesky factorizations; see factor.h.
#include "core/factor.h"

#include <Eigen/Dense>
#include <Eigen/SparseCholesky>
#ifdef DIFFSOFT_WITH_CHOLMOD
#include <Eigen/CholmodSupport>
#endif
#include <ATen/Parallel.h>

#include <limits>

namespace diffsoft {

namespace {

// Up to this many unknowns a dense Cholesky factorization beats the sparse one (no ordering, no symbolic
// analysis, no triplet sorting): 2.3x faster at 50 unknowns, even at about 100, 2x slower at 128 (2D grid
// patterns, assembly included).
constexpr int64_t kDenseMax = 100;

struct DenseFactor : Factor {
  Eigen::LLT<Eigen::MatrixXd, Eigen::Lower> llt;
  Eigen::VectorXd solve(const Eigen::Ref<const Eigen::VectorXd>& b) const override { return llt.solve(b); }
};

struct SparseFactor : Factor {
  Eigen::SimplicialLDLT<Eigen::SparseMatrix<double>, Eigen::Lower, Eigen::AMDOrdering<int>> ldlt;
  Eigen::VectorXd solve(const Eigen::Ref<const Eigen::VectorXd>& b) const override { return ldlt.solve(b); }
};

#ifdef DIFFSOFT_WITH_CHOLMOD
// Above this many unknowns, CHOLMOD's supernodal Cholesky (dense BLAS-3 kernels on supernodes) with a
// symbolic analysis shared through the model's FactorCache: on 3D meshes its numeric factorization is 6x
// (8k unknowns) to 30x (30k) faster than the simplicial LDL^T; below, the two are even.
constexpr int64_t kSupernodalMin = 1000;

// A CHOLMOD factor with its own workspace (cholmod_common), so that factors of a batch run in parallel.
class CholmodFactor : public Factor {
 public:
  CholmodFactor() {
    cholmod_start(&common_);
    common_.supernodal = CHOLMOD_SUPERNODAL;
    common_.print = 0;
  }
  ~CholmodFactor() override {
    if (factor_) cholmod_free_factor(&factor_, &common_);
    cholmod_finish(&common_);
  }
  CholmodFactor(const CholmodFactor&) = delete;
  CholmodFactor& operator=(const CholmodFactor&) = delete;

  // Analyses the lower triangle `lower` (or copies the cached analysis of its pattern), then factors it;
  // false where it is not positive definite.
  bool factor(Eigen::SparseMatrix<double>& lower, FactorCache* cache) {
    cholmod_sparse a = Eigen::viewAsCholmod(lower);
    a.stype = -1;
    std::shared_ptr<CholmodFactor> shared;
    if (cache) {
      std::lock_guard<std::mutex> lock(cache->mutex);
      if (cache->symbolic && cache->n == lower.rows() && cache->nnz == lower.nonZeros()) {
        shared = std::static_pointer_cast<CholmodFactor>(cache->symbolic);
      } else {
        shared = std::make_shared<CholmodFactor>();
        shared->factor_ = cholmod_analyze(&a, &shared->common_);
        if (!shared->factor_) return false;
        cache->symbolic = shared, cache->n = lower.rows(), cache->nnz = lower.nonZeros();
        ++cache->analyses;
      }
      factor_ = cholmod_copy_factor(shared->factor_, &common_);
    } else {
      factor_ = cholmod_analyze(&a, &common_);
    }
    return factor_ && cholmod_factorize(&a, factor_, &common_) && common_.status == CHOLMOD_OK &&
           factor_->minor == factor_->n;
  }

  Eigen::VectorXd solve(const Eigen::Ref<const Eigen::VectorXd>& b) const override {
    Eigen::VectorXd in = b, out(b.size());
    cholmod_dense rhs = Eigen::viewAsCholmod(in);
    cholmod_dense* x = cholmod_solve(CHOLMOD_A, factor_, &rhs, &common_);
    if (!x) return Eigen::VectorXd::Constant(b.size(), std::numeric_limits<double>::quiet_NaN());
    out = Eigen::Map<const Eigen::VectorXd>(static_cast<const double*>(x->x), b.size());
    cholmod_free_dense(&x, &common_);
    return out;
  }

 private:
  mutable cholmod_common common_;
  cholmod_factor* factor_ = nullptr;
};
#endif

}  // namespace

std::unique_ptr<Factor> factor_symmetric(int64_t n, const std::vector<Eigen::Triplet<double>>& lower,
                                         FactorCache* cache) {
  if (n <= kDenseMax) {
    auto factor = std::make_unique<DenseFactor>();
    Eigen::MatrixXd a = Eigen::MatrixXd::Zero(n, n);
    for (const auto& t : lower) a(t.row(), t.col()) += t.value();
    factor->llt.compute(a);
    if (factor->llt.info() != Eigen::Success) return nullptr;
    return factor;
  }
  Eigen::SparseMatrix<double> a(n, n);
  a.setFromTriplets(lower.begin(), lower.end());
#ifdef DIFFSOFT_WITH_CHOLMOD
  if (n >= kSupernodalMin) {
    auto factor = std::make_unique<CholmodFactor>();
    if (!factor->factor(a, cache)) return nullptr;
    return factor;
  }
#endif
  (void)cache;
  auto factor = std::make_unique<SparseFactor>();
  factor->ldlt.compute(a);
  if (factor->ldlt.info() != Eigen::Success || !(factor->ldlt.vectorD().minCoeff() > 0)) return nullptr;
  return factor;
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
  torch::Tensor x = torch::zeros_like(b);
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      Eigen::Map<Eigen::VectorXd> out(x.data_ptr<double>() + r * n, n);
      if (!made_[r]) continue;  // a zero right-hand side
      if (factors_[r])
        out = factors_[r]->solve(Eigen::Map<const Eigen::VectorXd>(b.data_ptr<double>() + r * n, n));
      else
        out.setConstant(std::numeric_limits<double>::quiet_NaN());
    }
  });
  return x.to(b_rows.options());
}

bool has_cholmod() {
#ifdef DIFFSOFT_WITH_CHOLMOD
  return true;
#else
  return false;
#endif
}

}  // namespace diffsoft
