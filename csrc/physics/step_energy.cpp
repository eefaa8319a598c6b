// The step energy's fused CPU kernels over a batch: each problem's loops sum the terms of elastic.h, muscle.h,
// inertia.h and contact.h. See step_energy.h for the model and the shapes.
#include "physics/step_energy.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <stdexcept>

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
                           &c.stiffness})
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

void check(const StepModel& m, const StepState& s) {
  const int64_t d = s.y.size(-1);
  if (!s.y.device().is_cpu()) throw std::invalid_argument("the fused step kernels run on CPU tensors only");
  if (s.y.dim() != 3 || (d != 2 && d != 3)) throw std::invalid_argument("y must be (B, F, d) with d = 2 or 3");
  if (s.x0_free.sizes() != s.y.sizes() || s.x_hat.sizes() != s.y.sizes())
    throw std::invalid_argument("x0_free and x_hat must have the shape of y");
  if (s.x0.dim() != 3 || s.x0.size(0) != s.y.size(0) || s.x0.size(1) != m.slot.size(0) || s.x0.size(2) != d)
    throw std::invalid_argument("x0 must be (B, N, d)");
  if (m.mass.size(0) != s.y.size(1)) throw std::invalid_argument("mass must have one entry per free vertex");
  const int64_t nm = m.muscles.size(0);
  if (nm && (s.activation.dim() != 2 || s.activation.size(0) != s.y.size(0) || s.activation.size(1) != nm))
    throw std::invalid_argument("activation must be (B, M)");
  const int64_t e = m.elements.size(0);
  const bool shared = m.mu.dim() == 1 && m.mu.size(0) == e;
  const bool per_problem = m.mu.dim() == 2 && m.mu.size(0) == s.y.size(0) && m.mu.size(1) == e;
  if (!(shared || per_problem) || m.lam.sizes() != m.mu.sizes() || m.Dm_inv.size(0) != e)
    throw std::invalid_argument("mu and lam must be (E,), or (B, E) with one row per problem, and Dm_inv (E, d, d)");
  if (nm && (m.rest_length.numel() != nm || m.stiffness.numel() != nm))
    throw std::invalid_argument("rest_length and stiffness must have one entry per muscle");
  const int64_t n = m.slot.size(0);
  for (const torch::Tensor* idx : {&m.elements, &m.muscles})
    if (idx->numel() && (idx->min().item<int64_t>() < 0 || idx->max().item<int64_t>() >= n))
      throw std::invalid_argument("element or muscle vertex index out of range");
  if (m.slot.numel() && m.slot.max().item<int64_t>() >= s.y.size(1))
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
  // Each parameter's shape per problem, in enum order; the outputs add a leading B.
  const StepParams<std::vector<int64_t>> shapes{{{{f, d}, {n, d}, {f, d}, {f}, {e, d, d}, {e}, {e}, {nm}, {nm}, {nm},
                                                  {}, {}, {}}}};
  StepParams<torch::Tensor> out;
  for (int k = 0; k < kNumStepParams; ++k) {
    std::vector<int64_t> shape = {b};
    shape.insert(shape.end(), shapes.values[k].begin(), shapes.values[k].end());
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
