// The step model as the registered operators (ops.cpp) and the bindings (bindings.cpp) take it from Python: its
// tensors in one list, in kKernelModelFields' order (checked against diffsoft._ops at import), its material, and
// its colliders as their kinds and their parameters in one list (each kind's count, in its order).
#pragma once

#include <torch/torch.h>

#include <array>
#include <memory>
#include <vector>

#include "diffsoft/core/factor.h"
#include "diffsoft/physics/model.h"

namespace diffsoft {

constexpr std::array<const char*, 11> kKernelModelFields = {
    "elements", "muscles", "slot", "mass", "Dm_inv", "mu", "lam", "rest_length", "stiffness", "h", "gravity"};

// The StepModel of these tensors (undefined where absent), material and colliders (collider_params: every
// collider's parameters, one after the other); throws std::invalid_argument naming the problem when the list's
// length, the indices' dtype, the material, a collider's kind or the parameters' count is wrong (the kernels
// check the rest).
StepModel kernel_model(const std::vector<torch::Tensor>& tensors, int64_t material,
                       const std::vector<int64_t>& collider_kinds, const std::vector<torch::Tensor>& collider_params,
                       std::shared_ptr<FactorCache> factor_cache = nullptr);

// The number of trailing dimensions of one problem's value of parameter j (the contact's three, then the
// geometry's) of a collider of this kind in d dimensions: a per-problem value has one more, its leading B.
int64_t collider_param_rank(int64_t kind, int64_t j, int64_t d);

}  // namespace diffsoft
