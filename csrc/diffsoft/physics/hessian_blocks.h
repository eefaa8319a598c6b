// The step Hessian as the blocks of step_energy_derivatives (StepDerivatives): products with vectors and the
// diagonal are declared in step_energy.h; here, its factorization per problem for the solver.
#pragma once

#include <memory>
#include <vector>

#include "diffsoft/core/factor.h"
#include "diffsoft/physics/model.h"

namespace diffsoft {

// Factors the Hessian of each problem b with need[b] into out[b] (of size B), or leaves null where it is not
// positive definite (the solver then falls back to CG for that problem). Runs the problems in parallel; the
// symbolic analysis comes from model.factor_cache when there is one.
void factor_step_hessians(const StepModel& model, const StepDerivatives& derivatives, const std::vector<char>& need,
                          std::vector<std::unique_ptr<Factor>>& out);

}  // namespace diffsoft
