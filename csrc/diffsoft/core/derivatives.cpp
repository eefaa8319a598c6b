// Gradients and Hessian-vector products of a scalar energy by torch double backward (matrix-free).
#include "diffsoft/core/solver.h"

#include <sstream>

namespace diffsoft {

namespace {

std::string shape_str(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

}  // namespace

SecondOrderPoint::SecondOrderPoint(const EnergyFn& energy, const torch::Tensor& x_rows, at::IntArrayRef shape,
                                   const std::vector<torch::Tensor>& params, bool batched) {
  torch::AutoGradMode grad_mode(true);
  x_ = x_rows.detach().requires_grad_(true);
  torch::Tensor e = energy(x_.view(shape), params);
  const bool per_problem = batched && e.defined() && e.dim() == 1 && e.size(0) == x_rows.size(0);
  if (!e.defined() || (e.dim() != 0 && !per_problem)) {
    throw std::invalid_argument(
        "energy must return a 0-dim tensor" +
        std::string(batched ? " (or, with batched=True, one energy per problem, shape [" +
                                  std::to_string(x_rows.size(0)) + "])"
                            : "") +
        ", got " + (e.defined() ? "shape " + shape_str(e) : std::string("an undefined tensor")));
  }
  if (!e.is_floating_point()) throw std::invalid_argument("energy must return a floating-point tensor");
  // An energy with no graph to x would have a zero gradient everywhere, and Newton would report any x as
  // converged: a silent wrong answer, so it is refused.
  const char* no_graph =
      "the energy does not depend on x: its value has no autograd graph to x (a constant, or computed from a "
      "detached copy, .item() or under torch.no_grad()), so every x would be a minimum. Compute it from x "
      "with torch ops";
  if (!e.requires_grad()) throw std::invalid_argument(no_graph);
  grad_graph_ = torch::autograd::grad({e.sum()}, {x_}, {}, /*retain_graph=*/true, /*create_graph=*/true,
                                      /*allow_unused=*/true)[0];
  if (!grad_graph_.defined()) throw std::invalid_argument(no_graph);
  energy_ = e.detach();
  grad_ = grad_graph_.detach();
}

torch::Tensor SecondOrderPoint::hvp(const torch::Tensor& v) const {
  if (!grad_graph_.requires_grad()) return torch::zeros_like(v);  // E linear in x: H = 0
  torch::AutoGradMode grad_mode(true);
  auto hv = torch::autograd::grad({grad_graph_}, {x_}, {v}, /*retain_graph=*/true, /*create_graph=*/false,
                                  /*allow_unused=*/true)[0];
  return hv.defined() ? hv : torch::zeros_like(v);
}

torch::Tensor SecondOrderPoint::hvps(const torch::Tensor& v, const BatchedVjp& batched_vjp) const {
  if (!grad_graph_.requires_grad()) return torch::zeros_like(v);
  torch::AutoGradMode grad_mode(true);
  return batched_vjp(grad_graph_, x_, v);
}

std::vector<torch::Tensor> SecondOrderPoint::mixed_vjp(const torch::Tensor& w,
                                                       const std::vector<torch::Tensor>& wrt) const {
  if (wrt.empty() || !grad_graph_.requires_grad()) {
    return std::vector<torch::Tensor>(wrt.size());
  }
  torch::AutoGradMode grad_mode(true);
  return torch::autograd::grad({grad_graph_}, wrt, {w}, /*retain_graph=*/true, /*create_graph=*/false,
                               /*allow_unused=*/true);
}

AnalyticDerivatives derivatives_at(const EnergyFn& energy, const AnalyticEnergy* analytic,
                                   const torch::Tensor& x_rows, at::IntArrayRef shape,
                                   const std::vector<torch::Tensor>& params, bool batched) {
  if (analytic) return analytic->derivatives(x_rows);
  auto point = std::make_shared<SecondOrderPoint>(energy, x_rows, shape, params, batched);
  AnalyticDerivatives out;
  out.energy = point->energy();
  out.grad = point->grad();
  out.hvp = [point](const torch::Tensor& v) { return point->hvp(v); };
  return out;
}

}  // namespace diffsoft
