// Products, diagonal and factorization of the step Hessian from its blocks; see step_energy.h.
#include "physics/hessian_blocks.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <mutex>
#include <utility>
#include <stdexcept>

#include "core/timers.h"
#include "physics/kernels.h"
#include "physics/step_energy.h"

namespace diffsoft {

namespace kernels {
namespace {

template <typename S, int D>
void problem_hvp(const View<S, D>& v, const S* k_el, const S* k_mu, const S* diag, const S* in, S* out) {
  constexpr int ND = (D + 1) * D;
  for (int64_t s = 0; s < v.f * D; ++s) out[s] = diag[s] * in[s];
  auto gather = [&](const int64_t* idx, int count, S* local) {
    for (int j = 0; j < count; ++j) {
      const int64_t s = v.slot[idx[j]];
      for (int a = 0; a < D; ++a) local[j * D + a] = s >= 0 ? in[s * D + a] : S(0);
    }
  };
  auto scatter = [&](const int64_t* idx, int count, const S* local) {
    for (int j = 0; j < count; ++j) {
      const int64_t s = v.slot[idx[j]];
      if (s >= 0)
        for (int a = 0; a < D; ++a) out[s * D + a] += local[j * D + a];
    }
  };
  Eigen::Matrix<S, ND, 1> le, re;
  for (int64_t k = 0; k < v.e; ++k) {
    gather(v.elements + k * (D + 1), D + 1, le.data());
    re.noalias() = Eigen::Map<const Eigen::Matrix<S, ND, ND, Eigen::RowMajor>>(k_el + k * ND * ND) * le;
    scatter(v.elements + k * (D + 1), D + 1, re.data());
  }
  Eigen::Matrix<S, 2 * D, 1> lm, rm;
  for (int64_t k = 0; k < v.nm; ++k) {
    gather(v.muscles + 2 * k, 2, lm.data());
    rm.noalias() = Eigen::Map<const Eigen::Matrix<S, 2 * D, 2 * D, Eigen::RowMajor>>(k_mu + k * 4 * D * D) * lm;
    scatter(v.muscles + 2 * k, 2, rm.data());
  }
}

// The Hessian's diagonal: the per-vertex terms plus the diagonals of the element and muscle blocks.
template <typename S, int D>
void problem_hessian_diagonal(const View<S, D>& v, const S* k_el, const S* k_mu, const S* diag, S* out) {
  constexpr int ND = (D + 1) * D;
  std::copy(diag, diag + v.f * D, out);
  auto add = [&](const int64_t* idx, int count, const S* block) {
    for (int j = 0; j < count; ++j) {
      const int64_t s = v.slot[idx[j]];
      if (s >= 0)
        for (int a = 0; a < D; ++a) out[s * D + a] += block[(j * D + a) * (count * D) + j * D + a];
    }
  };
  for (int64_t k = 0; k < v.e; ++k) add(v.elements + k * (D + 1), D + 1, k_el + k * ND * ND);
  for (int64_t k = 0; k < v.nm; ++k) add(v.muscles + 2 * k, 2, k_mu + k * 4 * D * D);
}

// Calls f(row, col, value) for every entry of one problem's H over its free degrees of freedom: the diagonal,
// then the element and muscle blocks (entries shared by blocks come once per block).
template <typename S, int D, typename F>
void for_each_entry(const View<S, D>& v, const S* k_el, const S* k_mu, const S* diag, F&& f) {
  constexpr int ND = (D + 1) * D;
  for (int64_t i = 0; i < v.f * D; ++i) f(i, i, double(diag[i]));
  auto add = [&](const int64_t* idx, int count, const S* block) {
    for (int j = 0; j < count; ++j) {
      const int64_t sj = v.slot[idx[j]];
      if (sj < 0) continue;
      for (int l = 0; l < count; ++l) {
        const int64_t sl = v.slot[idx[l]];
        if (sl < 0) continue;
        for (int a = 0; a < D; ++a)
          for (int c = 0; c < D; ++c) f(sj * D + a, sl * D + c, double(block[(j * D + a) * (count * D) + l * D + c]));
      }
    }
  };
  for (int64_t k = 0; k < v.e; ++k) add(v.elements + k * (D + 1), D + 1, k_el + k * ND * ND);
  for (int64_t k = 0; k < v.nm; ++k) add(v.muscles + 2 * k, 2, k_mu + k * 4 * D * D);
}

// The factor of one problem's H, or null where H is not positive definite (the solver then falls back to CG
// for this problem). The entries come in for_each_entry's order, which depends only on the model's topology:
// its LowerPattern, made at the first factorization and kept in the model's FactorCache, turns every later
// assembly into a scatter-add (no triplets, no sorting, no fresh megabytes per Newton iteration).
template <typename S, int D>
std::unique_ptr<Factor> problem_factor(const View<S, D>& v, const S* k_el, const S* k_mu, const S* diag) {
  FactorCache* cache = v.m.factor_cache.get();
  const int64_t n = v.f * D;
  std::shared_ptr<const LowerPattern> pattern;
  if (cache) {
    std::lock_guard<std::mutex> lock(cache->mutex);
    pattern = cache->pattern;
  }
  if (!pattern || pattern->n != n) {
    std::vector<std::pair<int, int>> entries;
    entries.reserve(n + v.e * (D + 1) * D * ((D + 1) * D + 1) / 2 + v.nm * D * (2 * D + 1));
    for_each_entry(v, k_el, k_mu, diag, [&](int64_t i, int64_t j, double) {
      if (i >= j) entries.emplace_back(static_cast<int>(i), static_cast<int>(j));
    });
    pattern = std::make_shared<const LowerPattern>(n, entries);
    if (cache) {
      std::lock_guard<std::mutex> lock(cache->mutex);
      cache->pattern = pattern;
    }
  }
  const std::vector<int>& place = pattern->place;
  std::vector<double> values;
  size_t k = 0;
  {
    PhaseTimer timer(Phase::assembly);
    values.assign(pattern->nnz(), 0.0);
    for_each_entry(v, k_el, k_mu, diag, [&](int64_t i, int64_t j, double value) {
      // A cache shared with a model of another topology is caught by the count of entries (never read past);
      // one with as many entries would make a wrong factor, which solve_rows's measured residual and CG fix.
      if (i >= j && k++ < place.size()) values[place[k - 1]] += value;
    });
  }
  if (k != place.size())
    throw std::invalid_argument("factor_step_hessians: the model's factor_cache belongs to a model of another "
                                "topology (give each model its own FactorCache)");
  return factor_symmetric(*pattern, values, cache);
}

// Calls f(view, b, element blocks, muscle blocks, diagonal) with problem b's pointers into the blocks of
// step_energy_derivatives, for every problem of the batch, in parallel.
template <typename F>
void for_each_problem(const StepModel& m, const StepDerivatives& blocks, F&& f) {
  const torch::Tensor &k_el = blocks.element_blocks, &k_mu = blocks.muscle_blocks, &diag = blocks.diagonal;
  // The blocks' shapes are the model's (B, E, (d+1)d, (d+1)d), (B, M, 2d, 2d) and (B, F, d), CPU, one dtype:
  // the loops below read them as raw pointers.
  const bool diag_ok = diag.dim() == 3 && (diag.size(2) == 2 || diag.size(2) == 3) && diag.device().is_cpu() &&
                       diag.size(1) == m.mass.size(-1);
  const int64_t batch = diag_ok ? diag.size(0) : 0, d = diag_ok ? diag.size(2) : 0;
  const int64_t e = m.elements.size(0), nm = m.muscles.size(0);
  auto shaped = [&](const torch::Tensor& t, std::vector<int64_t> shape) {
    return t.defined() && t.sizes() == c10::IntArrayRef(shape) && t.scalar_type() == diag.scalar_type() &&
           t.device().is_cpu() && t.is_contiguous();
  };
  if (!diag_ok || !diag.is_contiguous())
    throw std::invalid_argument("diagonal must be a contiguous CPU tensor (B, F, d) with F the model's free vertices");
  if (!shaped(k_el, {batch, e, (d + 1) * d, (d + 1) * d}))
    throw std::invalid_argument("element_blocks must be a contiguous CPU tensor (B, E, (d+1)d, (d+1)d) of the "
                                "diagonal's dtype, E the model's elements");
  if (!shaped(k_mu, {batch, nm, 2 * d, 2 * d}))
    throw std::invalid_argument("muscle_blocks must be a contiguous CPU tensor (B, M, 2d, 2d) of the diagonal's "
                                "dtype, M the model's muscles");
  dispatch(diag, [&](auto s, auto dim) {
    using S = decltype(s);
    constexpr int D = decltype(dim)::value;
    constexpr int ND = (D + 1) * D;
    View<S, D> v(m);
    at::parallel_for(0, batch, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b)
        f(v, b, k_el.data_ptr<S>() + b * e * ND * ND, k_mu.data_ptr<S>() + b * nm * 4 * D * D,
          diag.data_ptr<S>() + b * v.f * D);
    });
  });
}

}  // namespace
}  // namespace kernels

