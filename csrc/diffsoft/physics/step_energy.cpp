// The step energy's fused CPU kernels over a batch: each problem's loops sum the registered terms (terms.h) over
// their stencils' rows. See step_energy.h for the model and the shapes.
#include "diffsoft/physics/step_energy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "diffsoft/core/parallel.h"
#include "diffsoft/physics/kernels.h"
#include "diffsoft/physics/terms.h"

namespace diffsoft {

const std::vector<ColliderKindInfo>& collider_kinds() {
  static const std::vector<ColliderKindInfo> kinds = [] {
    std::vector<ColliderKindInfo> out;
    kernels::ColliderKinds::each([&](auto g) {
      ColliderKindInfo info{decltype(g)::name, {"stiffness", "friction", "friction_eps"}};
      for (const char* p : decltype(g)::params) info.params.push_back(p);
      out.push_back(info);
    });
    return out;
  }();
  return kinds;
}

namespace kernels {

int64_t geometry_rank(int64_t kind, size_t j, int64_t d) {
  int64_t rank = 0;
  ColliderKinds::visit(kind, [&](auto g) { rank = decltype(g)::shape(j, d).rank; });
  return rank;
}

void check_model(const StepModel& m, int64_t f, int64_t d) {
  for (const torch::Tensor* idx : {&m.elements, &m.muscles, &m.slot})
    if (!idx->defined() || idx->scalar_type() != torch::kLong || !idx->device().is_cpu())
      throw std::invalid_argument("the step model's elements, muscles and slot must be int64 CPU tensors");
  if (m.elements.dim() != 2 || m.elements.size(1) != d + 1) throw std::invalid_argument("elements must be (E, d + 1)");
  if (m.muscles.numel() && (m.muscles.dim() != 2 || m.muscles.size(1) != 2))
    throw std::invalid_argument("muscles must be (M, 2), each muscle's two vertices");
  if (m.slot.dim() != 1) throw std::invalid_argument("slot must be (N,), each vertex's free row or -1");
  const int64_t n = m.slot.size(0);
  for (const torch::Tensor* idx : {&m.elements, &m.muscles}) {
    const torch::Tensor t = idx->contiguous();
    const int64_t* p = t.data_ptr<int64_t>();
    for (int64_t k = 0; k < t.numel(); ++k)
      if (p[k] < 0 || p[k] >= n) throw std::invalid_argument("element or muscle vertex index out of range");
  }
  const torch::Tensor slot = m.slot.contiguous();
  const int64_t* s = slot.data_ptr<int64_t>();
  std::vector<char> taken(static_cast<size_t>(std::max<int64_t>(f, 0)), 0);
  int64_t free = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (s[i] >= f) throw std::invalid_argument("slot refers to a free vertex beyond y");
    if (s[i] < -1) throw std::invalid_argument("slot holds " + std::to_string(s[i]) + ": a free row or -1 (fixed)");
    if (s[i] >= 0 && taken[s[i]]++)
      throw std::invalid_argument("slot maps two vertices to free row " + std::to_string(s[i]));
    free += s[i] >= 0;
  }
  if (free != f)
    throw std::invalid_argument("slot maps " + std::to_string(free) + " vertices to y's " + std::to_string(f) +
                                " free rows: each free row must be one vertex's");
  if (m.material < 0 || m.material > 2) throw std::invalid_argument("unknown material code");
}

StepModel contiguous(const StepModel& m) {
  StepModel c = m;
  for (torch::Tensor* t : {&c.elements, &c.muscles, &c.slot, &c.mass, &c.Dm_inv, &c.mu, &c.lam, &c.rest_length,
                           &c.stiffness, &c.h, &c.gravity})
    if (t->defined()) *t = t->contiguous();
  for (Collider& col : c.colliders)
    for (torch::Tensor& t : col.params)
      if (t.defined()) t = t.contiguous();
  return c;
}

namespace {

// The problem's energy, and the sum of its rows' magnitudes into *scale (the value's round-off scale).
template <typename S, int D>
S problem_energy(const View<S, D>& v, const Point<S>& pt, S* scale) {
  S e = 0, magnitude = 0;
  auto add = [&](S row) { e += row, magnitude += std::abs(row); };
  StepTerms::each<Stencil::element>([&](auto term) {
    for (int64_t k = 0; k < v.e; ++k) add(decltype(term)::energy(v, pt, k));
  });
  StepTerms::each<Stencil::muscle>([&](auto term) {
    for (int64_t k = 0; k < v.nm; ++k) add(decltype(term)::energy(v, pt, k));
  });
  for (int64_t i = 0; i < v.n; ++i) {
    const int64_t s = v.slot[i];
    if (s < 0) continue;
    StepTerms::each<Stencil::vertex>([&](auto term) { add(decltype(term)::energy(v, pt, s)); });
    StepTerms::each<Stencil::vertex_collider>([&](auto term) {
      for (size_t c = 0; c < v.colliders.size(); ++c) add(decltype(term)::energy(v, pt, s, c));
    });
  }
  *scale = magnitude;
  return e;
}

template <typename S, int D>
void problem_derivatives(const View<S, D>& v, const Point<S>& pt, S* grad, S* k_el, S* k_mu, S* k_v) {
  constexpr int ND = (D + 1) * D;
  std::fill(grad, grad + v.f * D, S(0));
  std::fill(k_v, k_v + v.f * D * D, S(0));
  // Each row's block is zeroed where its terms add to it: one pass over the blocks instead of two.
  for (int64_t k = 0; k < v.e; ++k) {
    S* block = k_el + k * ND * ND;
    Eigen::Map<Eigen::Matrix<S, ND, ND>>(block).setZero();
    StepTerms::each<Stencil::element>([&](auto term) { decltype(term)::derivatives(v, pt, k, grad, block); });
  }
  for (int64_t k = 0; k < v.nm; ++k) {
    S* block = k_mu + k * 4 * D * D;
    Eigen::Map<Eigen::Matrix<S, 2 * D, 2 * D>>(block).setZero();
    StepTerms::each<Stencil::muscle>([&](auto term) { decltype(term)::derivatives(v, pt, k, grad, block); });
  }
  for (int64_t i = 0; i < v.n; ++i) {
    const int64_t s = v.slot[i];
    if (s < 0) continue;
    S* block = k_v + s * D * D;
    StepTerms::each<Stencil::vertex>([&](auto term) { decltype(term)::derivatives(v, pt, s, grad, block); });
    StepTerms::each<Stencil::vertex_collider>([&](auto term) {
      for (size_t c = 0; c < v.colliders.size(); ++c) decltype(term)::derivatives(v, pt, s, c, grad, block);
    });
  }
}

// One problem's parameter derivatives, added to o (its slices of the outputs): weight * dE/dtheta when dir is
// null, d/dtheta [grad_y E . dir] otherwise.
template <typename S, int D>
void problem_param_grads(const View<S, D>& v, const Point<S>& pt, const S* dir, S weight, const StepParams<S*>& o) {
  StepTerms::each<Stencil::element>([&](auto term) {
    for (int64_t k = 0; k < v.e; ++k) decltype(term)::param_grads(v, pt, k, dir, weight, o);
  });
  StepTerms::each<Stencil::muscle>([&](auto term) {
    for (int64_t k = 0; k < v.nm; ++k) decltype(term)::param_grads(v, pt, k, dir, weight, o);
  });
  for (int64_t i = 0; i < v.n; ++i) {
    const int64_t s = v.slot[i];
    if (s < 0) continue;
    StepTerms::each<Stencil::vertex>([&](auto term) { decltype(term)::param_grads(v, pt, s, dir, weight, o); });
    StepTerms::each<Stencil::vertex_collider>([&](auto term) {
      for (size_t c = 0; c < v.colliders.size(); ++c) decltype(term)::param_grads(v, pt, s, c, dir, weight, o);
    });
  }
}

std::string shape_string(const Shape& shape) {
  std::string out = "(";
  for (int k = 0; k < shape.rank; ++k)
    out += (k ? ", " : "") + (shape.sizes[k] < 0 ? std::string("n") : std::to_string(shape.sizes[k]));
  return out + (shape.rank == 1 ? ",)" : ")");
}

// Whether t is shaped `shape` (shared by the batch) or (batch, *shape) (one per problem), in the dtype of y; an
// extent of -1 in shape is any size >= 2.
bool per_problem_or_shared(const torch::Tensor& t, const Shape& shape, int64_t batch, const torch::Tensor& y) {
  if (!t.defined() || t.scalar_type() != y.scalar_type() || !t.device().is_cpu()) return false;
  auto fits = [&](int lead) {
    if (t.dim() != shape.rank + lead || (lead && t.size(0) != batch)) return false;
    for (int k = 0; k < shape.rank; ++k)
      if (shape.sizes[k] < 0 ? t.size(lead + k) < 2 : t.size(lead + k) != shape.sizes[k]) return false;
    return true;
  };
  return fits(0) || fits(1);
}

// The error for parameter `name` that per_problem_or_shared refused.
std::invalid_argument bad_param(const std::string& name, const Shape& shape, int64_t batch) {
  const bool any = std::find(shape.sizes.begin(), shape.sizes.begin() + shape.rank, -1) != shape.sizes.begin() + shape.rank;
  return std::invalid_argument("StepModel." + name + " must be a CPU tensor of y's dtype, shaped " + shape_string(shape) +
                               " (shared by the batch) or with a leading B = " + std::to_string(batch) +
                               " (one per problem)" + (any ? ", n >= 2" : ""));
}

// Every value of t finite and at least `lo` (strictly above it where `strict`), as Python's Body and Simulator
// require of the same fields; else an invalid_argument naming the field (collider c's where c >= 0), the entry
// and the rule. Runs on every kernel call: no allocation unless it throws.
void check_range(const char* name, const torch::Tensor& t, double lo, bool strict, const char* rule,
                 int64_t collider = -1) {
  if (!t.defined() || t.numel() == 0) return;
  const torch::Tensor c = t.is_contiguous() ? t : t.contiguous();
  AT_DISPATCH_FLOATING_TYPES(c.scalar_type(), "check_range", [&] {
    const scalar_t* v = c.data_ptr<scalar_t>();
    for (int64_t i = 0; i < c.numel(); ++i) {
      const double x = double(v[i]);
      if (std::isfinite(x) && (strict ? x > lo : x >= lo)) continue;
      std::ostringstream what;
      what << "StepModel.";
      if (collider >= 0) what << "colliders[" << collider << "].";
      what << name << " holds " << x << " (flat entry " << i << "): must be " << rule;
      throw std::invalid_argument(what.str());
    }
  });
}

// The model's physical values: masses, muscles' rest lengths and stiffnesses and h positive; mu (weighted by the
// elements' sizes, which can underflow it to 0 in float32), gravity and each collider's contact stiffness,
// friction and friction_eps >= 0 (Python's colliders take a stiffness of 0); lam >= 0 but for the stable
// neo-Hookean (whose lam may be negative: Python checks its bulk modulus); Dm_inv finite. A few values per
// element. A negative mass or h had been taken as given: an energy unbounded below, or a wrong step.
void check_values(const StepModel& m) {
  static const char* const positive = "positive and finite";
  static const char* const nonnegative = ">= 0 and finite";
  constexpr double below_all = -std::numeric_limits<double>::infinity();
  check_range("mass", m.mass, 0, true, positive);
  check_range("mu", m.mu, 0, false, nonnegative);
  if (m.material == 2) check_range("lam", m.lam, below_all, true, "finite");
  else check_range("lam", m.lam, 0, false, ">= 0 and finite for materials 0 and 1 (unbounded below otherwise)");
  check_range("Dm_inv", m.Dm_inv, below_all, true, "finite");
  if (m.muscles.size(0)) {
    check_range("rest_length", m.rest_length, 0, true, positive);
    check_range("stiffness", m.stiffness, 0, true, positive);
  }
  check_range("h", m.h, 0, true, positive);
  check_range("gravity", m.gravity, 0, false, nonnegative);
  static const char* const contact[] = {"stiffness", "friction", "friction_eps"};
  for (size_t c = 0; c < m.colliders.size(); ++c)
    for (size_t j = 0; j < 3; ++j)
      check_range(contact[j], m.colliders[c].params[j], 0, false, nonnegative, static_cast<int64_t>(c));
}

void check(const StepModel& m, const StepState& s) {
  if (!s.y.defined() || s.y.dim() != 3 || (s.y.size(2) != 2 && s.y.size(2) != 3))
    throw std::invalid_argument("y must be (B, F, d) with d = 2 or 3");
  const int64_t d = s.y.size(-1);
  if (!s.y.device().is_cpu()) throw std::invalid_argument("the fused step kernels run on CPU tensors only");
  // The model's indices first: the shapes below are read from them.
  check_model(m, s.y.size(1), d);
  for (const auto& [name, t] : {std::pair<const char*, const torch::Tensor*>{"x0", &s.x0}, {"x0_free", &s.x0_free},
                                {"x_hat", &s.x_hat}, {"activation", m.muscles.numel() ? &s.activation : nullptr}})
    if (t && !t->defined()) throw std::invalid_argument(std::string("StepState.") + name + " is an undefined tensor");
  if (s.x0_free.sizes() != s.y.sizes() || s.x_hat.sizes() != s.y.sizes())
    throw std::invalid_argument("x0_free and x_hat must have the shape of y");
  if (s.x0.dim() != 3 || s.x0.size(0) != s.y.size(0) || s.x0.size(1) != m.slot.size(0) || s.x0.size(2) != d)
    throw std::invalid_argument("x0 must be (B, N, d)");
  const int64_t batch = s.y.size(0), f = s.y.size(1), e = m.elements.size(0), nm = m.muscles.size(0);
  if (nm && (s.activation.dim() != 2 || s.activation.size(0) != batch || s.activation.size(1) != nm))
    throw std::invalid_argument("activation must be (B, M)");
  const std::pair<const char*, const torch::Tensor*> state[] = {
      {"x0", &s.x0}, {"x0_free", &s.x0_free}, {"x_hat", &s.x_hat}, {"activation", nm ? &s.activation : nullptr}};
  for (const auto& [name, t] : state)
    if (t && (t->scalar_type() != s.y.scalar_type() || !t->device().is_cpu()))
      throw std::invalid_argument(std::string(name) + " must be a CPU tensor of y's dtype (" +
                                  std::string(c10::toString(s.y.scalar_type())) + "), got " +
                                  c10::toString(t->scalar_type()));
  // Each parameter: its name, its shape when shared by the batch, and whether it is needed.
  const struct {
    const char* name;
    const torch::Tensor& t;
    Shape shape;
    bool needed;
  } params[] = {{"mass", m.mass, {f}, true},
                {"Dm_inv", m.Dm_inv, {e, d, d}, true},
                {"mu", m.mu, {e}, true},
                {"lam", m.lam, {e}, true},
                {"rest_length", m.rest_length, {nm}, nm > 0},
                {"stiffness", m.stiffness, {nm}, nm > 0},
                {"h", m.h, {}, true},
                {"gravity", m.gravity, {}, true}};
  for (const auto& p : params)
    if ((p.needed || p.t.defined()) && !per_problem_or_shared(p.t, p.shape, batch, s.y))
      throw bad_param(p.name, p.shape, batch);
  for (size_t c = 0; c < m.colliders.size(); ++c) {
    const Collider& col = m.colliders[c];
    const std::string at = "colliders[" + std::to_string(c) + "]";
    if (col.kind < 0 || col.kind >= ColliderKinds::size)
      throw std::invalid_argument("StepModel." + at + ".kind is " + std::to_string(col.kind) +
                                  ", not a collider kind (0 to " + std::to_string(ColliderKinds::size - 1) + ")");
    ColliderKinds::visit(col.kind, [&](auto g) {
      using G = decltype(g);
      if (col.params.size() != 3 + G::params.size())
        throw std::invalid_argument("StepModel." + at + " (a " + G::name + ") has " +
                                    std::to_string(col.params.size()) + " parameters, not " +
                                    std::to_string(3 + G::params.size()));
      static const char* const contact[] = {"stiffness", "friction", "friction_eps"};
      for (size_t j = 0; j < col.params.size(); ++j) {
        const Shape shape = j < 3 ? Shape{} : G::shape(j - 3, d);
        if (!per_problem_or_shared(col.params[j], shape, batch, s.y))
          throw bad_param(at + "." + (j < 3 ? contact[j] : G::params[j - 3]), shape, batch);
      }
    });
  }
  check_values(m);
}

// Calls f(view, b, point) with problem b's view and pointers into the (checked) state, for every problem of
// the batch, in parallel.
template <typename F>
void for_each_state(const StepModel& model, const StepState& state, F&& f) {
  const StepModel m = contiguous(model);
  torch::Tensor y = state.y.contiguous(), x0 = state.x0.contiguous(), x0_free = state.x0_free.contiguous(),
                x_hat = state.x_hat.contiguous();
  torch::Tensor act = m.muscles.size(0) ? state.activation.contiguous() : state.activation;
  dispatch(y, [&](auto s, auto dim) {
    using S = decltype(s);
    constexpr int D = decltype(dim)::value;
    View<S, D> v(m, y.size(0));
    for_each_in_batch(y.size(0), v.kernel_ns(), [&](int64_t b) {
      const Point<S> pt{y.data_ptr<S>() + b * v.f * D, x0.data_ptr<S>() + b * v.n * D,
                        x0_free.data_ptr<S>() + b * v.f * D, x_hat.data_ptr<S>() + b * v.f * D,
                        v.nm ? act.data_ptr<S>() + b * v.nm : nullptr};
      f(v.problem(b), b, pt);
    });
  });
}

}  // namespace
}  // namespace kernels

