// Conjugate gradient over rows of independent systems, matrix-free, optionally preconditioned.
#include "diffsoft/core/solver.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace diffsoft {

namespace {

// ||row||_2 of n values, scale-safe. float rows are summed in double, where no square of a float under- or
// overflows. double rows take the plain sum of squares when the norm lies in [1e6 sqrt(tiny), sqrt(max)] (then
// the sum did not overflow, and the squares that underflowed, each below tiny, change it by at most n tiny /
// ||a||^2 <= n 1e-12, relatively); zero rows, and extreme ones, are scaled by their largest magnitude first,
// as LAPACK's nrm2. A row holding inf has norm inf, one holding NaN (and no inf) NaN.
template <typename S>
double one_row_norm(const S* a, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(a[i]) * double(a[i]);
  double norm = std::sqrt(sum);
  constexpr double lo = 1e6 * 1.4916681462400413e-154;  // 1e6 sqrt(DBL_MIN)
  constexpr double hi = 1.3407807929942596e154;        // sqrt(DBL_MAX)
  if (std::is_same<S, float>::value || (norm > lo && norm < hi)) return norm;
  double scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = std::abs(double(a[i]));
    if (std::isnan(v)) return v;
    scale = std::max(scale, v);
  }
  if (scale == 0 || std::isinf(scale)) return scale;
  sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (double(a[i]) / scale) * (double(a[i]) / scale);
  return scale * std::sqrt(sum);
}

}  // namespace

torch::Tensor row_norm(const torch::Tensor& a) {
  if (!a.device().is_cpu() || a.dim() != 2 ||
      (a.scalar_type() != torch::kFloat64 && a.scalar_type() != torch::kFloat32)) {
    // Other devices: the same computation with tensor ops (a sync for the range test).
    const bool f64 = a.scalar_type() == torch::kFloat64;
    const double lo = 1e6 * std::sqrt(f64 ? std::numeric_limits<double>::min() : std::numeric_limits<float>::min());
    const double hi = std::sqrt(f64 ? std::numeric_limits<double>::max() : std::numeric_limits<float>::max());
    torch::Tensor plain = a.square().sum(1).sqrt();
    if (((plain > lo) & (plain < hi)).all().item<bool>()) return plain;
    torch::Tensor scale = a.abs().amax(1);
    // Zero rows divide by 1; rows with an inf or NaN keep it as their norm (inf / inf would make a NaN of inf).
    torch::Tensor finite = torch::isfinite(scale);
    torch::Tensor safe = torch::where(finite & (scale > 0), scale, torch::ones_like(scale));
    torch::Tensor norm = safe * (a / safe.unsqueeze(1)).square().sum(1).sqrt();
    return torch::where(finite, norm, scale);
  }
  // CPU: one pass per row, no temporaries and no sync (this runs several times per Newton iteration, where
  // the dozen tensor ops above cost more than a small creature's whole Newton step).
  const torch::Tensor c = a.contiguous();
  const int64_t rows = c.size(0), n = c.size(1);
  torch::Tensor out = torch::empty({rows}, c.options());
  AT_DISPATCH_FLOATING_TYPES(c.scalar_type(), "row_norm", [&] {
    const scalar_t* in = c.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    for (int64_t r = 0; r < rows; ++r) o[r] = static_cast<scalar_t>(one_row_norm(in + r * n, n));
  });
  return out;
}

torch::Tensor row_dot(const torch::Tensor& a, const torch::Tensor& b) { return (a * b).sum(1); }

