// The backward-Euler step energy of the built-in soft-body model as fused CPU kernels: value, closed-form
// gradient, and Hessian blocks (one dense block per element and per muscle, a d x d block per free vertex) whose
// products with vectors are the Newton-CG Hessian-vector products. LibTorch + Eigen, no Python.
//
// The plain-torch reference, and the test oracle, is diffsoft.energies.reference_step_energy:
//   E(y) = sum_e psi(F_e; mu_e, lam_e) + sum_m k_m/2 (l_m / (a_m l0_m) - 1)^2
//        + 1/(2 h^2) sum_i m_i |y_i - x_hat_i|^2 + g sum_i m_i (y_i - x0_i)_y
//        + sum_c sum_i [k_c min(phi_c(y_i), 0)^2 + w_ci |P_ci (y_i - x0_i) / h|^2],
//   w_ci = k_f max(eps - phi_c(x0_i), 0), P_ci = I - n_c(x0_i) n_c(x0_i)^T,
// over the free vertices y (fixed vertices keep x0) and the colliders c (phi_c: the signed distance to the
// collider, n_c its unit gradient). One file per term, registered in terms.h: elastic.h (with materials.h),
// muscle.h, inertia.h (inertia and gravity), contact.h (contact and friction, over colliders.h's kinds);
// step_energy.cpp sums them over a batch, hessian_blocks.cpp applies and factors the blocks, step_solver.h gives
// the solver its analytic path. The model, the state and their shapes are in model.h.
#pragma once

#include <torch/torch.h>

#include "diffsoft/physics/model.h"

namespace diffsoft {

// Per-problem energies, (B,). +inf where a neo-Hookean element is inverted. With scale, also each problem's sum
// of its terms' magnitudes (the sum of |row energy| over every term's rows), the scale of the value's round-off:
// a total whose terms nearly cancel rounds like its terms, not like itself.
torch::Tensor step_energy_value(const StepModel& model, const StepState& state, torch::Tensor* scale = nullptr);

// The gradient and the Hessian's blocks at state.y.
StepDerivatives step_energy_derivatives(const StepModel& model, const StepState& state);

// Derivatives with respect to the parameters, one slice per problem (the caller sums shared parameters over the
// batch), shaped like the parameter with a leading B: x_hat (B, F, d), x0 (B, N, d), ..., gravity (B,) (see
// StepParam), and each collider's (B, *its shape for one problem): weight_b dE_b/dtheta (first order, weight
// (B,)) when dir is undefined, else
// d/dtheta [grad_y E_b . dir_b] (mixed, dir (B, F, d)), the parameter side of a Hessian-vector product.
StepParams<torch::Tensor> step_energy_param_grads(const StepModel& model, const StepState& state,
                                                  const torch::Tensor& weight, const torch::Tensor& dir);

// H v from the blocks of step_energy_derivatives; v: (B, F, d).
torch::Tensor step_energy_hvp(const StepModel& model, const StepDerivatives& derivatives, const torch::Tensor& v);

// The diagonal of H, (B, F, d), from the blocks of step_energy_derivatives.
torch::Tensor step_energy_hessian_diagonal(const StepModel& model, const StepDerivatives& derivatives);

}  // namespace diffsoft
