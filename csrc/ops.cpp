// The fused step kernels (physics/step_energy.h) as PyTorch operators, torch.ops.diffsoft.*: what diffsoft.fused
// calls, and what torch.compile, FakeTensor and torch.library.opcheck see. Their fake (meta) implementations,
// which give the outputs' shapes without data, are registered from Python (diffsoft._ops), where torch 2.x
// wants them. The operators are kernels, with no autograd formula: diffsoft.fused's autograd Functions compose
// them into the step energy's derivatives of every order the solver and the backward need. Asked for a derivative
// (grad mode on, an input that requires grad), an operator refuses by name rather than return a result that
// silently carries none.
//
// Schemas (B problems, F free vertices, N vertices, E elements, M muscles, d = 2 or 3; see model.h):
//   model: Tensor?[] in kKernelModelFields' order; material: 0 algovivo, 1 neo_hookean, 2 stable_neo_hookean;
//   collider_kinds: int[], one per collider (model.h's Collider::kind); collider_params: Tensor[], every
//   collider's parameters one after the other (its kind's count: _C.COLLIDER_KINDS).
//   step_energy             (model, material, collider_kinds, collider_params, y (B, F, d), x0 (B, N, d), x0_free,
//                            x_hat (B, F, d), activation (B, M)) -> (B,)
//   step_energy_derivatives (same) -> grad (B, F, d), element_blocks (B, E, (d+1)d, (d+1)d),
//                            muscle_blocks (B, M, 2d, 2d), vertex_blocks (B, F, d, d)
//   step_energy_hvp         (model, material, collider_kinds, collider_params, element_blocks, muscle_blocks,
//                            vertex_blocks, v (B, F, d)) -> H v (B, F, d)
//   step_energy_param_grads (as step_energy, weight (B,)?, dir (B, F, d)?) -> one tensor per step parameter, in
//                            StepParam's order, then each collider's, each shaped like one problem's value with
//                            a leading B
#include "ops.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "diffsoft/physics/kernels.h"
#include "diffsoft/physics/step_energy.h"

namespace diffsoft {

StepModel kernel_model(const std::vector<torch::Tensor>& t, int64_t material,
                       const std::vector<int64_t>& collider_kinds_of_model,
                       const std::vector<torch::Tensor>& collider_params, std::shared_ptr<FactorCache> factor_cache) {
  if (t.size() != kKernelModelFields.size())
    throw std::invalid_argument("the step model must be " + std::to_string(kKernelModelFields.size()) +
                                " tensors (elements, muscles, ...), got " + std::to_string(t.size()));
  if (material < 0 || material > 2)
    throw std::invalid_argument("material must be 0 (algovivo), 1 (neo_hookean) or 2 (stable_neo_hookean), got " +
                                std::to_string(material));
  StepModel m;
  m.elements = t[0], m.muscles = t[1], m.slot = t[2], m.mass = t[3], m.Dm_inv = t[4], m.mu = t[5], m.lam = t[6];
  m.rest_length = t[7], m.stiffness = t[8], m.h = t[9], m.gravity = t[10];
  for (const auto* index : {&m.elements, &m.muscles, &m.slot})
    if (!index->defined() || index->scalar_type() != torch::kInt64 || !index->device().is_cpu())
      throw std::invalid_argument("the step model's elements, muscles and slot must be int64 CPU tensors");
  m.material = material;
  const std::vector<ColliderKindInfo>& kinds = collider_kinds();
  size_t count = 0;
  for (const int64_t kind : collider_kinds_of_model) {
    if (kind < 0 || kind >= static_cast<int64_t>(kinds.size()))
      throw std::invalid_argument("collider kind " + std::to_string(kind) + " is not in [0, " +
                                  std::to_string(kinds.size()) + ")");
    count += kinds[kind].params.size();
  }
  if (count != collider_params.size())
    throw std::invalid_argument("the colliders' kinds take " + std::to_string(count) + " parameters, but " +
                                std::to_string(collider_params.size()) + " were given");
  auto next = collider_params.begin();
  for (const int64_t kind : collider_kinds_of_model) {
    const auto end = next + static_cast<std::ptrdiff_t>(kinds[kind].params.size());
    m.colliders.push_back({kind, std::vector<torch::Tensor>(next, end)});
    next = end;
  }
  m.factor_cache = std::move(factor_cache);
  return m;
}

int64_t collider_param_rank(int64_t kind, int64_t j, int64_t d) {
  if (kind < 0 || kind >= static_cast<int64_t>(collider_kinds().size()))
    throw std::invalid_argument("collider kind " + std::to_string(kind) + " is not in [0, " +
                                std::to_string(collider_kinds().size()) + ")");
  return j < 3 ? 0 : kernels::geometry_rank(kind, static_cast<size_t>(j - 3), d);
}

}  // namespace diffsoft

