// The step energy's fused CPU kernels over a batch: each problem's loops sum the terms of elastic.h, muscle.h,
// inertia.h and contact.h. See step_energy.h for the model and the shapes.
#include "physics/step_energy.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "physics/contact.h"
#include "physics/elastic.h"
#include "physics/inertia.h"
#include "physics/kernels.h"
#include "physics/muscle.h"

namespace diffsoft {

namespace kernels {

StepModel contiguous(const StepModel& m) {
  StepModel c = m;
  for (torch::Tensor* t : {&c.elements, &c.muscles, &c.slot, &c.mass, &c.Dm_inv, &c.mu, &c.lam, &c.rest_length,
                           &c.stiffness, &c.h, &c.gravity, &c.contact_stiffness, &c.friction, &c.ground,
                           &c.friction_eps})
    if (t->defined()) *t = t->contiguous();
  return c;
}

namespace {

template <typename S, int D>
S problem_energy(const View<S, D>& v, const S* y, const S* x0, const S* x0_free, const S* x_hat, const S* act) {
  S e = 0;
  for (int64_t k = 0; k < v.e; ++k) e += elastic_energy(v, y, x0, k);
  for (int64_t k = 0; k < v.nm; ++k) e += muscle_energy(v, y, x0, act, k);
  for (int64_t i = 0; i < v.n; ++i) {
    const int64_t s = v.slot[i];
    if (s < 0) continue;
    e += inertia_energy(v, y, x0_free, x_hat, s);
    if (v.m.has_ground) e += contact_energy(v, y, x0_free, s);
  }
  return e;
}

template <typename S, int D>
void problem_derivatives(const View<S, D>& v, const S* y, const S* x0, const S* x0_free, const S* x_hat, const S* act,
                         S* grad, S* k_el, S* k_mu, S* diag) {
  constexpr int ND = (D + 1) * D;
  std::fill(grad, grad + v.f * D, S(0));
  for (int64_t k = 0; k < v.e; ++k) elastic_derivatives(v, y, x0, k, grad, k_el + k * ND * ND);
  for (int64_t k = 0; k < v.nm; ++k) muscle_derivatives(v, y, x0, act, k, grad, k_mu + k * 4 * D * D);
  for (int64_t i = 0; i < v.n; ++i) {
    const int64_t s = v.slot[i];
    if (s < 0) continue;
    inertia_derivatives(v, y, x_hat, s, grad, diag);
    if (v.m.has_ground) contact_derivatives(v, y, x0_free, s, grad, diag);
  }
}

// One problem's parameter derivatives, added to o (its slices of the outputs): weight * dE/dtheta when dir is
// null, d/dtheta [grad_y E . dir] otherwise.
template <typename S, int D>
void problem_param_grads(const View<S, D>& v, const S* y, const S* x0, const S* x0_free, const S* x_hat,
                         const S* act, const S* dir, S weight, const StepParams<S*>& o) {
  for (int64_t k = 0; k < v.e; ++k) elastic_param_grads(v, y, x0, k, dir, weight, o);
  for (int64_t k = 0; k < v.nm; ++k) muscle_param_grads(v, y, x0, act, k, dir, weight, o);
  for (int64_t i = 0; i < v.n; ++i) {
    const int64_t s = v.slot[i];
    if (s < 0) continue;
    inertia_param_grads(v, y, x0_free, x_hat, s, dir, weight, o);
    if (v.m.has_ground) contact_param_grads(v, y, x0_free, s, dir, weight, o);
  }
}

// Whether t is shaped `shape` (shared by the batch) or (batch, *shape) (one per problem), in the dtype of y.
bool per_problem_or_shared(const torch::Tensor& t, std::vector<int64_t> shape, int64_t batch,
                           const torch::Tensor& y) {
  if (!t.defined() || t.scalar_type() != y.scalar_type() || !t.device().is_cpu()) return false;
  if (t.sizes() == c10::IntArrayRef(shape)) return true;
  shape.insert(shape.begin(), batch);
  return t.sizes() == c10::IntArrayRef(shape);
}

void check(const StepModel& m, const StepState& s) {
  const int64_t d = s.y.size(-1);
  if (!s.y.device().is_cpu()) throw std::invalid_argument("the fused step kernels run on CPU tensors only");
  if (s.y.dim() != 3 || (d != 2 && d != 3)) throw std::invalid_argument("y must be (B, F, d) with d = 2 or 3");
  if (s.x0_free.sizes() != s.y.sizes() || s.x_hat.sizes() != s.y.sizes())
    throw std::invalid_argument("x0_free and x_hat must have the shape of y");
  if (s.x0.dim() != 3 || s.x0.size(0) != s.y.size(0) || s.x0.size(1) != m.slot.size(0) || s.x0.size(2) != d)
    throw std::invalid_argument("x0 must be (B, N, d)");
  const int64_t batch = s.y.size(0), f = s.y.size(1), e = m.elements.size(0), nm = m.muscles.size(0);
  if (nm && (s.activation.dim() != 2 || s.activation.size(0) != batch || s.activation.size(1) != nm))
    throw std::invalid_argument("activation must be (B, M)");
  // Each parameter: its name, its shape when shared by the batch, and whether it is needed.
  const struct {
    const char* name;
    const torch::Tensor& t;
    std::vector<int64_t> shape;
    bool needed;
  } params[] = {{"mass", m.mass, {f}, true},
                {"Dm_inv", m.Dm_inv, {e, d, d}, true},
                {"mu", m.mu, {e}, true},
                {"lam", m.lam, {e}, true},
                {"rest_length", m.rest_length, {nm}, nm > 0},
                {"stiffness", m.stiffness, {nm}, nm > 0},
                {"h", m.h, {}, true},
                {"gravity", m.gravity, {}, true},
                {"contact_stiffness", m.contact_stiffness, {}, m.has_ground},
                {"friction", m.friction, {}, m.has_ground},
                {"ground", m.ground, {}, m.has_ground},
                {"friction_eps", m.friction_eps, {}, m.has_ground}};
  for (const auto& p : params) {
    if (!p.needed && !p.t.defined()) continue;
    if (!per_problem_or_shared(p.t, p.shape, batch, s.y)) {
      std::string shape = "(";
      for (size_t k = 0; k < p.shape.size(); ++k) shape += (k ? ", " : "") + std::to_string(p.shape[k]);
      shape += p.shape.size() == 1 ? ",)" : ")";
      throw std::invalid_argument(std::string("StepModel.") + p.name + " must be a CPU tensor of y's dtype, " +
                                  "shaped " + shape + " (shared by the batch) or with a leading B = " +
                                  std::to_string(batch) + " (one per problem)");
    }
  }
  const int64_t n = m.slot.size(0);
  for (const torch::Tensor* idx : {&m.elements, &m.muscles})
    if (idx->numel() && (idx->min().item<int64_t>() < 0 || idx->max().item<int64_t>() >= n))
      throw std::invalid_argument("element or muscle vertex index out of range");
  if (m.slot.numel() && m.slot.max().item<int64_t>() >= f)
    throw std::invalid_argument("slot refers to a free vertex beyond y");
  if (m.elements.size(1) != d + 1) throw std::invalid_argument("elements must be (E, d + 1)");
  if (m.material < 0 || m.material > 2) throw std::invalid_argument("unknown material code");
}

// Calls f(view, b, y, x0, x0_free, x_hat, activation) with problem b's pointers into the (checked) state,
// for every problem of the batch, in parallel.
template <typename F>
void for_each_state(const StepModel& model, const StepState& state, F&& f) {
  const StepModel m = contiguous(model);
  torch::Tensor y = state.y.contiguous(), x0 = state.x0.contiguous(), x0_free = state.x0_free.contiguous(),
                x_hat = state.x_hat.contiguous();
  torch::Tensor act = m.muscles.size(0) ? state.activation.contiguous() : state.activation;
  dispatch(y, [&](auto s, auto dim) {
    using S = decltype(s);
    constexpr int D = decltype(dim)::value;
    View<S, D> v(m);
    at::parallel_for(0, y.size(0), 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b)
        f(v.problem(b), b, y.data_ptr<S>() + b * v.f * D, x0.data_ptr<S>() + b * v.n * D,
          x0_free.data_ptr<S>() + b * v.f * D,
          x_hat.data_ptr<S>() + b * v.f * D, v.nm ? act.data_ptr<S>() + b * v.nm : nullptr);
    });
  });
}

}  // namespace
}  // namespace kernels

