// The implicit layer: x* = argmin_x E(x, theta) as an autograd Function whose backward uses the implicit
// function theorem instead of differentiating through Newton's iterations.
#include "diffsoft/core/factor.h"
#include "diffsoft/core/listed.h"
#include "diffsoft/core/timers.h"
#include "diffsoft/core/solver.h"

#include <iomanip>
#include <sstream>

namespace diffsoft {

namespace {

// What the backward needs besides tensors; rides in ctx->saved_data as a capsule.
struct Problem : torch::CustomClassHolder {
  EnergyFn energy;
  SolverOptions options;
  std::vector<int64_t> shape;
  std::shared_ptr<SolveInfo> info;
  std::shared_ptr<const AnalyticEnergy> analytic;
  LinearOperator factor;  // with options.keep_factor: the solve of the forward's last factorization
  bool autograd_hessian = false;  // H from the energy's double backward (a user energy, or probes of it)
  RaiseFn raise_backward;
  std::vector<int64_t> versions;  // of the saved tensors (params, then x*) as the forward left them
  // This solve's forward record, kept for its backward: `info` may be shared with later solves (one record
  // passed to every step of a rollout), whose forwards overwrite it before this backward runs.
  SolveInfo forward;
};

// The problems whose forward solve did not converge and whose gradient is asked for (a nonzero row of
// dL/dx*: a problem a loss leaves out, such as a failed creature a trainer skips, gets no gradient to doubt),
// listed; empty if none.
std::string unsolved_problems(const SolveInfo& info, const torch::Tensor& dl_dx) {
  if (info.converged) return "";
  torch::Tensor unsolved = (dl_dx.abs().amax(1) > 0).cpu();  // the problems the loss reads
  for (int64_t i = 0; i < unsolved.size(0); ++i) {
    if (i < static_cast<int64_t>(info.problem_converged.size()) && info.problem_converged[i]) unsolved[i] = false;
  }
  return listed(unsolved);
}

// Where part of a user energy's second derivative is lost (an op whose backward autograd cannot differentiate,
// beside terms it can: the products still find a graph to x, so SecondOrderPoint::zero_hessian never runs), H
// lacks that part, and so does the implicit gradient, though Newton, led by the true gradient, still finds x*.
// The adjoint lambda shows it for the price of two gradients (five where the first move disagrees): H lambda
// (= dL/dx*, to the adjoint's relative residual) against the gradient's central differences along lambda, over
// moves of two sizes. A smooth energy's differences approach H lambda as the move shrinks (their error falls 4x
// when it halves); a lost part's error stays as it was. Warns, naming the problems (rows) where it stays above a
// tolerance at both sizes, unless the smaller move's forward and backward differences disagree (a kink).
void warn_of_a_lost_second_derivative(const EnergyFn& energy, const torch::Tensor& x_rows, at::IntArrayRef shape,
                                      const std::vector<torch::Tensor>& consts, const torch::Tensor& lambda,
                                      const torch::Tensor& h_lambda, double residual) {
  const bool f64 = x_rows.scalar_type() == torch::kFloat64;
  const torch::Tensor lambda_max = lambda.abs().amax(1, true);
  const torch::Tensor asked = lambda_max.squeeze(1) > 0;
  if (!asked.any().item<bool>()) return;
  // each row's largest component moved by 1e-6 (float32: 3e-3) of its largest |x| (at least 1)
  const torch::Tensor unit = (f64 ? 1e-6 : 3e-3) * x_rows.abs().amax(1, true).clamp_min(1.0) /
                             torch::where(lambda_max > 0, lambda_max, torch::ones_like(lambda_max));
  const torch::Tensor h_norm = row_norm(h_lambda);
  const torch::Tensor h_scale = torch::where(h_norm > 0, h_norm, torch::ones_like(h_norm));
  const double tol = (f64 ? 1e-3 : 5e-2) + residual;
  torch::Tensor kink;  // rows whose forward and backward differences disagree: a kink within the move
  auto mismatch = [&](double size, bool sides) {  // ||central difference - H lambda|| / ||H lambda||, per row
    torch::Tensor t = size * unit;
    const torch::Tensor up = gradient_at(energy, x_rows + t * lambda, shape, consts);
    const torch::Tensor down = gradient_at(energy, x_rows - t * lambda, shape, consts);
    if (sides) {
      const torch::Tensor here = gradient_at(energy, x_rows, shape, consts);
      kink = row_norm((up - here) - (here - down)) / t.squeeze(1) / h_scale > tol;
    }
    return row_norm((up - down) / (2 * t) - h_lambda) / h_scale;
  };
  const torch::Tensor big = mismatch(1.0, false);
  if (!(asked & (big > tol)).any().item<bool>()) return;  // the usual case: two gradients, not five
  const torch::Tensor small = mismatch(0.5, true);
  // A lost part's error stays as it was when the move halves, the same on either side of x*; a kink that both
  // moves cross (contact's, in float32, whose moves are 3e-3 of x: millimetres) makes the sides differ, and is
  // let through (it warned of a lost derivative where the gradient was right)
  const torch::Tensor lost = asked & (big > tol) & (small > tol) & (small > 0.5 * big) & kink.logical_not();
  if (!lost.any().item<bool>()) return;
  std::ostringstream msg;
  msg << "diffsoft: part of the energy's second derivative is lost: at x* its Hessian-vector products differ from "
         "the gradient's change by "
      << std::setprecision(2) << torch::where(lost, small, torch::zeros_like(small)).max().item<double>() * 100
      << "% along the adjoint, alike over moves of two sizes (problem(s) ";
  torch::Tensor rows = torch::nonzero(lost).flatten().cpu();
  for (int64_t k = 0; k < rows.numel() && k < 10; ++k) msg << (k ? ", " : "") << rows[k].item<int64_t>();
  if (rows.numel() > 10) msg << " and " << rows.numel() - 10 << " more";
  msg << "), so the implicit gradient misses that part and is wrong (Newton, led by the gradient, still found x*). "
         "An op in the energy does not differentiate twice: a torch.autograd.Function whose backward is computed "
         "from detached tensors, .numpy() or under torch.no_grad(); write its backward with differentiable torch "
         "ops";
  TORCH_WARN(msg.str());
}

class ImplicitMinimize : public torch::autograd::Function<ImplicitMinimize> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<Problem> problem,
                               const torch::Tensor& x0, at::TensorList params) {
    std::vector<torch::Tensor> ps(params.begin(), params.end());
    torch::Tensor x_star = newton_minimize(problem->energy, x0, ps, problem->options, *problem->info,
                                           problem->analytic.get(),
                                           problem->options.keep_factor ? &problem->factor : nullptr);
    problem->shape = x_star.sizes().vec();
    problem->forward = *problem->info;
    ctx->saved_data["problem"] = c10::IValue::make_capsule(problem);
    ps.push_back(x_star);
    for (const auto& t : ps) problem->versions.push_back(t._version());
    ctx->save_for_backward(ps);
    // The caller's to change in place (x1 += 1 on a step's result): a tensor of its own, neither a view (autograd
    // forbids in-place changes of views made inside a Function) nor the x* the backward keeps.
    return x_star.clone();
  }

