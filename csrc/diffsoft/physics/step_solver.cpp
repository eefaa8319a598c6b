// The step energy as the solver's analytic path; see step_solver.h.
#include "diffsoft/physics/step_solver.h"

#include <ATen/ExpandUtils.h>

#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "diffsoft/core/timers.h"
#include "diffsoft/physics/hessian_blocks.h"
#include "diffsoft/physics/kernels.h"

namespace diffsoft {

AnalyticEnergy step_analytic_energy(const StepModel& model, const StepState& state, bool factorize,
                                    const std::vector<int64_t>& params,
                                    const std::vector<std::vector<int64_t>>& param_shapes,
                                    std::shared_ptr<const ExtraTerms> extra) {
  if (params.size() != param_shapes.size())
    throw std::invalid_argument("step_analytic_energy needs one shape in param_shapes per step parameter");
  int64_t count = kNumStepParams;
  for (const Collider& c : model.colliders) count += static_cast<int64_t>(c.params.size());
  if (extra && extra->first_param != count)
    throw std::invalid_argument("step_analytic_energy: the extra terms' parameters must follow the kernels' " +
                                std::to_string(count) + ", not start at " + std::to_string(extra->first_param));
  for (int64_t k : params)
    if (k < 0 || (k >= count && !extra))
      throw std::invalid_argument("step parameter index " + std::to_string(k) + " is not in [0, " +
                                  std::to_string(count) + ")");
  // (the state's shapes are read here, before any kernel checks them)
  for (const auto& [name, t] : {std::pair<const char*, const torch::Tensor*>{"x0", &state.x0},
                                {"x0_free", &state.x0_free}, {"x_hat", &state.x_hat}})
    if (!t->defined()) throw std::invalid_argument(std::string("StepState.") + name + " is an undefined tensor");
  auto m = std::make_shared<const StepModel>(kernels::contiguous(model));
  auto st = std::make_shared<const StepState>(
      StepState{torch::Tensor(), state.x0.contiguous(), state.x0_free.contiguous(), state.x_hat.contiguous(),
                m->muscles.size(0) ? state.activation.contiguous() : state.activation});
  const std::vector<int64_t> shape = state.x0_free.sizes().vec();
  auto state_at = [st, shape](const torch::Tensor& x_rows) {
    StepState s = *st;
    s.y = x_rows.view(shape);
    return s;
  };
  AnalyticEnergy analytic;
  analytic.value = [m, state_at, extra](const torch::Tensor& x_rows) {
    PhaseTimer timer(Phase::kernels);
    const StepState s = state_at(x_rows);
    torch::Tensor e = step_energy_value(*m, s);
    return extra ? e + extra->value(s.y) : e;
  };
  analytic.derivatives = [m, state_at, shape, factorize, extra](const torch::Tensor& x_rows) {
    PhaseTimer timer(Phase::kernels);
    const StepState s = state_at(x_rows);
    StepDerivatives all = step_energy_derivatives(*m, s);
    if (extra) {
      auto [grad, theirs] = extra->derivatives(s.y);
      all.grad = all.grad + grad;
      all.extra = std::move(theirs);
    }
    auto blocks = std::make_shared<const StepDerivatives>(std::move(all));
    auto hvp = [m, blocks, shape](const torch::Tensor& v) {
      PhaseTimer timer(Phase::kernels);
      return step_energy_hvp(*m, *blocks, v.view(shape)).view({shape[0], -1});
    };
    // Jacobi preconditioner: |diag H|, floored so that it stays positive definite where a diagonal entry
    // vanishes or is negative (compressed elements, contact switching off). Built on first use: with a
    // factorization, CG (and so the preconditioner) is only a fallback.
    auto d = std::make_shared<torch::Tensor>();
    auto precondition = [m, blocks, shape, d](const torch::Tensor& r) {
      if (!d->defined()) {
        torch::Tensor diag = step_energy_hessian_diagonal(*m, *blocks).abs().view({shape[0], -1});
        *d = torch::max(diag, 1e-8 * diag.amax(1, true) + std::numeric_limits<double>::min());
      }
      return r / *d;
    };
    AnalyticDerivatives out;
    out.energy = step_energy_value(*m, s, &out.energy_scale);
    if (extra) {
      const torch::Tensor theirs = extra->value(s.y);
      out.energy = out.energy + theirs;
      out.energy_scale = out.energy_scale + theirs.abs();
    }
    out.grad = blocks->grad.view({shape[0], -1});
    out.hvp = hvp;
    out.precondition = precondition;
    if (factorize) {
      auto factors = std::make_shared<LazyFactors>(
          shape[0], [m, blocks](const std::vector<char>& need, std::vector<std::unique_ptr<Factor>>& out) {
            factor_step_hessians(*m, *blocks, need, out);
          });
      out.solve = [factors](const torch::Tensor& b) { return factors->solve(b); };
      out.factorizations = [factors] { return factors->count(); };
      out.factor_counts = [factors] { return factors->counts(); };
    }
    return out;
  };
  if (!params.empty()) {
    analytic.mixed_vjp = [m, state_at, shape, params, param_shapes, count, extra](
                             const torch::Tensor& x_rows, const torch::Tensor& w_rows,
                             const std::vector<size_t>& wanted) {
      const StepState s = state_at(x_rows);
      std::vector<torch::Tensor> out(wanted.size());
      // The extra terms' wanted parameters, and where their derivatives go; -1 and -2 ask for their part of x0's
      // and h's (a user's term reads both: its rows at the step's start, and the time step), added to the kernels'.
      std::vector<int64_t> theirs;
      std::vector<size_t> at;
      bool ours = false;
      for (size_t k = 0; k < wanted.size(); ++k) {
        const int64_t j = params.at(wanted[k]);
        if (j < count) {
          ours = true;
          if (extra && (j == static_cast<int64_t>(StepParam::x0) || j == static_cast<int64_t>(StepParam::h))) {
            theirs.push_back(j == static_cast<int64_t>(StepParam::x0) ? -1 : -2);
            at.push_back(k);
          }
        } else {
          theirs.push_back(j - count);
          at.push_back(k);
        }
      }
      if (ours) {
        const std::vector<torch::Tensor> grads = step_energy_param_grads(*m, s, {}, w_rows.view(shape)).flat();
        for (size_t k = 0; k < wanted.size(); ++k)
          if (params.at(wanted[k]) < count) out[k] = at::sum_to(grads[params.at(wanted[k])], param_shapes.at(wanted[k]));
      }
      if (!theirs.empty()) {
        const std::vector<torch::Tensor> grads = extra->mixed_vjp(s.y, w_rows.view(shape), theirs);
        for (size_t k = 0; k < at.size(); ++k)
          out[at[k]] = theirs[k] < 0 ? out[at[k]] + at::sum_to(grads.at(k), param_shapes.at(wanted[at[k]]))
                                     : grads.at(k);
      }
      return out;
    };
  }
  return analytic;
}

}  // namespace diffsoft
