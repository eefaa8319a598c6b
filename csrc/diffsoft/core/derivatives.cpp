// Gradients and Hessian-vector products of a scalar energy by torch double backward (matrix-free).
#include "diffsoft/core/solver.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace diffsoft {

namespace {

std::string shape_str(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

const char* const kNoGraph =
    "the energy does not depend on x: its value has no autograd graph to x (a constant, or computed from a "
    "detached copy, .item() or under torch.no_grad()), so every x would be a minimum. Compute it from x "
    "with torch ops";

}  // namespace

SecondOrderPoint::SecondOrderPoint(const EnergyFn& energy, const torch::Tensor& x_rows, at::IntArrayRef shape,
                                   const std::vector<torch::Tensor>& params, bool batched, bool lazy)
    : energy_fn_(energy), shape_(shape.vec()), params_(params) {
  torch::AutoGradMode grad_mode(true);
  x_ = x_rows.detach().requires_grad_(true);
  torch::Tensor e = energy(x_.view(shape), params);
  const bool per_problem = batched && e.defined() && e.dim() == 1 && e.size(0) == x_rows.size(0);
  const bool valid = e.defined() && (e.dim() == 0 || per_problem) && e.is_floating_point();
  if (lazy && e.defined()) {
    // A trial's value is compared as it comes, as a value without a graph would be (its checks, and the refusal
    // of an energy without a graph to x, come where Newton takes the trial and asks for its gradient)
    energy_ = e.detach();
    if (valid && e.requires_grad()) energy_graph_ = e;
    return;
  }
  if (!e.defined() || (e.dim() != 0 && !per_problem)) {
    throw std::invalid_argument(
        "energy must return a 0-dim tensor" +
        std::string(batched ? " (or, with batched=True, one energy per problem, shape [" +
                                  std::to_string(x_rows.size(0)) + "])"
                            : "") +
        ", got " + (e.defined() ? "shape " + shape_str(e) : std::string("an undefined tensor")));
  }
  if (!e.is_floating_point()) throw std::invalid_argument("energy must return a floating-point tensor");
  energy_ = e.detach();
  // An energy with no graph to x would have a zero gradient everywhere, and Newton would report any x as
  // converged: a silent wrong answer, so it is refused.
  if (!e.requires_grad()) throw std::invalid_argument(kNoGraph);
  energy_graph_ = e;
  build_gradient();
}

void SecondOrderPoint::build_gradient() {
  if (grad_graph_.defined()) return;
  if (!energy_graph_.defined()) throw std::invalid_argument(kNoGraph);
  torch::AutoGradMode grad_mode(true);
  grad_graph_ = torch::autograd::grad({energy_graph_.sum()}, {x_}, {}, /*retain_graph=*/true,
                                      /*create_graph=*/true, /*allow_unused=*/true)[0];
  energy_graph_ = torch::Tensor();  // (the gradient's graph holds what it needs of it)
  if (!grad_graph_.defined()) throw std::invalid_argument(kNoGraph);
  grad_ = grad_graph_.detach();
}

torch::Tensor SecondOrderPoint::zero_hessian(const torch::Tensor& v) const {
  if (!linear_checked_) {
    // The gradient's change over moves of 1% and 0.5% of x's scale: 0 for an energy linear in x; growing with the
    // move, at least in proportion, where a second derivative was lost; a jump, or 0, across the kink of a
    // piecewise-linear one (twice the move: the same change, or none).
    const double scale = std::max(1.0, x_.abs().max().item<double>());
    const torch::Tensor direction = 0.01 * scale * torch::linspace(-1.0, 1.0, x_.numel(), x_.options()).view_as(x_);
    auto change = [&](double t) {
      return (gradient_at(energy_fn_, x_.detach() + t * direction, shape_, params_) - grad_).norm().item<double>();
    };
    const double full = change(1.0), half = change(0.5);
    const double tol = (x_.scalar_type() == torch::kFloat64 ? 1e-12 : 1e-5) * grad_.norm().item<double>();
    if (!std::isfinite(full) || (full > tol && half > tol && full > 1.5 * half)) {
      std::ostringstream msg;
      msg << "the energy's second derivative is lost: its gradient changes with x (by " << full
          << " over a move of " << 0.01 * scale << "), yet it has no autograd graph to x, so every Hessian-vector "
          << "product is 0 and Newton's steps and the implicit gradient would be wrong. An op in the energy does "
             "not differentiate twice: a torch.autograd.Function whose backward is computed from detached "
             "tensors, .numpy() or under torch.no_grad(). Write its backward with differentiable torch ops";
      throw std::invalid_argument(msg.str());
    }
    linear_checked_ = true;
  }
  return torch::zeros_like(v);  // E linear (or piecewise linear) in x: H = 0
}

torch::Tensor SecondOrderPoint::hvp(const torch::Tensor& v) const {
  if (!grad_graph_.requires_grad()) return zero_hessian(v);
  torch::AutoGradMode grad_mode(true);
  auto hv = torch::autograd::grad({grad_graph_}, {x_}, {v}, /*retain_graph=*/true, /*create_graph=*/false,
                                  /*allow_unused=*/true)[0];
  // (torch 1.13's derivative of sgn, abs's, is a zero tensor whose data cannot be read: H = 0 there)
  return hv.defined() && !hv._is_zerotensor() ? hv : zero_hessian(v);
}

torch::Tensor SecondOrderPoint::hvps(const torch::Tensor& v, const BatchedVjp& batched_vjp) const {
  if (!grad_graph_.requires_grad()) return zero_hessian(v);
  torch::AutoGradMode grad_mode(true);
  torch::Tensor hv = batched_vjp(grad_graph_, x_, v);
  return hv._is_zerotensor() ? zero_hessian(v) : hv;
}

std::vector<torch::Tensor> SecondOrderPoint::mixed_vjp(const torch::Tensor& w,
                                                       const std::vector<torch::Tensor>& wrt) const {
  if (wrt.empty() || !grad_graph_.requires_grad()) {
    return std::vector<torch::Tensor>(wrt.size());
  }
  torch::AutoGradMode grad_mode(true);
  std::vector<torch::Tensor> out = torch::autograd::grad({grad_graph_}, wrt, {w}, /*retain_graph=*/true,
                                                         /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].defined() && out[i]._is_zerotensor()) out[i] = torch::zeros_like(wrt[i]);  // (as in hvp)
  }
  return out;
}