  // At the solution, grad_x E(x*(theta), theta) = 0 for all theta. Differentiating this identity:
  //     H dx*/dtheta + d(grad_x E)/dtheta = 0,   H = d^2E/dx^2 at x*.
  // For a loss L(x*), dL/dtheta = dL/dx* . dx*/dtheta = -dL/dx* H^-1 d(grad_x E)/dtheta. With the adjoint
  // lambda solving H lambda = dL/dx* (H is symmetric):
  //     dL/dtheta = -lambda^T d(grad_x E)/dtheta = -d/dtheta [grad_x E(x*, theta) . lambda],
  // one vector-Jacobian product through the graph of grad_x E (or the analytic energy's closed form). The
  // adjoint system is solved like the forward's Newton systems (CG on the same Hessian-vector products, or a
  // factorization); no Newton iteration is replayed, so the backward's memory does not depend on how many
  // iterations the forward took.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    // The engine runs a backward in grad mode exactly when create_graph=True. This backward's gradients carry
    // no graph (the adjoint solve is not differentiated), so a second derivative through it would be silently
    // wrong: refused. Batched gradients (vmap over the backward: is_grads_batched, jacobian(vectorize=True))
    // hold no storage, which the solvers read: refused too. Both messages are the Python backends' as well
    // (diffsoft/_minimize.py).
    if (torch::GradMode::is_enabled()) {
      throw std::runtime_error(
          "diffsoft's implicit backward (diffsoft.minimize, Simulator.step) is first order only: create_graph=True "
          "(and so higher-order gradients, gradgradcheck, Hessians) is not supported; differentiate once, with "
          "create_graph=False");
    }
    if (!grad_outputs[0].has_storage()) {
      throw std::runtime_error(
          "diffsoft's implicit backward takes one gradient at a time: batched gradients (torch.autograd.grad(..., "
          "is_grads_batched=True), torch.autograd.functional.jacobian(vectorize=True)) are not supported; take them "
          "one by one (is_grads_batched=False, jacobian(vectorize=False))");
    }
    PhaseTimer timer(Phase::adjoint);
    auto problem = ctx->saved_data["problem"].toCapsule();
    auto* pb = static_cast<Problem*>(problem.get());
    torch::autograd::variable_list saved = ctx->get_saved_variables();
    // Autograd's own check of in-place changes since the forward, which saved-tensor hooks turn off (the Python
    // layer sets identity hooks around the solve, so that the caller's hooks leave its own graphs alone). Only a
    // later version counts: a caller's hooks may hand back another tensor (a copy, at version 0).
    for (size_t i = 0; i < saved.size() && i < pb->versions.size(); ++i) {
      if (saved[i].defined() && saved[i]._version() > pb->versions[i]) {
        std::ostringstream msg;
        msg << "one of the variables needed for gradient computation has been modified by an inplace operation: "
            << "diffsoft's implicit layer's params[" << i << "] (shape " << saved[i].sizes() << ") is at version "
            << saved[i]._version() << "; expected version " << pb->versions[i]
            << " instead. A solve's inputs (a step's state, a body's fields, a simulator's constants, a collider's "
               "fields) must keep their values until its backward has run: change them after it, or on a copy";
        throw std::runtime_error(msg.str());
      }
    }
    torch::Tensor x_star = saved.back();
    saved.pop_back();

