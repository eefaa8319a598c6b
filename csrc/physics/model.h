// The data of the step problem: the model (mesh, materials, muscles, ground), the state of one step, the
// names of its parameters, and the Hessian blocks of step_energy_derivatives. See step_energy.h for the
// energy these describe.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/factor.h"

namespace diffsoft {

// Shapes (B problems, N vertices, F free, E elements, M muscles, d = 2 or 3), all contiguous CPU tensors of one
// floating dtype unless noted. Every parameter is shared by the batch with the shape shown, or per problem with a
// leading B (a batch of creatures with different bodies or worlds: domain randomisation); View::problem(b) reads
// problem b's.
struct StepModel {
  torch::Tensor elements;     // (E, d+1) int64
  torch::Tensor muscles;      // (M, 2) int64, M may be 0
  torch::Tensor slot;         // (N,) int64: the free index of each vertex, -1 if fixed
  torch::Tensor mass;         // (F,) masses of the free vertices
  torch::Tensor Dm_inv;       // (E, d, d)
  torch::Tensor mu, lam;      // (E,) each, with the elements' weights folded in
  torch::Tensor rest_length;  // (M,)
  torch::Tensor stiffness;    // (M,)
  int64_t material = 0;       // 0 algovivo, 1 neo_hookean, 2 stable_neo_hookean
  // The scalars, () or (B,): the time step, gravity's acceleration (along -y), and, used only with has_ground
  // (they may then be undefined without it), the contact stiffness k_c, the friction coefficient k_f, the
  // ground's height and the friction band eps above it.
  torch::Tensor h, gravity, contact_stiffness, friction, ground, friction_eps;
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

// A muscle's length is sqrt(|x_i - x_j|^2 + kMuscleLengthFloor): smooth, and never 0, where its two ends meet.
// The reference (diffsoft.energies.muscle_energy and fused._muscle_blocks) uses the same constant.
constexpr double kMuscleLengthFloor = 1e-6;

// The step energy's parameters, in the order of the reference energy's arguments after y
// (diffsoft.energies.reference_step_energy) and of diffsoft.step.StepParams; kStepParamNames names them. The
// shapes are those of one problem; the model's parameters may also be per problem (StepModel).
enum class StepParam : int {
  x_hat,               // (B, F, d)
  x0,                  // (B, N, d)
  x0_free,             // (B, F, d)
  mass,                // (F,)
  Dm_inv,              // (E, d, d)
  mu,                  // (E,)
  lam,                 // (E,)
  activation,          // (B, M)
  muscle_rest_length,  // (M,)
  muscle_stiffness,    // (M,)
  gravity,             // scalar
  contact_stiffness,   // scalar
  friction,            // scalar
  h,                   // scalar, the time step
  ground,              // scalar, the ground's height
  friction_eps,        // scalar, the friction band's height
};
constexpr int kNumStepParams = 16;
constexpr std::array<const char*, kNumStepParams> kStepParamNames = {
    "x_hat",   "x0",  "x0_free", "mass",     "Dm_inv",        "mu",       "lam", "activation", "muscle_rest_length",
    "muscle_stiffness", "gravity", "contact_stiffness", "friction", "h", "ground", "friction_eps"};

// The parameter at position index of kStepParamNames; throws std::invalid_argument outside [0, kNumStepParams).
inline StepParam step_param(int64_t index) {
  if (index < 0 || index >= kNumStepParams)
    throw std::invalid_argument("step parameter index " + std::to_string(index) + " is not in [0, " +
                                std::to_string(kNumStepParams) + ")");
  return static_cast<StepParam>(index);
}

// One T per step parameter, indexed by StepParam; iterates in enum order.
template <typename T>
struct StepParams {
  std::array<T, kNumStepParams> values{};
  T& operator[](StepParam p) { return values[static_cast<size_t>(p)]; }
  const T& operator[](StepParam p) const { return values[static_cast<size_t>(p)]; }
  auto begin() { return values.begin(); }
  auto end() { return values.end(); }
  auto begin() const { return values.begin(); }
  auto end() const { return values.end(); }
};

// The gradient and the Hessian of the step energy in blocks: one dense block per element and per muscle, whose
// rows and columns are ordered (vertex of the element or muscle, component), and a diagonal for the per-vertex
// terms. H = diag(diagonal) + the blocks scattered to the free vertices (fixed vertices' rows dropped).
struct StepDerivatives {
  torch::Tensor grad;            // (B, F, d)
  torch::Tensor element_blocks;  // (B, E, (d+1)d, (d+1)d)
  torch::Tensor muscle_blocks;   // (B, M, 2d, 2d)
  torch::Tensor diagonal;        // (B, F, d)
};

}  // namespace diffsoft
