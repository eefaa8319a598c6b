// The backward-Euler step energy of the built-in soft-body model as fused CPU kernels: value, closed-form
// gradient, and Hessian blocks (one dense block per element and per muscle, a diagonal for per-vertex terms)
// whose products with vectors are the Newton-CG Hessian-vector products. Pure LibTorch + Eigen, no Python.
//
// The plain-torch reference, and the test oracle, is diffsoft.simulator._step_energy:
//   E(y) = sum_e psi(F_e; mu_e, lam_e) + sum_m k_m/2 (l_m / (a_m l0_m) - 1)^2
//        + 1/(2 h^2) sum_i m_i |y_i - x_hat_i|^2 + g sum_i m_i (y_i - x0_i)_y
//        + k_c sum_i min(y_i,y - ground, 0)^2 + sum_i w_i |(y_i - x0_i)_t / h|^2,
//   w_i = k_f max(eps - (x0_i,y - ground), 0),
// over the free vertices y; fixed vertices keep x0. Shapes (B problems, N vertices, F free, E elements, M
// muscles, d = 2 or 3), all contiguous CPU tensors of one floating dtype unless noted:
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "core/factor.h"
#include "core/solver.h"

namespace diffsoft {

struct StepModel {
  torch::Tensor elements;    // (E, d+1) int64
  torch::Tensor muscles;     // (M, 2) int64, M may be 0
  torch::Tensor slot;        // (N,) int64: the free index of each vertex, -1 if fixed
  torch::Tensor mass;        // (F,) masses of the free vertices
  torch::Tensor Dm_inv;      // (E, d, d)
  torch::Tensor mu, lam;     // (E,) with the elements' weights folded in
  torch::Tensor rest_length; // (M,)
  torch::Tensor stiffness;   // (M,)
  int64_t material = 0;      // 0 algovivo, 1 neo_hookean, 2 stable_neo_hookean
  double h = 1.0, gravity = 0.0, contact_stiffness = 0.0, friction = 0.0, ground = 0.0, eps = 0.01;
  bool has_ground = false;
  std::shared_ptr<FactorCache> factor_cache;  // optional
};

struct StepState {
  torch::Tensor y;           // (B, F, d) free positions (the unknowns)
  torch::Tensor x0;          // (B, N, d) start-of-step positions, fixed vertices included
  torch::Tensor x0_free;     // (B, F, d) start-of-step positions of the free vertices (gravity, friction)
  torch::Tensor x_hat;       // (B, F, d) inertial prediction x0 + h v0 of the free vertices
  torch::Tensor activation;  // (B, M)
};

// Per-problem energies, (B,). +inf where a neo-Hookean element is inverted.
torch::Tensor step_energy_value(const StepModel& model, const StepState& state);

// {grad (B, F, d), element blocks (B, E, (d+1)d, (d+1)d), muscle blocks (B, M, 2d, 2d), diagonal (B, F, d)}.
// Block rows and columns are ordered (vertex of the element, component).
std::vector<torch::Tensor> step_energy_derivatives(const StepModel& model, const StepState& state);

// Derivatives with respect to the parameters, in the order {x_hat (B, F, d), x0 (B, N, d), x0_free (B, F, d),
// mass (B, F), Dm_inv (B, E, d, d), mu (B, E), lam (B, E), activation (B, M), rest_length (B, M),
// stiffness (B, M), gravity (B,), contact_stiffness (B,), friction (B,)}, one slice per problem (the caller sums
// shared parameters over the batch): weight_b dE_b/dtheta (first order, weight (B,)) when dir is undefined,
// else d/dtheta [grad_y E_b . dir_b] (mixed, dir (B, F, d)), the parameter side of a Hessian-vector product.
std::vector<torch::Tensor> step_energy_param_grads(const StepModel& model, const StepState& state,
                                                   const torch::Tensor& weight, const torch::Tensor& dir);

// H v from the blocks of step_energy_derivatives; v: (B, F, d).
torch::Tensor step_energy_hvp(const StepModel& model, const std::vector<torch::Tensor>& derivatives,
                              const torch::Tensor& v);

// The diagonal of H, (B, F, d), from the blocks of step_energy_derivatives.
torch::Tensor step_energy_hessian_diagonal(const StepModel& model, const std::vector<torch::Tensor>& derivatives);

// The number of step parameters, in the order of step_energy_param_grads.
constexpr int64_t kStepParams = 13;

// The step energy as the solver's direct path (no autograd in Newton's loop), with a Jacobi preconditioner
// and, with factorize, a factorization of each problem's Hessian (dense Cholesky for small problems, sparse
// LDL^T with AMD ordering otherwise), made when a solve first needs it, for Newton's steps and the adjoint
// solve: rows x (B, F*d) are the free positions; state.y is not used. With param_slots, it also gives the
// backward's parameter product in closed form: the solver's k-th param is step parameter param_slots[k]
// (in the order of step_energy_param_grads), of shape param_shapes[k] (its derivative is summed to it).
DirectEnergy step_direct_energy(const StepModel& model, const StepState& state, bool factorize = false,
                                const std::vector<int64_t>& param_slots = {},
                                const std::vector<std::vector<int64_t>>& param_shapes = {});

}  // namespace diffsoft