    const SolverOptions& opt = pb->options;
    const int64_t batch = opt.batched ? x_star.size(0) : 1;
    const int64_t n = x_star.numel() / batch;
    torch::Tensor dl_dx = grad_outputs[0].reshape({batch, n});

    // Two copies of the parameters: constants for the adjoint's Hessian-vector products (an energy's graph
    // need not carry parameter derivatives through every product), and leaves for the final product.
    std::vector<torch::Tensor> consts, params, wrt;
    std::vector<size_t> wrt_index;
    for (size_t i = 0; i < saved.size(); ++i) {
      torch::Tensor p = saved[i].detach();
      consts.push_back(p);
      // needs_input_grad counts tensor inputs only (x0 is 0); the returned list counts every input.
      if (ctx->needs_input_grad(1 + i) && p.is_floating_point()) {
        p = p.detach().requires_grad_(true);
        wrt.push_back(p);
        wrt_index.push_back(i);
      }
      params.push_back(p);
    }
    torch::autograd::variable_list grads(2 + saved.size());
    if (wrt.empty()) return grads;

    torch::Tensor x_rows = x_star.detach().reshape({batch, n});
    AnalyticDerivatives point = derivatives_at(pb->energy, pb->analytic.get(), x_rows, pb->shape, consts, opt.batched);
    if (pb->factor) {
      // The forward's last factor, made near x*, solves and preconditions instead of a fresh factorization.
      // Rows where it failed (H not positive definite there) come back non-finite: they keep CG's own
      // preconditioner.
      LinearOperator kept = pb->factor, own = point.precondition;
      point.solve = kept;
      point.precondition = [kept, own](const torch::Tensor& r) {
        torch::Tensor z = kept(r);
        torch::Tensor ok = torch::isfinite(z).all(1, true);
        return torch::where(ok, z, own ? own(r) : r);
      };
    }
    const int64_t max_iter = opt.backward_max_iter > 0 ? opt.backward_max_iter : 10 * n;
    torch::Tensor direct_rows;
    const double rtol = opt.backward_rtol > 0 ? opt.backward_rtol : default_backward_rtol(dl_dx.scalar_type());
    CGResult cg = solve_rows(point, dl_dx, torch::full({batch}, rtol, dl_dx.options()), max_iter,
                             /*truncate=*/false, &direct_rows);

