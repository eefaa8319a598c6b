// The step model as the registered operators (ops.cpp) and the bindings (bindings.cpp) take it from Python: its
// tensors in one list, in kKernelModelFields' order (checked against diffsoft.fused at import), and its flags.
#pragma once

#include <torch/torch.h>

#include <array>
#include <memory>
#include <vector>

#include "core/factor.h"
#include "physics/model.h"

namespace diffsoft {

constexpr std::array<const char*, 15> kKernelModelFields = {
    "elements", "muscles", "slot",    "mass",              "Dm_inv",   "mu",     "lam",         "rest_length",
    "stiffness", "h",      "gravity", "contact_stiffness", "friction", "ground", "friction_eps"};

// The StepModel of these tensors (undefined where absent) and flags; throws std::invalid_argument naming the
// problem when the list's length, the indices' dtype or the material is wrong (the kernels check the rest).
StepModel kernel_model(const std::vector<torch::Tensor>& tensors, int64_t material, bool has_ground,
                       std::shared_ptr<FactorCache> factor_cache = nullptr);

}  // namespace diffsoft