torch::Tensor step_energy_value(const StepModel& model, const StepState& state, torch::Tensor* scale) {
  kernels::check(model, state);
  torch::Tensor out = torch::empty({state.y.size(0)}, state.y.options());
  torch::Tensor magnitudes = torch::empty_like(out);
  kernels::for_each_state(model, state, [&](const auto& v, int64_t b, const auto& pt) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    out.data_ptr<S>()[b] = kernels::problem_energy(v, pt, magnitudes.data_ptr<S>() + b);
  });
  if (scale) *scale = magnitudes;
  return out;
}

StepDerivatives step_energy_derivatives(const StepModel& model, const StepState& state) {
  kernels::check(model, state);
  const torch::Tensor& y = state.y;
  const int64_t batch = y.size(0), f = y.size(1), d = y.size(-1), e = model.elements.size(0),
                nm = model.muscles.size(0);
  StepDerivatives out;
  out.grad = torch::empty(y.sizes(), y.options());
  out.element_blocks = torch::empty({batch, e, (d + 1) * d, (d + 1) * d}, y.options());
  out.muscle_blocks = torch::empty({batch, nm, 2 * d, 2 * d}, y.options());
  out.vertex_blocks = torch::empty({batch, f, d, d}, y.options());
  kernels::for_each_state(model, state, [&](const auto& v, int64_t b, const auto& pt) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    constexpr int D = std::decay_t<decltype(v)>::dim, ND = (D + 1) * D;
    kernels::problem_derivatives(v, pt, out.grad.data_ptr<S>() + b * v.f * D,
                                 out.element_blocks.data_ptr<S>() + b * e * ND * ND,
                                 out.muscle_blocks.data_ptr<S>() + b * nm * 4 * D * D,
                                 out.vertex_blocks.data_ptr<S>() + b * v.f * D * D);
  });
  return out;
}