    // The backward's record goes into the caller's (shared) info; what the forward did is this solve's own.
    SolveInfo& info = *pb->info;
    const SolveInfo& forward = pb->forward;
    info.backward_ran = true;
    info.backward_cg_iterations = cg.iterations;
    info.backward_direct = direct_rows.all().item<bool>();
    info.backward_residual = cg.residual.max().item<double>();
    // A gradient taken where the forward stopped short is the derivative of an equation that does not hold
    // there (grad E(x) != 0): the forward's failure is the backward's too.
    const std::string unsolved = unsolved_problems(forward, dl_dx);
    info.backward_converged = cg.converged && unsolved.empty();
    std::ostringstream msg;
    if (!unsolved.empty()) {
      msg << "the forward solve did not converge for problem(s) " << unsolved << " (" << forward.message
          << "): the implicit gradient assumes grad E(x*) = 0, which does not hold there, and is unreliable; the "
             "adjoint solve: ";
    }
    if (cg.negative_curvature) {
      msg << "the Hessian at x* is not positive definite (x* is not a strict minimum); the implicit gradient "
             "is unreliable";
    } else if (!cg.converged) {
      msg << "the adjoint solve's relative residual is " << info.backward_residual
          << " > backward_rtol = " << rtol << " after ";
      const torch::Tensor not_finite = torch::isfinite(cg.residual).logical_not();
      const torch::Tensor bad_loss = torch::isfinite(dl_dx).all(1).logical_not();
      if (bad_loss.any().item<bool>()) {
        msg << "a gradient dL/dx* that is not finite for problem(s) " << listed(bad_loss)
            << " (the loss's, before the solve: not the energy's)";
      } else if (not_finite.any().item<bool>()) {
        msg << "Hessian-vector products that are not finite for problem(s) " << listed(not_finite)
            << ": the energy's second derivatives hold NaN or inf at their x*";
      } else if (info.backward_direct) {
        msg << "a sparse factorization with iterative refinement (H too ill-conditioned for this tolerance)";
      } else {
        msg << cg.iterations << " CG iterations (backward_max_iter = " << max_iter << ")";
      }
      if (dl_dx.scalar_type() == torch::kFloat32) {
        msg << "; in float32, round-off bounds the residual near H's condition number times 1.2e-7: solve in "
               "float64, or loosen backward_rtol";
      }
    } else {
      msg << "converged";
    }
    info.backward_message = msg.str();
    auto fail = [&](const std::string& what) {
      if (opt.raise_on_failure) {
        if (pb->raise_backward) pb->raise_backward(what);
        throw ConvergenceError(what);
      }
      TORCH_WARN("diffsoft: ", what);
    };
    if (!info.backward_converged) {
      fail((unsolved.empty() ? "adjoint solve failed: " : "implicit gradient at an unconverged solve: ") +
           info.backward_message);
    } else if (pb->autograd_hessian) {
      warn_of_a_lost_second_derivative(pb->energy, x_rows, pb->shape, consts, cg.x, dl_dx, info.backward_residual);
    }

