// Conjugate gradient over rows of independent systems, matrix-free, optionally preconditioned.
#include "solver.h"

namespace diffsoft {

namespace {

torch::Tensor row_dot(const torch::Tensor& a, const torch::Tensor& b) { return (a * b).sum(1); }

// a / b where mask, 0 elsewhere (b may be 0 where the mask is off).
torch::Tensor masked_ratio(const torch::Tensor& mask, const torch::Tensor& a, const torch::Tensor& b) {
  return torch::where(mask, a / torch::where(mask, b, torch::ones_like(b)), torch::zeros_like(a));
}

}  // namespace

CGResult conjugate_gradient(const LinearOperator& apply_a, const torch::Tensor& b, const torch::Tensor& tol,
                            int64_t max_iter, bool truncate, const LinearOperator& precondition) {
  torch::NoGradGuard no_grad;
  const double eps = b.scalar_type() == torch::kFloat64 ? 1e-14 : 1e-6;
  auto apply_m = [&](const torch::Tensor& r) { return precondition ? precondition(r) : r; };
  CGResult out;
  torch::Tensor x = torch::zeros_like(b);
  torch::Tensor r = b.clone();
  torch::Tensor z = apply_m(r);
  torch::Tensor p = z;
  torch::Tensor rz = row_dot(r, z);
  torch::Tensor rr = row_dot(r, r);
  torch::Tensor done = rr.sqrt() <= tol;
  // Rows stopped by non-positive curvature on their very first iteration return the first direction,
  // M^-1 b: a descent direction for -g = b since M is positive definite.
  torch::Tensor fallback = torch::zeros_like(done);
  const torch::Tensor first = p;
  while (out.iterations < max_iter && !done.all().item<bool>()) {
    torch::Tensor ap = apply_a(p);
    ++out.iterations;
    torch::Tensor pap = row_dot(p, ap);
    // Non-positive curvature, relative to the scale of H: the angle between p and Ap is 90 degrees or more.
    torch::Tensor bad = (pap <= eps * (row_dot(p, p) * row_dot(ap, ap)).sqrt()) & done.logical_not();
    if (bad.any().item<bool>()) {
      out.negative_curvature = true;
      if (truncate && out.iterations == 1) fallback = fallback | bad;
      if (truncate) done = done | bad;
    }
    torch::Tensor active = done.logical_not();
    torch::Tensor alpha = masked_ratio(active, rz, pap).unsqueeze(1);
    x = x + alpha * p;
    r = r - alpha * ap;
    z = apply_m(r);
    torch::Tensor rz_new = row_dot(r, z);
    rr = row_dot(r, r);
    done = done | (rr.sqrt() <= tol);
    torch::Tensor beta = masked_ratio(done.logical_not() & (rz != 0), rz_new, rz);
    p = z + beta.unsqueeze(1) * p;
    rz = rz_new;
  }
  if (truncate) x = torch::where(fallback.unsqueeze(1), first, x);
  out.x = x;
  out.residual_norm = rr.sqrt();
  out.converged = (out.residual_norm <= tol).all().item<bool>() && !out.negative_curvature;
  return out;
}

}  // namespace diffsoft