bool step_within(const torch::Tensor& to, const torch::Tensor& from, double eps, const torch::Tensor& rows,
                 const torch::Tensor& except, torch::Tensor& out) {
  if (!to.device().is_cpu() || to.dim() != 2 || to.scalar_type() != from.scalar_type() || !rows.device().is_cpu() ||
      (to.scalar_type() != torch::kFloat64 && to.scalar_type() != torch::kFloat32)) {
    out = rows & except.logical_not() & (row_norm(to - from) <= eps * torch::clamp_min(row_norm(from), 1.0));
    return out.any().item<bool>();
  }
  // CPU: one pass over the rows asked about, no other tensor operation and no sync (this runs every Newton
  // iteration); the difference formed as ATen's subtraction forms it
  const torch::Tensor t = to.contiguous(), f = from.contiguous();
  const torch::Tensor asked = rows.to(torch::kBool).contiguous(), skip = except.to(torch::kBool).contiguous();
  const int64_t count = t.size(0), n = t.size(1);
  out = torch::zeros({count}, t.options().dtype(torch::kBool));
  bool* o = out.data_ptr<bool>();
  const bool* ask = asked.data_ptr<bool>();
  const bool* no = skip.data_ptr<bool>();
  bool any = false;
  AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "step_within", [&] {
    std::vector<scalar_t> diff;
    for (int64_t r = 0; r < count; ++r) {
      if (!ask[r] || no[r]) continue;
      const scalar_t* a = t.data_ptr<scalar_t>() + r * n;
      const scalar_t* b = f.data_ptr<scalar_t>() + r * n;
      diff.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) diff[static_cast<size_t>(i)] = a[i] - b[i];
      o[r] = one_row_norm(diff.data(), n) <= eps * std::max(one_row_norm(b, n), 1.0);
      any = any || o[r];
    }
  });
  return any;
}

namespace {

// a / b where mask, 0 elsewhere (b may be 0 where the mask is off).
torch::Tensor masked_ratio(const torch::Tensor& mask, const torch::Tensor& a, const torch::Tensor& b) {
  return torch::where(mask, a / torch::where(mask, b, torch::ones_like(b)), torch::zeros_like(a));
}

// ||b|| per row, 1 where it is 0 or not finite: what a right-hand side is divided by so that a solve's dot
// products stay near 1 whatever the energy's scale (b ~ 1e-300 would square to 0, b ~ 1e160 to inf).
torch::Tensor rhs_scale(const torch::Tensor& b) {
  torch::Tensor n = row_norm(b);
  if (!n.device().is_cpu() || (n.scalar_type() != torch::kFloat64 && n.scalar_type() != torch::kFloat32))
    return torch::where(torch::isfinite(n) & (n > 0), n, torch::ones_like(n));
  AT_DISPATCH_FLOATING_TYPES(n.scalar_type(), "rhs_scale", [&] {
    scalar_t* v = n.data_ptr<scalar_t>();
    for (int64_t r = 0; r < n.numel(); ++r)
      if (!(std::isfinite(v[r]) && v[r] > 0)) v[r] = 1;
  });
  return n;
}

}  // namespace

