// Products, diagonal and factorization of the step Hessian from its blocks; see step_energy.h.
#include "diffsoft/physics/hessian_blocks.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "diffsoft/core/factor.h"
#include "diffsoft/core/parallel.h"
#include "diffsoft/core/timers.h"
#include "diffsoft/physics/kernels.h"
#include "diffsoft/physics/step_energy.h"

namespace diffsoft {

namespace kernels {
namespace {

// One problem's blocks, as pointers into a StepDerivatives: the kernels' per stencil, and the extra terms'.
template <typename S>
struct ProblemBlocks {
  struct Rows {
    const int64_t* rows;  // (K, width) vertex indices
    int64_t count;        // K
    int width;            // vertices per row
    const S* values;      // (K, width d, width d)
  };
  const S* vertex;            // (F, d, d)
  std::vector<Rows> rows;  // elements, muscles, then the extra terms'
};

// Calls f(idx, width, block) for every row of every stencil of the problem's blocks. The elements' and muscles'
// widths come as compile-time constants (std::integral_constant), so that f's loops over them unroll as in
// fixed-size code; the extra terms' as ints.
template <typename S, int D, typename F>
void for_each_row(const ProblemBlocks<S>& blocks, F&& f) {
  auto rows = [&](const auto& st, auto width) {
    const int64_t size = int64_t(width) * D * width * D;
    for (int64_t k = 0; k < st.count; ++k) f(st.rows + k * width, width, st.values + k * size);
  };
  rows(blocks.rows[0], std::integral_constant<int, D + 1>());
  rows(blocks.rows[1], std::integral_constant<int, 2>());
  for (size_t t = 2; t < blocks.rows.size(); ++t) rows(blocks.rows[t], blocks.rows[t].width);
}

template <typename S, int D>
void problem_hvp(const View<S, D>& v, const ProblemBlocks<S>& blocks, const S* in, S* out) {
  constexpr int ND = (D + 1) * D;
  for (int64_t s = 0; s < v.f; ++s)
    Eigen::Map<Vec<S, D>>(out + s * D).noalias() =
        Eigen::Map<const Mat<S, D>>(blocks.vertex + s * D * D) * Eigen::Map<const Vec<S, D>>(in + s * D);
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
  // Elements and muscles with fixed-size products; the extra terms' rows of any width after them.
  const auto& el = blocks.rows[0];
  Eigen::Matrix<S, ND, 1> le, re;
  for (int64_t k = 0; k < el.count; ++k) {
    gather(el.rows + k * (D + 1), D + 1, le.data());
    re.noalias() = Eigen::Map<const Eigen::Matrix<S, ND, ND, Eigen::RowMajor>>(el.values + k * ND * ND) * le;
    scatter(el.rows + k * (D + 1), D + 1, re.data());
  }
  const auto& mu = blocks.rows[1];
  Eigen::Matrix<S, 2 * D, 1> lm, rm;
  for (int64_t k = 0; k < mu.count; ++k) {
    gather(mu.rows + 2 * k, 2, lm.data());
    rm.noalias() = Eigen::Map<const Eigen::Matrix<S, 2 * D, 2 * D, Eigen::RowMajor>>(mu.values + k * 4 * D * D) * lm;
    scatter(mu.rows + 2 * k, 2, rm.data());
  }
  Eigen::Matrix<S, Eigen::Dynamic, 1> lx, rx;
  for (size_t t = 2; t < blocks.rows.size(); ++t) {
    const auto& st = blocks.rows[t];
    const int64_t width = st.width * D;
    lx.resize(width), rx.resize(width);
    for (int64_t k = 0; k < st.count; ++k) {
      gather(st.rows + k * st.width, st.width, lx.data());
      rx.noalias() = Eigen::Map<const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
                         st.values + k * width * width, width, width) *
                     lx;
      scatter(st.rows + k * st.width, st.width, rx.data());
    }
  }
}

// The Hessian's diagonal: the vertex blocks' plus every row block's.
template <typename S, int D>
void problem_hessian_diagonal(const View<S, D>& v, const ProblemBlocks<S>& blocks, S* out) {
  for (int64_t s = 0; s < v.f; ++s)
    Eigen::Map<Vec<S, D>>(out + s * D) = Eigen::Map<const Mat<S, D>>(blocks.vertex + s * D * D).diagonal();
  for_each_row<S, D>(blocks, [&](const int64_t* idx, auto count, const S* block) {
    for (int j = 0; j < count; ++j) {
      const int64_t s = v.slot[idx[j]];
      if (s >= 0)
        for (int a = 0; a < D; ++a) out[s * D + a] += block[(j * D + a) * (count * D) + j * D + a];
    }
  });
}

// Calls f(row, col, value) for every entry of one problem's H over its free degrees of freedom: the vertex
// blocks, then the element, muscle and extra terms' blocks (entries shared by blocks come once per block).
template <typename S, int D, typename F>
void for_each_entry(const View<S, D>& v, const ProblemBlocks<S>& blocks, F&& f) {
  for (int64_t s = 0; s < v.f; ++s)
    for (int a = 0; a < D; ++a)
      for (int c = 0; c < D; ++c) f(s * D + a, s * D + c, double(blocks.vertex[(s * D + a) * D + c]));
  for_each_row<S, D>(blocks, [&](const int64_t* idx, auto count, const S* block) {
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
  });
}

// The factor of one problem's H, or null where H is not positive definite (the solver then falls back to CG
// for this problem). The entries come in for_each_entry's order, which depends only on the model's topology:
// its LowerPattern, made at the first factorization and kept in the model's FactorCache, turns every later
// assembly into a scatter-add (no triplets, no sorting, no fresh megabytes per Newton iteration).
template <typename S, int D>
std::unique_ptr<Factor> problem_factor(const View<S, D>& v, const ProblemBlocks<S>& blocks) {
  FactorCache* cache = v.m.factor_cache.get();
  const int64_t n = v.f * D;
  std::shared_ptr<const LowerPattern> pattern;
  if (cache) {
    std::lock_guard<std::mutex> lock(cache->mutex);
    pattern = cache->pattern;
  }
  if (!pattern || pattern->n != n) {
    std::vector<std::pair<int, int>> entries;
    entries.reserve(v.f * D * (D + 1) / 2 + v.e * (D + 1) * D * ((D + 1) * D + 1) / 2 + v.nm * D * (2 * D + 1));
    for_each_entry(v, blocks, [&](int64_t i, int64_t j, double) {
      if (i >= j) entries.emplace_back(static_cast<int>(i), static_cast<int>(j));
    });
    pattern = std::make_shared<const LowerPattern>(n, entries);
    if (cache) {
      std::lock_guard<std::mutex> lock(cache->mutex);
      cache->pattern = pattern;
    }
  }
  const std::vector<int>& place = pattern->place;
  // Scratch kept by each thread of the batch's loop: a fresh vector per problem would be memory that the
  // thread's malloc arena hands back to the system and faults in again (see factor.cpp's DenseSpares). Written
  // through a local pointer: through the thread_local itself the scatter below took twice as long.
  thread_local std::vector<double> scratch;
  size_t k = 0;
  {
    PhaseTimer timer(Phase::assembly);
    scratch.assign(pattern->nnz(), 0.0);
    double* const values = scratch.data();
    for_each_entry(v, blocks, [&](int64_t i, int64_t j, double value) {
      // A cache shared with a model of another topology is caught by the count of entries (never read past);
      // one with as many entries would make a wrong factor, which solve_rows's measured residual and CG fix.
      if (i >= j && k++ < place.size()) values[place[k - 1]] += value;
    });
  }
  if (k != place.size())
    throw std::invalid_argument("factor_step_hessians: the model's factor_cache belongs to a model of another "
                                "topology (give each model its own FactorCache)");
  return factor_symmetric(*pattern, scratch, cache);
}

// The blocks' shapes are the model's (B, E, (d+1)d, (d+1)d), (B, M, 2d, 2d) and (B, F, d, d), CPU, one dtype
// (they may come from a user, through torch.ops.diffsoft.step_energy_hvp): the loops read them as raw pointers.
void check(const StepModel& m, const StepDerivatives& blocks) {
  const torch::Tensor& k_v = blocks.vertex_blocks;
  const bool ok = k_v.defined() && k_v.dim() == 4 && (k_v.size(3) == 2 || k_v.size(3) == 3) &&
                  k_v.size(2) == k_v.size(3) && k_v.size(1) == m.mass.size(-1) && k_v.device().is_cpu() &&
                  k_v.is_floating_point();
  if (!ok)
    throw std::invalid_argument("vertex_blocks must be a CPU tensor (B, F, d, d) with F the model's free vertices");
  const int64_t batch = k_v.size(0), d = k_v.size(3), e = m.elements.size(0), nm = m.muscles.size(0);
  check_model(m, k_v.size(1), d);
  auto shaped = [&](const torch::Tensor& t, std::vector<int64_t> shape) {
    return t.defined() && t.sizes() == c10::IntArrayRef(shape) && t.scalar_type() == k_v.scalar_type() &&
           t.device().is_cpu();
  };
  if (!shaped(blocks.element_blocks, {batch, e, (d + 1) * d, (d + 1) * d}))
    throw std::invalid_argument("element_blocks must be a CPU tensor (B, E, (d+1)d, (d+1)d) of vertex_blocks' "
                                "dtype, E the model's elements");
  if (!shaped(blocks.muscle_blocks, {batch, nm, 2 * d, 2 * d}))
    throw std::invalid_argument("muscle_blocks must be a CPU tensor (B, M, 2d, 2d) of vertex_blocks' dtype, M the "
                                "model's muscles");
  for (const auto& [rows, values] : blocks.extra) {
    if (rows.dim() != 2 || rows.scalar_type() != torch::kLong || !rows.device().is_cpu())
      throw std::invalid_argument("StepDerivatives.extra: rows must be a (K, k) int64 CPU tensor");
    const int64_t count = rows.size(0), width = rows.size(1) * d;
    if (values.sizes() != c10::IntArrayRef({batch, count, width, width}) ||
        values.scalar_type() != k_v.scalar_type() || !values.device().is_cpu())
      throw std::invalid_argument("StepDerivatives.extra: blocks must be (B, K, kd, kd) CPU tensors of the "
                                  "gradient's dtype, for rows (K, k)");
    if (rows.numel() && (rows.min().item<int64_t>() < 0 || rows.max().item<int64_t>() >= m.slot.size(0)))
      throw std::invalid_argument("StepDerivatives.extra: a row's vertex index is out of range");
  }
}

// Calls f(view, b, blocks) with problem b's pointers into the blocks of step_energy_derivatives (and its extra
// terms'), for every problem of the batch, in parallel; `factors`: f factors each problem's Hessian.
template <typename F>
void for_each_problem(const StepModel& m, const StepDerivatives& blocks, F&& f, bool factors = false) {
  check(m, blocks);
  const torch::Tensor k_el = blocks.element_blocks.contiguous(), k_mu = blocks.muscle_blocks.contiguous(),
                      k_v = blocks.vertex_blocks.contiguous();
  const int64_t batch = k_v.size(0), e = m.elements.size(0), nm = m.muscles.size(0);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> extra;
  for (const auto& [rows, values] : blocks.extra) extra.emplace_back(rows.contiguous(), values.contiguous());
  dispatch(k_v.select(-1, 0), [&](auto s, auto dim) {
    using S = decltype(s);
    constexpr int D = decltype(dim)::value;
    constexpr int ND = (D + 1) * D;
    View<S, D> v(m);
    const double n = double(v.f * D), ns = v.kernel_ns() + (factors ? kDenseFactorNs * n * n * n : 0.0);
    for_each_in_batch(batch, ns, [&](int64_t b) {
      ProblemBlocks<S> p{k_v.data_ptr<S>() + b * v.f * D * D,
                         {{v.elements, e, D + 1, k_el.data_ptr<S>() + b * e * ND * ND},
                          {v.muscles, nm, 2, k_mu.data_ptr<S>() + b * nm * 4 * D * D}}};
      for (const auto& rows_values : extra) {
        const torch::Tensor &rows = rows_values.first, &values = rows_values.second;
        p.rows.push_back({rows.data_ptr<int64_t>(), rows.size(0), static_cast<int>(rows.size(1)),
                          values.template data_ptr<S>() + b * (values.numel() / batch)});
      }
      f(v, b, p);
    });
  });
}

}  // namespace
}  // namespace kernels

