// The data of the step problem: the model (mesh, materials, muscles, colliders), the state of one step, the
// names of its parameters, and the Hessian blocks of step_energy_derivatives. See step_energy.h for the
// energy these describe, and terms.h for the terms that make it.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "diffsoft/core/factor.h"

namespace diffsoft {

// One collider of the model: its kind (an index into colliders.h's ColliderKinds, named by collider_kinds())
// and its parameters in the kind's order: the contact's stiffness k_c, friction k_f and friction band eps, then
// the geometry's own (a plane's normal and offset, ...). Each is shared by the batch with the kind's shape, or
// per problem with a leading B.
struct Collider {
  int64_t kind = 0;
  std::vector<torch::Tensor> params;
};

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
  torch::Tensor h, gravity;   // () or (B,): the time step, gravity's acceleration (along -y)
  std::vector<Collider> colliders;            // contact and friction against each; none: free flight
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
// The reference (diffsoft.energies.muscle_energy) uses the same constant.
constexpr double kMuscleLengthFloor = 1e-6;

// The step energy's parameters of the body and the state, in the order of diffsoft.step.StepParams' fields;
// kStepParamNames names them. The colliders' parameters follow them (StepParams::colliders). The shapes are
// those of one problem; the model's parameters may also be per problem (StepModel).
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
  h,                   // scalar, the time step
};
constexpr int kNumStepParams = 12;
constexpr std::array<const char*, kNumStepParams> kStepParamNames = {
    "x_hat", "x0",  "x0_free", "mass", "Dm_inv", "mu", "lam", "activation", "muscle_rest_length", "muscle_stiffness",
    "gravity", "h"};

// The parameter at position index of kStepParamNames; throws std::invalid_argument outside [0, kNumStepParams).
inline StepParam step_param(int64_t index) {
  if (index < 0 || index >= kNumStepParams)
    throw std::invalid_argument("step parameter index " + std::to_string(index) + " is not in [0, " +
                                std::to_string(kNumStepParams) + ")");
  return static_cast<StepParam>(index);
}

// One T per step parameter: the body's and the state's, indexed by StepParam, then each collider's, in its
// kind's order. flat() lists them all in that order, the order of diffsoft.step.StepParams.flat().
template <typename T>
struct StepParams {
  std::array<T, kNumStepParams> values{};
  std::vector<std::vector<T>> colliders;
  T& operator[](StepParam p) { return values[static_cast<size_t>(p)]; }
  const T& operator[](StepParam p) const { return values[static_cast<size_t>(p)]; }
  std::vector<T> flat() const {
    std::vector<T> out(values.begin(), values.end());
    for (const auto& c : colliders) out.insert(out.end(), c.begin(), c.end());
    return out;
  }
};

// The gradient and the Hessian of the step energy in blocks, one per row of each stencil: a dense block per
// element and per muscle, whose rows and columns are ordered (vertex of the element or muscle, component), and a
// d x d block per free vertex (inertia, and contact and friction against the colliders: n n^T and I - n n^T
// for a collider's normal n). H = the vertex blocks on the diagonal + the element and muscle blocks scattered to
// the free vertices (fixed vertices' rows dropped). extra: the blocks of terms outside the kernels (a user's
// torch terms, step_solver.h's ExtraTerms), per stencil its rows (K, k) int64 vertex indices and their blocks
// (B, K, kd, kd), ordered like the muscles'; they add to H likewise.
struct StepDerivatives {
  torch::Tensor grad;            // (B, F, d)
  torch::Tensor element_blocks;  // (B, E, (d+1)d, (d+1)d)
  torch::Tensor muscle_blocks;   // (B, M, 2d, 2d)
  torch::Tensor vertex_blocks;   // (B, F, d, d)
  std::vector<std::pair<torch::Tensor, torch::Tensor>> extra;
};

// The collider kinds, in the order of Collider::kind: each one's name and its parameters' names (the contact's,
// then the geometry's), made once. Defined with the kinds (colliders.h).
struct ColliderKindInfo {
  std::string name;
  std::vector<std::string> params;
};
const std::vector<ColliderKindInfo>& collider_kinds();

}  // namespace diffsoft