    const AnalyticEnergy* analytic = pb->analytic.get();
    std::vector<torch::Tensor> vjp =
        analytic && analytic->mixed_vjp
            ? analytic->mixed_vjp(x_rows, cg.x, wrt_index)
            : SecondOrderPoint(pb->energy, x_rows, pb->shape, params, opt.batched).mixed_vjp(cg.x, wrt);
    bool finite = true;
    for (size_t k = 0; k < wrt.size(); ++k) {
      if (vjp[k].defined()) {
        grads[2 + wrt_index[k]] = -vjp[k];
        finite = finite && torch::isfinite(vjp[k]).all().item<bool>();
      }
    }
    if (!finite && info.backward_converged) {
      // A finite adjoint and a gradient that is not: a problem whose derivatives are not finite at its x*
      // reaches the params through autograd's chain rule even where the loss does not read it (0 x NaN).
      const torch::Tensor rows = torch::isfinite(point.grad).all(1).logical_not();
      std::ostringstream why;
      why << "the implicit gradient with respect to the params is not finite: ";
      if (rows.any().item<bool>()) {
        why << "the energy's gradient is not finite at x* for problem(s) " << listed(rows)
            << ", which autograd carries into the params' gradient (0 x NaN) even where the loss does not read "
               "them: leave them out of the batch, or keep their energy's derivatives finite";
      } else {
        why << "the energy's mixed derivatives d/dparams grad_x E hold NaN or inf at x*";
      }
      info.backward_converged = false;
      info.backward_message = why.str();
      fail(info.backward_message);
    }
    return grads;
  }
};

}  // namespace

torch::Tensor implicit_minimize(EnergyFn energy, const torch::Tensor& x0, const std::vector<torch::Tensor>& params,
                                const SolverOptions& options, std::shared_ptr<SolveInfo> info,
                                std::shared_ptr<const AnalyticEnergy> analytic, const torch::Tensor& sparsity,
                                RaiseFn raise_backward, BatchedVjp batched_vjp) {
  if (!x0.defined()) throw std::invalid_argument("x0 is an undefined tensor");
  const bool autograd_hessian = !analytic;
  if (sparsity.defined() && !analytic) {
    analytic = std::make_shared<AnalyticEnergy>(probed_energy(energy, params, x0.sizes(), options.batched, sparsity,
                                                              std::make_shared<FactorCache>(),
                                                              std::move(batched_vjp), options.probe_batch));
  }
  auto problem = c10::make_intrusive<Problem>();
  problem->analytic = std::move(analytic);
  problem->autograd_hessian = autograd_hessian;
  problem->energy = std::move(energy);
  problem->options = options;
  problem->raise_backward = std::move(raise_backward);
  problem->info = info ? std::move(info) : std::make_shared<SolveInfo>();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (!p.defined()) throw std::invalid_argument("param " + std::to_string(i) + " is an undefined tensor");
    if (p.device() != x0.device()) {
      throw std::invalid_argument("param " + std::to_string(i) + " is on " + p.device().str() + " but x0 is on " +
                                  x0.device().str());
    }
    if (p.is_floating_point() && p.scalar_type() != x0.scalar_type()) {
      throw std::invalid_argument("param " + std::to_string(i) + " has dtype " +
                                  std::string(c10::toString(p.scalar_type())) + " but x0 has dtype " +
                                  std::string(c10::toString(x0.scalar_type())));
    }
  }
  return ImplicitMinimize::apply(problem, x0, at::TensorList(params));
}

}  // namespace diffsoft