torch::Tensor step_energy_hvp(const StepModel& model, const StepDerivatives& derivatives, const torch::Tensor& v_in) {
  const StepModel m = kernels::contiguous(model);
  torch::Tensor vin = v_in.contiguous();
  const torch::Tensor& k_v = derivatives.vertex_blocks;
  if (k_v.defined() && k_v.dim() == 4 &&
      (vin.sizes() != k_v.sizes().slice(0, 3) || vin.scalar_type() != k_v.scalar_type() || !vin.device().is_cpu()))
    throw std::invalid_argument("v must be a CPU tensor (B, F, d) of the blocks' dtype, for vertex_blocks (B, F, d, d)");
  torch::Tensor out = torch::empty_like(vin);
  kernels::for_each_problem(m, derivatives, [&](const auto& v, int64_t b, const auto& blocks) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    const int64_t offset = b * v.f * std::decay_t<decltype(v)>::dim;
    kernels::problem_hvp(v, blocks, vin.data_ptr<S>() + offset, out.data_ptr<S>() + offset);
  });
  return out;
}

torch::Tensor step_energy_hessian_diagonal(const StepModel& model, const StepDerivatives& derivatives) {
  const StepModel m = kernels::contiguous(model);
  torch::Tensor out = torch::empty(derivatives.vertex_blocks.sizes().slice(0, 3), derivatives.vertex_blocks.options());
  kernels::for_each_problem(m, derivatives, [&](const auto& v, int64_t b, const auto& blocks) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    kernels::problem_hessian_diagonal(v, blocks, out.data_ptr<S>() + b * v.f * std::decay_t<decltype(v)>::dim);
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
  kernels::for_each_problem(m, derivatives, [&](const auto& v, int64_t b, const auto& blocks) {
    if (need[b]) out[b] = kernels::problem_factor(v, blocks);
  }, /*factors=*/true);
}

}  // namespace diffsoft