CGResult conjugate_gradient(const LinearOperator& apply_a, const torch::Tensor& b, const torch::Tensor& rtol,
                            int64_t max_iter, bool truncate, const LinearOperator& precondition) {
  torch::NoGradGuard no_grad;
  if (!b.defined() || b.dim() != 2 || !b.is_floating_point())
    throw std::invalid_argument("conjugate_gradient: b must be a (B, n) floating-point tensor of right-hand sides");
  if (!rtol.defined() || rtol.dim() != 1 || rtol.size(0) != b.size(0))
    throw std::invalid_argument("conjugate_gradient: rtol must be a (B,) tensor, one tolerance per row of b (B = " +
                                std::to_string(b.size(0)) + ")");
  if (!(rtol >= 0).all().item<bool>())
    throw std::invalid_argument("conjugate_gradient: rtol must be >= 0 (and not NaN)");
  const double eps = b.scalar_type() == torch::kFloat64 ? 1e-14 : 1e-6;
  // A row whose (relative) residual falls below this has met any tolerance round-off allows: beyond it its
  // direction's curvature p.Ap underflows to 0, which would read as H not positive definite.
  const double floor = std::sqrt(b.scalar_type() == torch::kFloat64 ? std::numeric_limits<double>::min()
                                                                     : std::numeric_limits<float>::min());
  const torch::Tensor stop_at = torch::clamp_min(rtol, floor);
  auto apply_m = [&](const torch::Tensor& r) { return precondition ? precondition(r) : r; };
  CGResult out;
  // Solved for b / ||b||, so that the residual is the relative one and the tolerance cannot underflow.
  const torch::Tensor scale = rhs_scale(b).unsqueeze(1);
  torch::Tensor x = torch::zeros_like(b);
  torch::Tensor r = b / scale;
  torch::Tensor z = apply_m(r);
  torch::Tensor p = z;
  torch::Tensor rz = row_dot(r, z);
  torch::Tensor r_norm = row_norm(r);
  torch::Tensor done = r_norm <= stop_at;
  // Rows stopped by non-positive curvature on their very first iteration return the first direction,
  // M^-1 b: a descent direction for -g = b since M is positive definite.
  torch::Tensor fallback = torch::zeros_like(done);
  torch::Tensor indefinite = torch::zeros_like(done);
  const torch::Tensor first = p;
  auto iterate = [&] {  // CG from the current x, r, z, p, rz and done
    while (out.iterations < max_iter && !done.all().item<bool>()) {
      // (finished rows' products are not used: zeroed, so that a row whose H is not finite, or whose right-hand
      // side is 0 where the loss leaves a problem out, cannot turn its own zeros into NaN: 0 x inf)
      torch::Tensor ap = torch::where(done.unsqueeze(1), torch::zeros_like(p), apply_a(p));
      ++out.iterations;
      torch::Tensor pap = row_dot(p, ap);
      // Non-positive curvature, relative to the scale of H: the angle between p and Ap is 90 degrees or more.
      torch::Tensor bad = (pap <= eps * row_norm(p) * row_norm(ap)) & done.logical_not();
      if (bad.any().item<bool>()) {
        out.negative_curvature = true;
        indefinite = indefinite | bad;
        if (truncate && out.iterations == 1) fallback = fallback | bad;
        if (truncate) done = done | bad;
      }
      torch::Tensor active = done.logical_not();
      torch::Tensor alpha = masked_ratio(active, rz, pap).unsqueeze(1);
      x = x + alpha * p;
      r = r - alpha * ap;
      z = apply_m(r);
      torch::Tensor rz_new = row_dot(r, z);
      r_norm = row_norm(r);
      // (a row whose residual is not finite, from a Hessian with NaN or inf entries, stops: its x is no answer,
      // its residual says so, and the other rows go on)
      done = done | (r_norm <= stop_at) | torch::isfinite(r_norm).logical_not();
      torch::Tensor beta = masked_ratio(done.logical_not() & (rz != 0), rz_new, rz);
      p = z + beta.unsqueeze(1) * p;
      rz = rz_new;
    }
  };
  iterate();
  if (!truncate) {
    // The recurrence's residual drifts from the true one, b - A x, by round-off: in float32 it falls far below
    // what float32 resolves while the true residual stalls. A solve to a tolerance (the adjoint's; Newton's are
    // truncated) ends on the true residual, one more product, and restarts from its x (at most twice) where
    // that is above the tolerance and the last run at least halved it.
    const torch::Tensor unit_b = b / scale;
    const torch::Tensor zero_rows = (row_norm(unit_b) == 0).unsqueeze(1);  // x = 0 exactly, whatever H is
    torch::Tensor last = torch::full_like(r_norm, std::numeric_limits<double>::infinity());
    for (int restart = 0;; ++restart) {
      r = torch::where(zero_rows, torch::zeros_like(x), unit_b - apply_a(x));
      r_norm = row_norm(r);
      torch::Tensor again = (r_norm > stop_at) & (r_norm < 0.5 * last) & torch::isfinite(r_norm);
      if (restart == 2 || out.iterations >= max_iter || out.negative_curvature || !again.any().item<bool>()) break;
      last = r_norm;
      done = again.logical_not();
      z = apply_m(r);
      p = torch::where(done.unsqueeze(1), torch::zeros_like(z), z);
      rz = row_dot(r, z);
      iterate();
    }
  }
  if (truncate) x = torch::where(fallback.unsqueeze(1), first, x);
  out.x = x * scale;
  out.indefinite = indefinite;
  out.residual = r_norm;
  out.converged = (out.residual <= stop_at).all().item<bool>() && !out.negative_curvature;
  return out;
}