namespace {

using torch::Tensor;
using ModelTensors = c10::List<c10::optional<Tensor>>;
using IntList = c10::ArrayRef<int64_t>;
using TensorList = c10::ArrayRef<Tensor>;

// The kernels' invalid arguments as Python's ValueError (torch.ops turns other std exceptions into RuntimeError).
template <typename F>
auto checked(F&& kernel) {
  try {
    return kernel();
  } catch (const std::invalid_argument& e) {
    C10_THROW_ERROR(ValueError, e.what());
  }
}

diffsoft::StepModel model_of(const ModelTensors& model, int64_t material, IntList kinds, TensorList params) {
  std::vector<Tensor> tensors;
  for (const c10::optional<Tensor>& t : model) tensors.push_back(t.has_value() ? *t : Tensor());
  return diffsoft::kernel_model(tensors, material, kinds.vec(), params.vec());
}

Tensor step_energy(const ModelTensors& model, int64_t material, IntList kinds, TensorList params, const Tensor& y,
                   const Tensor& x0, const Tensor& x0_free, const Tensor& x_hat, const Tensor& activation) {
  return checked([&] {
    return diffsoft::step_energy_value(model_of(model, material, kinds, params), {y, x0, x0_free, x_hat, activation});
  });
}

std::tuple<Tensor, Tensor, Tensor, Tensor> step_energy_derivatives(const ModelTensors& model, int64_t material,
                                                                   IntList kinds, TensorList params, const Tensor& y,
                                                                   const Tensor& x0, const Tensor& x0_free,
                                                                   const Tensor& x_hat, const Tensor& activation) {
  return checked([&] {
    const auto out = diffsoft::step_energy_derivatives(model_of(model, material, kinds, params),
                                                       {y, x0, x0_free, x_hat, activation});
    return std::make_tuple(out.grad, out.element_blocks, out.muscle_blocks, out.vertex_blocks);
  });
}

Tensor step_energy_hvp(const ModelTensors& model, int64_t material, IntList kinds, TensorList params,
                       const Tensor& element_blocks, const Tensor& muscle_blocks, const Tensor& vertex_blocks,
                       const Tensor& v) {
  return checked([&] {
    diffsoft::StepDerivatives blocks;
    blocks.element_blocks = element_blocks, blocks.muscle_blocks = muscle_blocks, blocks.vertex_blocks = vertex_blocks;
    return diffsoft::step_energy_hvp(model_of(model, material, kinds, params), blocks, v);
  });
}

std::vector<Tensor> step_energy_param_grads(const ModelTensors& model, int64_t material, IntList kinds,
                                            TensorList params, const Tensor& y, const Tensor& x0, const Tensor& x0_free,
                                            const Tensor& x_hat, const Tensor& activation,
                                            const c10::optional<Tensor>& weight, const c10::optional<Tensor>& dir) {
  return checked([&] {
    return diffsoft::step_energy_param_grads(model_of(model, material, kinds, params),
                                             {y, x0, x0_free, x_hat, activation}, weight.value_or(Tensor()),
                                             dir.value_or(Tensor()))
        .flat();
  });
}

bool requires_grad(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().requires_grad();
  if (v.isList())
    for (const c10::IValue& item : v.toListRef())
      if (requires_grad(item)) return true;
  return false;
}

// Every operator's Autograd kernel: the CPU kernel below autograd, unless a derivative is asked for.
void without_autograd(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (at::GradMode::is_enabled())
    for (const c10::IValue& v : torch::jit::last(*stack, op.schema().arguments().size()))
      TORCH_CHECK(!requires_grad(v), op.schema().name(), " is a kernel without derivatives of its own: ",
                  "differentiate diffsoft.fused.step_energy (its autograd Functions compose these kernels), or ",
                  "call it on detached tensors or under torch.no_grad()");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  op.callBoxed(stack);
}

constexpr const char* kOperators[] = {"step_energy", "step_energy_derivatives", "step_energy_hvp",
                                      "step_energy_param_grads"};

}  // namespace

#define DIFFSOFT_MODEL "Tensor?[] model, int material, int[] collider_kinds, Tensor[] collider_params, "

TORCH_LIBRARY(diffsoft, m) {
  m.def("step_energy(" DIFFSOFT_MODEL "Tensor y, Tensor x0, Tensor x0_free, Tensor x_hat, Tensor activation) -> Tensor");
  m.def("step_energy_derivatives(" DIFFSOFT_MODEL "Tensor y, Tensor x0, Tensor x0_free, Tensor x_hat, "
        "Tensor activation) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("step_energy_hvp(" DIFFSOFT_MODEL "Tensor element_blocks, Tensor muscle_blocks, Tensor vertex_blocks, "
        "Tensor v) -> Tensor");
  m.def("step_energy_param_grads(" DIFFSOFT_MODEL "Tensor y, Tensor x0, Tensor x0_free, Tensor x_hat, "
        "Tensor activation, Tensor? weight=None, Tensor? dir=None) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(diffsoft, CPU, m) {
  m.impl("step_energy", &step_energy);
  m.impl("step_energy_derivatives", &step_energy_derivatives);
  m.impl("step_energy_hvp", &step_energy_hvp);
  m.impl("step_energy_param_grads", &step_energy_param_grads);
}

TORCH_LIBRARY_IMPL(diffsoft, Autograd, m) {
  for (const char* name : kOperators) m.impl(name, torch::CppFunction::makeFromBoxedFunction<&without_autograd>());
}
