// The step energy as the solver's analytic path (core/solver.h's AnalyticEnergy): Newton's loop and the
// backward run on the fused kernels of step_energy.h, without autograd.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "diffsoft/core/solver.h"
#include "diffsoft/physics/step_energy.h"

namespace diffsoft {

// The analytic energy of the step problem, with a Jacobi preconditioner and, with factorize, a factorization of
// each problem's Hessian (dense Cholesky for small problems, sparse LDL^T with AMD ordering otherwise), made
// when a solve first needs it, for Newton's steps and the adjoint solve: rows x (B, F*d) are the free
// positions; state.y is not used. With params, it also gives the backward's parameter product in closed form:
// the solver's k-th param is the step parameter at position params[k] of StepParams::flat() (the body's and
// the state's, then the colliders'), of shape param_shapes[k] (its derivative is summed to it).
// extra, if given, adds terms the kernels do not have (a user's, in torch): its value, gradient and Hessian blocks
// join the kernels' everywhere (products, preconditioner, factorizations), and the solver's params from
// extra.first_param on are its.
struct ExtraTerms {
  std::function<torch::Tensor(const torch::Tensor& y)> value;  // (B, F, d) -> (B,)
  // (B, F, d) -> the gradient (B, F, d), and per stencil (rows (K, k) int64, blocks (B, K, kd, kd)).
  std::function<std::pair<torch::Tensor, std::vector<std::pair<torch::Tensor, torch::Tensor>>>(const torch::Tensor& y)>
      derivatives;
  // d/dtheta [grad E_extra(y) . w] for its parameters at the positions `wanted` (counted from first_param), and
  // for the step's x0 (-1) and h (-2), which its terms read too.
  std::function<std::vector<torch::Tensor>(const torch::Tensor& y, const torch::Tensor& w,
                                           const std::vector<int64_t>& wanted)>
      mixed_vjp;
  int64_t first_param = 0;  // the position in StepParams::flat() of its first parameter
};

AnalyticEnergy step_analytic_energy(const StepModel& model, const StepState& state, bool factorize = false,
                                    const std::vector<int64_t>& params = {},
                                    const std::vector<std::vector<int64_t>>& param_shapes = {},
                                    std::shared_ptr<const ExtraTerms> extra = nullptr);

}  // namespace diffsoft
