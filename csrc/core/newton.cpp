// Newton's method with a backtracking line search; each Newton system solved by truncated CG on
// Hessian-vector products. Vectors are handled as (B, n) rows: B independent problems of n unknowns.
#include "solver.h"

#include <cmath>
#include <limits>
#include <sstream>

namespace diffsoft {

namespace {

torch::Tensor row_norm(const torch::Tensor& a) { return a.square().sum(1).sqrt(); }

double default_rtol(torch::ScalarType t) { return t == torch::kFloat64 ? 1e-8 : 1e-4; }

}  // namespace

void check_options(const SolverOptions& o) {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("invalid solver option: " + what);
  };
  require(std::isfinite(o.atol) && o.atol >= 0, "atol must be finite and >= 0");
  require(std::isfinite(o.rtol) && o.rtol >= 0 && o.rtol < 1, "rtol must be in [0, 1)");
  require(o.max_iter >= 0, "max_iter must be >= 0");
  require(o.cg_rtol > 0 && o.cg_rtol < 1, "cg_rtol must be in (0, 1)");
  require(std::isfinite(o.backward_rtol) && o.backward_rtol > 0 && o.backward_rtol < 1,
          "backward_rtol must be in (0, 1)");
  require(o.ls_c1 > 0 && o.ls_c1 < 0.5, "ls_c1 must be in (0, 0.5)");
  require(o.ls_shrink > 0 && o.ls_shrink < 1, "ls_shrink must be in (0, 1)");
  require(o.ls_max_iter >= 1, "ls_max_iter must be >= 1");
}

torch::Tensor newton_minimize(const EnergyFn& energy, const torch::Tensor& x0, const std::vector<torch::Tensor>& params,
                              const SolverOptions& opt, SolveInfo& info) {
  check_options(opt);
  if (!x0.is_floating_point()) throw std::invalid_argument("x0 must be a floating-point tensor");
  if (opt.batched && x0.dim() < 1) throw std::invalid_argument("batched=True needs x0 with a leading batch dimension");
  if (x0.numel() == 0) throw std::invalid_argument("x0 is empty");
  if (!torch::isfinite(x0).all().item<bool>()) throw std::invalid_argument("x0 has non-finite values");

  const std::vector<int64_t> shape = x0.sizes().vec();
  const int64_t batch = opt.batched ? x0.size(0) : 1;
  const int64_t n = x0.numel() / batch;
  const double rtol = opt.rtol > 0 ? opt.rtol : default_rtol(x0.scalar_type());
  const int64_t cg_max_iter = opt.cg_max_iter > 0 ? opt.cg_max_iter : n;
  // Round-off allowance in the sufficient-decrease test: near the minimum E changes by less than its
  // own rounding error, and an exact Armijo test would then reject every step.
  const double e_noise = 16 * (x0.scalar_type() == torch::kFloat64 ? std::numeric_limits<double>::epsilon()
                                                                    : std::numeric_limits<float>::epsilon());

  std::vector<torch::Tensor> consts;
  consts.reserve(params.size());
  for (const auto& p : params) consts.push_back(p.defined() ? p.detach() : p);

  auto eval = [&](const torch::Tensor& x_rows) {
    torch::NoGradGuard no_grad;
    return energy(x_rows.view(shape), consts);
  };

  info = SolveInfo();
  torch::Tensor x = x0.detach().reshape({batch, n}).clone();
  torch::Tensor g0_norm, threshold, last_g_norm;
  std::ostringstream why;
  for (int64_t it = 0;; ++it) {
    SecondOrderPoint point(energy, x, shape, consts);
    const torch::Tensor& g = point.grad();
    const double e = point.energy().item<double>();
    torch::Tensor g_norm = row_norm(g);
    last_g_norm = g_norm;
    const bool finite = std::isfinite(e) && torch::isfinite(g_norm).all().item<bool>();
    if (it == 0) {
      if (!finite) {
        throw std::invalid_argument(std::string("energy or its gradient is not finite at x0 (energy = ") +
                                    std::to_string(e) + ")");
      }
      g0_norm = g_norm;
      threshold = torch::clamp_min(g0_norm * rtol, opt.atol);
      info.grad_norm_initial = g0_norm.max().item<double>();
    }
    info.energy = e;
    info.iterations = it;
    if (!finite) {
      why << "the gradient is not finite at Newton iteration " << it;
      break;
    }
    info.grad_norm = g_norm.max().item<double>();
    torch::Tensor active = g_norm > threshold;
    if (!active.any().item<bool>()) {
      info.converged = true;
      break;
    }
    if (it == opt.max_iter) {
      torch::Tensor ratio = g_norm / threshold.clamp_min(std::numeric_limits<double>::min());
      why << "max_iter = " << opt.max_iter << " Newton iterations reached with the gradient norm at "
          << ratio.max().item<double>() << " x its tolerance (||g|| = " << info.grad_norm << ", "
          << active.sum().item<int64_t>() << " of " << batch << " problem(s) unconverged)";
      break;
    }

    // Newton direction: H p = -g on the unconverged rows, to a relative tolerance eta (the forcing term).
    torch::Tensor rhs = torch::where(active.unsqueeze(1), -g, torch::zeros_like(g));
    torch::Tensor eta = torch::clamp_max((g_norm / g0_norm.clamp_min(1e-300)).sqrt(), opt.cg_rtol);
    CGResult cg = conjugate_gradient([&](const torch::Tensor& v) { return point.hvp(v); }, rhs, eta * g_norm,
                                     cg_max_iter, /*truncate=*/true);
    info.cg_iterations += cg.iterations;
    info.hvp_count += cg.iterations;
    torch::Tensor p = cg.x;
    double slope = (g * p).sum().item<double>();
    if (!(slope < 0)) {  // CG stalled on a numerically useless direction: fall back to steepest descent
      p = rhs;
      slope = (g * p).sum().item<double>();
    }

    // Backtracking line search on the total energy; non-finite trial energies are rejected.
    double step = 1.0;
    bool accepted = false;
    for (int64_t ls = 0; ls < opt.ls_max_iter; ++ls) {
      torch::Tensor trial = x + step * p;
      const double e_trial = eval(trial).item<double>();
      ++info.line_search_steps;
      if (std::isfinite(e_trial) && e_trial <= e + opt.ls_c1 * step * slope + e_noise * std::abs(e)) {
        x = trial;
        accepted = true;
        break;
      }
      step *= opt.ls_shrink;
    }
    if (!accepted) {
      why << "the line search found no decrease of the energy after " << opt.ls_max_iter
          << " trials at Newton iteration " << it << " (||g|| = " << info.grad_norm << ", tolerance "
          << threshold.max().item<double>() << ")";
      break;
    }
  }

  info.message = info.converged ? "converged" : why.str();
  torch::Tensor row_ok = (last_g_norm <= threshold).cpu();
  info.problem_converged.assign(row_ok.data_ptr<bool>(), row_ok.data_ptr<bool>() + batch);
  if (!info.converged && opt.raise_on_failure) throw ConvergenceError("Newton did not converge: " + info.message);
  return x.view(shape);
}

}  // namespace diffsoft