CGResult solve_rows(const AnalyticDerivatives& point, const torch::Tensor& b_in, const torch::Tensor& rtol,
                    int64_t max_iter, bool truncate, torch::Tensor* direct_rows) {
  torch::NoGradGuard no_grad;
  // Everything below works on b / ||b||: residual norms are then relative ones, on any scale of energy.
  const torch::Tensor scale = rhs_scale(b_in).unsqueeze(1);
  const torch::Tensor b = b_in / scale;
  torch::Tensor direct = torch::zeros({b.size(0)}, b.options().dtype(torch::kBool));
  torch::Tensor x_direct = torch::zeros_like(b);
  if (point.solve) {
    x_direct = point.solve(b);
    direct = torch::isfinite(x_direct).all(1);
  }
  CGResult out;
  if (!direct.all().item<bool>()) {
    torch::Tensor rest = torch::where(direct.unsqueeze(1), torch::zeros_like(b), b);
    out = conjugate_gradient(point.hvp, rest, rtol, max_iter, truncate, point.precondition);
  } else {
    out.x = torch::zeros_like(b);
    out.residual = torch::zeros({b.size(0)}, b.options());
    out.indefinite = torch::zeros_like(direct);
    out.converged = true;
  }
  out.x = torch::where(direct.unsqueeze(1), x_direct, out.x);
  out.indefinite = out.indefinite & direct.logical_not();
  if (direct.any().item<bool>()) {
    // The factorization's residual, measured, and iterative refinement where it is above the tolerance
    // (round-off in the factor grows with H's condition number), kept while it halves the residual.
    const torch::Tensor zero_rows = (row_norm(b) == 0).unsqueeze(1);  // x = 0 exactly, whatever H is
    auto residual = [&](const torch::Tensor& x) {
      return torch::where(zero_rows, torch::zeros_like(x), b - point.hvp(x));
    };
    torch::Tensor r = residual(out.x);
    out.residual = torch::where(direct, row_norm(r), out.residual);
    torch::Tensor refine_rows = direct & (out.residual > rtol);
    for (int k = 0; k < 4 && refine_rows.any().item<bool>(); ++k) {
      torch::Tensor x_try = out.x + torch::where(refine_rows.unsqueeze(1), point.solve(r), torch::zeros_like(r));
      torch::Tensor r_try = residual(x_try);
      torch::Tensor n_try = row_norm(r_try);
      torch::Tensor better = refine_rows & (n_try < 0.5 * out.residual);
      out.x = torch::where(better.unsqueeze(1), x_try, out.x);
      r = torch::where(better.unsqueeze(1), r_try, r);
      out.residual = torch::where(better, n_try, out.residual);
      refine_rows = better & (n_try > rtol);
    }
    // Where round-off still keeps the factor's answer above the tolerance, CG finishes the job from it: its
    // right-hand side is r, so its tolerance is relative to ||r||.
    torch::Tensor polish = direct & (out.residual > rtol);
    if (polish.any().item<bool>()) {
      torch::Tensor fix_rtol = rtol / torch::where(polish, out.residual, torch::ones_like(out.residual));
      CGResult fix = conjugate_gradient(point.hvp, torch::where(polish.unsqueeze(1), r, torch::zeros_like(r)),
                                        fix_rtol, max_iter, /*truncate=*/false, point.precondition);
      out.iterations += fix.iterations;
      out.x = out.x + fix.x;
      out.residual = torch::where(polish, fix.residual * out.residual, out.residual);
    }
    out.converged = out.converged && (out.residual <= rtol).all().item<bool>();
  }
  out.x = out.x * scale;
  if (direct_rows) *direct_rows = direct;
  return out;
}

}  // namespace diffsoft