torch::Tensor step_energy_hvp(const StepModel& model, const StepDerivatives& derivatives, const torch::Tensor& v_in) {
  const StepModel m = kernels::contiguous(model);
  torch::Tensor vin = v_in.contiguous();
  const torch::Tensor& diag = derivatives.diagonal;
  if (vin.sizes() != diag.sizes() || vin.scalar_type() != diag.scalar_type() || !vin.device().is_cpu())
    throw std::invalid_argument("v must be a CPU tensor with the shape and dtype of the gradient");
  torch::Tensor out = torch::empty_like(vin);
  kernels::for_each_problem(m, derivatives, [&](const auto& v, int64_t b, const auto* k_el, const auto* k_mu,
                                                const auto* d) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    const int64_t offset = b * v.f * std::decay_t<decltype(v)>::dim;
    kernels::problem_hvp(v, k_el, k_mu, d, vin.data_ptr<S>() + offset, out.data_ptr<S>() + offset);
  });
  return out;
}

torch::Tensor step_energy_hessian_diagonal(const StepModel& model, const StepDerivatives& derivatives) {
  const StepModel m = kernels::contiguous(model);
  torch::Tensor out = torch::empty_like(derivatives.diagonal);
  kernels::for_each_problem(m, derivatives, [&](const auto& v, int64_t b, const auto* k_el, const auto* k_mu,
                                                const auto* d) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    kernels::problem_hessian_diagonal(v, k_el, k_mu, d,
                                      out.data_ptr<S>() + b * v.f * std::decay_t<decltype(v)>::dim);
  });
  return out;
}

void factor_step_hessians(const StepModel& model, const StepDerivatives& derivatives, const std::vector<char>& need,
                          std::vector<std::unique_ptr<Factor>>& out) {
  const StepModel m = kernels::contiguous(model);
  if (m.factor_cache) {
    std::lock_guard<std::mutex> lock(m.factor_cache->mutex);
    m.factor_cache->spare_max = std::max<int64_t>(m.factor_cache->spare_max, static_cast<int64_t>(need.size()));
  }
  kernels::for_each_problem(m, derivatives, [&](const auto& v, int64_t b, const auto* k_el, const auto* k_mu,
                                                const auto* d) {
    if (need[b]) out[b] = kernels::problem_factor(v, k_el, k_mu, d);
  });
}

}  // namespace diffsoft