torch::Tensor step_energy_value(const StepModel& model, const StepState& state) {
  kernels::check(model, state);
  torch::Tensor out = torch::empty({state.y.size(0)}, state.y.options());
  kernels::for_each_state(model, state, [&](const auto& v, int64_t b, const auto* y, const auto* x0,
                                            const auto* x0_free, const auto* x_hat, const auto* act) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    out.data_ptr<S>()[b] = kernels::problem_energy(v, y, x0, x0_free, x_hat, act);
  });
  return out;
}

StepDerivatives step_energy_derivatives(const StepModel& model, const StepState& state) {
  kernels::check(model, state);
  const torch::Tensor& y = state.y;
  const int64_t batch = y.size(0), d = y.size(-1), e = model.elements.size(0), nm = model.muscles.size(0);
  StepDerivatives out;
  out.grad = torch::empty(y.sizes(), y.options());
  out.element_blocks = torch::empty({batch, e, (d + 1) * d, (d + 1) * d}, y.options());
  out.muscle_blocks = torch::empty({batch, nm, 2 * d, 2 * d}, y.options());
  out.diagonal = torch::empty(y.sizes(), y.options());
  kernels::for_each_state(model, state, [&](const auto& v, int64_t b, const auto* y, const auto* x0,
                                            const auto* x0_free, const auto* x_hat, const auto* act) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    constexpr int D = std::decay_t<decltype(v)>::dim, ND = (D + 1) * D;
    kernels::problem_derivatives(v, y, x0, x0_free, x_hat, act, out.grad.data_ptr<S>() + b * v.f * D,
                                 out.element_blocks.data_ptr<S>() + b * e * ND * ND,
                                 out.muscle_blocks.data_ptr<S>() + b * nm * 4 * D * D,
                                 out.diagonal.data_ptr<S>() + b * v.f * D);
  });
  return out;
}