torch::Tensor gradient_at(const EnergyFn& energy, const torch::Tensor& y_rows, at::IntArrayRef shape,
                          const std::vector<torch::Tensor>& params) {
  torch::AutoGradMode grad_mode(true);
  torch::Tensor y = y_rows.detach().requires_grad_(true);
  torch::Tensor e = energy(y.view(shape), params);
  auto gs = torch::autograd::grad({e.sum()}, {y}, {}, /*retain_graph=*/false, /*create_graph=*/false,
                                  /*allow_unused=*/true);
  return gs[0].defined() ? gs[0].detach() : torch::zeros_like(y);
}

AnalyticDerivatives derivatives_at(const EnergyFn& energy, const AnalyticEnergy* analytic,
                                   const torch::Tensor& x_rows, at::IntArrayRef shape,
                                   const std::vector<torch::Tensor>& params, bool batched) {
  if (analytic) return analytic->derivatives(x_rows);
  return derivatives_of(std::make_shared<SecondOrderPoint>(energy, x_rows, shape, params, batched));
}

AnalyticDerivatives derivatives_of(const std::shared_ptr<SecondOrderPoint>& point) {
  point->build_gradient();
  AnalyticDerivatives out;
  out.energy = point->energy();
  out.grad = point->grad();
  out.hvp = [point](const torch::Tensor& v) { return point->hvp(v); };
  return out;
}

}  // namespace diffsoft
