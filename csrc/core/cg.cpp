// Conjugate gradient over rows of independent systems, matrix-free.
#include "solver.h"

namespace diffsoft {

namespace {

torch::Tensor row_dot(const torch::Tensor& a, const torch::Tensor& b) { return (a * b).sum(1); }

}  // namespace

CGResult conjugate_gradient(const std::function<torch::Tensor(const torch::Tensor&)>& apply_a,
                            const torch::Tensor& b, const torch::Tensor& tol, int64_t max_iter, bool truncate) {
  torch::NoGradGuard no_grad;
  const double eps = b.scalar_type() == torch::kFloat64 ? 1e-14 : 1e-6;
  CGResult out;
  torch::Tensor x = torch::zeros_like(b);
  torch::Tensor r = b.clone();
  torch::Tensor p = r.clone();
  torch::Tensor rr = row_dot(r, r);
  torch::Tensor done = rr.sqrt() <= tol;
  // Rows stopped by non-positive curvature on their very first iteration return b (steepest descent).
  torch::Tensor fallback = torch::zeros_like(done);
  while (out.iterations < max_iter && !done.all().item<bool>()) {
    torch::Tensor ap = apply_a(p);
    ++out.iterations;
    torch::Tensor pap = row_dot(p, ap);
    torch::Tensor bad = (pap <= eps * row_dot(p, p)) & done.logical_not();
    if (bad.any().item<bool>()) {
      out.negative_curvature = true;
      if (truncate && out.iterations == 1) fallback = fallback | bad;
      if (truncate) done = done | bad;
    }
    torch::Tensor active = done.logical_not();
    torch::Tensor alpha = torch::where(active, rr / torch::where(active, pap, torch::ones_like(pap)),
                                       torch::zeros_like(rr)).unsqueeze(1);
    x = x + alpha * p;
    r = r - alpha * ap;
    torch::Tensor rr_new = row_dot(r, r);
    done = done | (rr_new.sqrt() <= tol);
    torch::Tensor beta = torch::where(done, torch::zeros_like(rr), rr_new / torch::where(rr > 0, rr, torch::ones_like(rr)));
    p = r + beta.unsqueeze(1) * p;
    rr = rr_new;
  }
  if (truncate) x = torch::where(fallback.unsqueeze(1), b, x);
  out.x = x;
  out.residual_norm = rr.sqrt();
  out.converged = (out.residual_norm <= tol).all().item<bool>() && !out.negative_curvature;
  return out;
}

}  // namespace diffsoft