StepParams<torch::Tensor> step_energy_param_grads(const StepModel& model, const StepState& state,
                                                  const torch::Tensor& weight, const torch::Tensor& dir) {
  kernels::check(model, state);
  const torch::Tensor& y = state.y;
  const bool mixed = dir.defined();
  if (mixed && (dir.sizes() != y.sizes() || dir.scalar_type() != y.scalar_type() || !dir.device().is_cpu()))
    throw std::invalid_argument("dir must be a CPU tensor with the shape and dtype of y");
  if (!mixed && (weight.dim() != 1 || weight.size(0) != y.size(0) || weight.scalar_type() != y.scalar_type()))
    throw std::invalid_argument("weight must be (B,), one weight per problem, in y's dtype");
  const int64_t b = y.size(0), f = y.size(1), d = y.size(2), n = model.slot.size(0), e = model.elements.size(0),
                nm = model.muscles.size(0);
  // Each parameter's shape per problem; the outputs add a leading B.
  auto shape_of = [&](StepParam param) -> std::vector<int64_t> {
    switch (param) {  // no default: -Wswitch names a parameter added to the enum but not here
      case StepParam::x_hat:
      case StepParam::x0_free:
        return {f, d};
      case StepParam::x0:
        return {n, d};
      case StepParam::mass:
        return {f};
      case StepParam::Dm_inv:
        return {e, d, d};
      case StepParam::mu:
      case StepParam::lam:
        return {e};
      case StepParam::activation:
      case StepParam::muscle_rest_length:
      case StepParam::muscle_stiffness:
        return {nm};
      case StepParam::gravity:
      case StepParam::contact_stiffness:
      case StepParam::friction:
      case StepParam::h:
      case StepParam::ground:
      case StepParam::friction_eps:
        return {};
    }
    throw std::logic_error("step_energy_param_grads: a step parameter without a shape");
  };
  StepParams<torch::Tensor> out;
  for (int k = 0; k < kNumStepParams; ++k) {
    std::vector<int64_t> shape = shape_of(step_param(k));
    shape.insert(shape.begin(), b);
    out.values[k] = torch::zeros(shape, y.options());
  }
  torch::Tensor w = mixed ? torch::Tensor() : weight.contiguous();
  torch::Tensor dr = mixed ? dir.contiguous() : torch::Tensor();
  kernels::for_each_state(model, state, [&](const auto& v, int64_t p, const auto* y, const auto* x0,
                                            const auto* x0_free, const auto* x_hat, const auto* act) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    StepParams<S*> o;  // this problem's slices
    for (int k = 0; k < kNumStepParams; ++k)
      o.values[k] = out.values[k].data_ptr<S>() + p * (out.values[k].numel() / b);
    kernels::problem_param_grads(v, y, x0, x0_free, x_hat, act, mixed ? dr.data_ptr<S>() + p * f * d : nullptr,
                                 mixed ? S(1) : w.data_ptr<S>()[p], o);
  });
  return out;
}

}  // namespace diffsoft
