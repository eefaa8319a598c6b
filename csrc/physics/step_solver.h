// The step energy as the solver's analytic path (core/solver.h's AnalyticEnergy): Newton's loop and the
// backward run on the fused kernels of step_energy.h, without autograd.
#pragma once

#include <vector>

#include "core/solver.h"
#include "physics/step_energy.h"

namespace diffsoft {

// The analytic energy of the step problem, with a Jacobi preconditioner and, with factorize, a factorization of
// each problem's Hessian (dense Cholesky for small problems, sparse LDL^T with AMD ordering otherwise), made
// when a solve first needs it, for Newton's steps and the adjoint solve: rows x (B, F*d) are the free
// positions; state.y is not used. With params, it also gives the backward's parameter product in closed form:
// the solver's k-th param is step parameter params[k], of shape param_shapes[k] (its derivative is summed to
// it).
AnalyticEnergy step_analytic_energy(const StepModel& model, const StepState& state, bool factorize = false,
                                    const std::vector<StepParam>& params = {},
                                    const std::vector<std::vector<int64_t>>& param_shapes = {});

}  // namespace diffsoft