StepParams<torch::Tensor> step_energy_param_grads(const StepModel& model, const StepState& state,
                                                  const torch::Tensor& weight, const torch::Tensor& dir) {
  kernels::check(model, state);
  const torch::Tensor& y = state.y;
  const bool mixed = dir.defined();
  if (mixed && weight.defined())
    throw std::invalid_argument("give weight (the energies' weights) or dir (a direction for the gradient's "
                                "product), not both");
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
      case StepParam::h:
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
  // A collider's: its shape per problem (the parameter's, without its leading B where it is per problem).
  for (const Collider& col : model.colliders) {
    std::vector<torch::Tensor> grads;
    for (size_t j = 0; j < col.params.size(); ++j) {
      const int64_t rank = j < 3 ? 0 : kernels::geometry_rank(col.kind, j - 3, d);
      std::vector<int64_t> shape = {b};
      const torch::Tensor& t = col.params[j];
      for (int64_t k = t.dim() - rank; k < t.dim(); ++k) shape.push_back(t.size(k));
      grads.push_back(torch::zeros(shape, y.options()));
    }
    out.colliders.push_back(grads);
  }
  torch::Tensor w = mixed ? torch::Tensor() : weight.contiguous();
  torch::Tensor dr = mixed ? dir.contiguous() : torch::Tensor();
  kernels::for_each_state(model, state, [&](const auto& v, int64_t p, const auto& pt) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    StepParams<S*> o;  // this problem's slices
    for (int k = 0; k < kNumStepParams; ++k)
      o.values[k] = out.values[k].data_ptr<S>() + p * (out.values[k].numel() / b);
    for (const auto& grads : out.colliders) {
      o.colliders.emplace_back();
      for (const torch::Tensor& g : grads) o.colliders.back().push_back(g.data_ptr<S>() + p * (g.numel() / b));
    }
    kernels::problem_param_grads(v, pt, mixed ? dr.data_ptr<S>() + p * f * d : nullptr,
                                 mixed ? S(1) : w.data_ptr<S>()[p], o);
  });
  return out;
}

}  // namespace diffsoft
