// Newton's method with a backtracking line search; each Newton system solved by truncated CG on
// Hessian-vector products. Vectors are handled as (B, n) rows: B independent problems of n unknowns.
#include "diffsoft/core/listed.h"
#include "diffsoft/core/timers.h"
#include "diffsoft/core/solver.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace diffsoft {

namespace {

double default_rtol(torch::ScalarType t) { return t == torch::kFloat64 ? 1e-8 : 1e-4; }

// reuse_factor's cost model: what a new factorization and one CG iteration on the stale factor cost, estimated
// from the factor's counts alone (FactorCounts), in nanoseconds of one loaded core of the machine it was
// calibrated on (only the ratio of the two matters). Counts, not timings, so that the budget below, and with it
// every iterate, is the same on every run. Calibrated once (commit d6edee9 and this change, 1 thread, load
// average 7-8 on 2 cores) from the seconds Newton's loop measured beside the counts (the timed rule this
// replaced, printed for the purpose, every try given 10 iterations) over sheets of 10x10 to 70x70 vertices under
// shear, twist and impact, one and eight bipeds, and 3D boxes of 12x3x3 to 24x6x6 cells. Against the fastest
// of each case's samples the estimates are 0.4-1.5x for factorizations (median 0.7; 0.13x for a 3D box's
// simplicial one, which orders each matrix anew) and 0.6-1.4x for CG iterations: the budgets err low. Since
// commit 37996ed simplicial factors are CHOLMOD's, about 0.4 ns per flop on that machine: on 2D meshes the
// estimate now errs high, and so do the budgets (benchmarks/README.md, the 40x40 sheet under gravity).
constexpr double kFactorizationCall = 1e5;       // assembly, one solve, and the calls around them
constexpr double kFactorizationPerFlop = 0.8;    // CHOLMOD's supernodal flops on 3D meshes; dense and simplicial
constexpr double kSupernodalPerUnknown = 2.8e3;  // CHOLMOD's small supernodes on 2D meshes: 3 ns/flop there
constexpr double kIterationCall = 5e4;           // CG's dozen tensor ops and the preconditioner's calls
constexpr double kSolvePerEntry = 2.3;           // two triangular sweeps, per stored entry of L
constexpr double kProductPerNonzero = 3.0;       // the Hessian-vector product, per nonzero of H's lower triangle
// A budget below this is not tried: a factorization then costs a few CG iterations (creatures, sheets up to
// about 20x20 vertices), and CG's inexact step can cost a Newton iteration more (the quadruped of
// benchmarks/step_speed.py, at a budget of 2: 5 Newton iterations instead of 3, a step 1.9x slower).
constexpr int64_t kMinReuseIterations = 4;

// How many iterations CG on the stale factor gets before the problems where it has not converged are factored
// again: half of what a factorization costs over what an iteration costs, so that a failed try costs at most
// half a factorization more than factoring at once. Where the factor was made from probes (minimize's
// sparsity= path, which does not count its factor), at least half the probes per factorization: each CG
// iteration costs one more Hessian-vector product of the same kind.
int64_t reuse_budget(const AnalyticDerivatives& point) {
  const FactorCounts c = point.factor_counts ? point.factor_counts() : FactorCounts();
  const double factorization = kFactorizationCall + kFactorizationPerFlop * c.flops +
                               (c.supernodal ? kSupernodalPerUnknown * double(c.n) : 0.0);
  const double iteration = kIterationCall + kSolvePerEntry * c.nnz_l + kProductPerNonzero * c.nnz_a;
  const int64_t made = point.factorizations ? point.factorizations() : 0;
  const double probes = made > 0 && point.probes ? double(point.probes()) / double(made) : 0.0;
  return static_cast<int64_t>(std::max(c.n > 0 ? 0.5 * factorization / iteration : 0.0, 0.5 * probes));
}

// M^-1 r by an older factorization where it is positive definite, by `own` (or the identity) on its other rows.
LinearOperator by_factor(const LinearOperator& factor, const LinearOperator& own) {
  return [factor, own](const torch::Tensor& r) {
    torch::Tensor z = factor(r);
    torch::Tensor ok = torch::isfinite(z).all(1, true);
    return torch::where(ok, z, own ? own(r) : r);
  };
}

// A fixed right-hand side on the rows marked in `rows` (B,), zero on the others, (B, n) like `like`: deterministic
// (the same iterates on every run), every component non-zero and unlike its neighbours' (so that it is no colour's
// probe, whose H^-1 a factor of another matrix can solve exactly).
torch::Tensor probe_rhs(const torch::Tensor& rows, const torch::Tensor& like) {
  torch::Tensor b = torch::cos(torch::arange(like.size(1), like.options()) * 2.4 + 0.3).add(1.5).unsqueeze(0);
  return b.expand_as(like) * rows.unsqueeze(1).to(like.scalar_type());
}

// Directions of negative curvature of H on the rows marked in `rows` (B,), (B, n) like `like`: plain CG on a
// fixed right-hand side with every component, whose search directions span the Krylov spaces in which Lanczos
// finds H's extreme eigenvalues first; a row's first direction p with p^T H p < 0 (beyond round-off, relative to
// |p| |H p|) is one. Zero rows where none is met before CG converges or within max_iter products: H is then
// positive (semi)definite on the space CG explored (which can miss a small negative eigenvalue among large ones).
torch::Tensor negative_curvature(const LinearOperator& hvp, const torch::Tensor& rows, const torch::Tensor& like,
                                 int64_t max_iter, int64_t& products) {
  const double eps = like.scalar_type() == torch::kFloat64 ? 1e-10 : 1e-4;
  torch::Tensor r = probe_rhs(rows, like);
  torch::Tensor p = r.clone();
  torch::Tensor rr = row_dot(r, r);
  const torch::Tensor b_norm = rr.sqrt();
  torch::Tensor found = torch::zeros_like(like);
  torch::Tensor done = rows.logical_not();
  for (int64_t k = 0; k < max_iter && !done.all().item<bool>(); ++k) {
    torch::Tensor ap = hvp(p);
    ++products;
    torch::Tensor pap = row_dot(p, ap);
    torch::Tensor neg = (pap < -eps * row_norm(p) * row_norm(ap)) & done.logical_not();
    found = torch::where(neg.unsqueeze(1), p, found);
    done = done | neg | (pap <= 0);  // zero curvature: CG cannot go on (H singular along p)
    torch::Tensor alpha = torch::where(done, torch::zeros_like(pap), rr / torch::where(done, torch::ones_like(pap), pap));
    r = r - alpha.unsqueeze(1) * ap;
    torch::Tensor rr_next = row_dot(r, r);
    done = done | (rr_next.sqrt() <= eps * b_norm);
    p = r + (rr_next / torch::where(rr > 0, rr, torch::ones_like(rr))).unsqueeze(1) * p;
    rr = rr_next;
  }
  return found;
}

// The first dip's trial steps, a factor `ratio` apart from the shortest, `trials` of them up to 1: Newton's
// ls_shrink, or 0.5 where that is coarser (0.02 stepped over whole wells); ls_max_iter of them, or fewer where the
// shortest would be below the dtype's epsilon (a move x cannot resolve, or a step that underflows to 0).
struct DipLadder {
  double ratio;
  int64_t trials;
  double shortest() const { return std::pow(ratio, double(trials - 1)); }  // (of 1)
};
DipLadder dip_ladder(const SolverOptions& opt, torch::ScalarType t) {
  const double eps = t == torch::kFloat64 ? std::numeric_limits<double>::epsilon()
                                          : std::numeric_limits<float>::epsilon();
  const double ratio = std::max(opt.ls_shrink, 0.5);
  // (1e-9: where ratio is a power of eps, e.g. 0.5, its exact count, not one fewer by the logs' round-off)
  const int64_t resolved = 1 + static_cast<int64_t>(std::floor(std::log(eps) / std::log(ratio) + 1e-9));
  return {ratio, std::min<int64_t>(opt.ls_max_iter, resolved)};
}

}  // namespace

double default_backward_rtol(torch::ScalarType t) { return t == torch::kFloat64 ? 1e-10 : 1e-5; }

void check_options(const SolverOptions& o) {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("invalid solver option: " + what);
  };
  require(std::isfinite(o.atol) && o.atol >= 0, "atol must be finite and >= 0");
  require(std::isfinite(o.rtol) && o.rtol >= 0 && o.rtol < 1, "rtol must be in [0, 1)");
  require(o.max_iter >= 0, "max_iter must be >= 0");
  require(o.cg_rtol > 0 && o.cg_rtol < 1, "cg_rtol must be in (0, 1)");
  require(std::isfinite(o.backward_rtol) && o.backward_rtol >= 0 && o.backward_rtol < 1,
          "backward_rtol must be in [0, 1) (0: by dtype)");
  require(o.ls_c1 > 0 && o.ls_c1 < 0.5, "ls_c1 must be in (0, 0.5)");
  require(o.ls_shrink > 0 && o.ls_shrink < 1, "ls_shrink must be in (0, 1)");
  require(o.ls_max_iter >= 1, "ls_max_iter must be >= 1");
  require(o.probe_batch >= 0, "probe_batch must be >= 0 (0: measured)");
}

torch::Tensor newton_minimize(const EnergyFn& energy, const torch::Tensor& x0, const std::vector<torch::Tensor>& params,
                              const SolverOptions& opt, SolveInfo& info, const AnalyticEnergy* analytic,
                              LinearOperator* last_solve) {
  PhaseTimer timer(Phase::newton);
  check_options(opt);
  if (!x0.defined()) throw std::invalid_argument("x0 is an undefined tensor");
  if (x0.scalar_type() != torch::kFloat64 && x0.scalar_type() != torch::kFloat32)
    throw std::invalid_argument("x0 must be a float32 or float64 tensor (the dtypes the solver runs in), got " +
                                std::string(c10::toString(x0.scalar_type())));
  if (opt.batched && x0.dim() < 1) throw std::invalid_argument("batched=True needs x0 with a leading batch dimension");
  if (x0.numel() == 0) throw std::invalid_argument("x0 is empty");
  if (!torch::isfinite(x0).all().item<bool>()) throw std::invalid_argument("x0 has non-finite values");

  const std::vector<int64_t> shape = x0.sizes().vec();
  const int64_t batch = opt.batched ? x0.size(0) : 1;
  const int64_t n = x0.numel() / batch;
  const double rtol = opt.rtol > 0 ? opt.rtol : default_rtol(x0.scalar_type());
  const int64_t cg_max_iter = opt.cg_max_iter > 0 ? opt.cg_max_iter : n;
  // Round-off allowance in the sufficient-decrease test: near the minimum E changes by less than its
  // own rounding error, and an exact Armijo test would then reject every step. Relative to the energy's
  // round-off scale (AnalyticDerivatives::energy_scale, the sum of its terms' magnitudes; else |E|).
  const double e_noise = 16 * (x0.scalar_type() == torch::kFloat64 ? std::numeric_limits<double>::epsilon()
                                                                    : std::numeric_limits<float>::epsilon());

  std::vector<torch::Tensor> consts;
  consts.reserve(params.size());
  for (const auto& p : params) consts.push_back(p.defined() ? p.detach() : p);

  // Energies as (G,) groups: one per problem when the energy returns them (G = B), else the total (G = 1).
  auto groups = [&](const torch::Tensor& e) { return e.dim() == 0 ? e.reshape({1}) : e; };
  auto eval = [&](const torch::Tensor& x_rows) {
    torch::NoGradGuard no_grad;
    return groups(analytic ? analytic->value(x_rows) : energy(x_rows.view(shape), consts));
  };

  // Trial steps along d from x for the groups marked in `rows` ((G,), like e), a factor 1 / r apart
  // (dip_ladder), T of them at most, from `first` ((G,)) up to 1 of d. A group takes the line's first dip: the
  // last trial of its first run of decreases below e, not any lower point (trials a factor 1 / r apart can step
  // over a well narrower than that: from the shortest trial of a d as long as x, few), or 1 if the energy still
  // falls there. A group marked in `whole` (a long Newton step) stops its run at its first rise even before a
  // decrease, but goes on up to 1, and where the energy along the trials never falls again after rising (one
  // valley: a convex line's), takes the longest trial with Armijo's decrease (slope: (G,), g . d) instead, as
  // backtracking from 1 would (Newton's full step where it holds). A group that no trial moved keeps x (`moved`
  // receives the groups that moved, `rose` those where a trial rose).
  torch::Tensor tried;  // (G,) the trials each group's line search took this iteration (for the message)
  auto ladder_search = [&](const torch::Tensor& x, const torch::Tensor& d, const torch::Tensor& e,
                           const torch::Tensor& e_scale, const torch::Tensor& rows, const torch::Tensor& first,
                           const torch::Tensor& whole, const torch::Tensor& slope, bool per_problem,
                           torch::Tensor& moved, torch::Tensor& rose, bool first_rise_ends = false) {
    auto by_row = [&](const torch::Tensor& t) { return (per_problem ? t : t.expand({batch})).unsqueeze(1); };
    const DipLadder ladder = dip_ladder(opt, x.scalar_type());
    const double inf = std::numeric_limits<double>::infinity();
    const torch::Tensor noise = e_noise * e_scale;
    torch::Tensor step = first.clone();
    torch::Tensor dipping = rows.clone();  // in the first run of decreases
    torch::Tensor going = rows.clone();    // still taking trials
    torch::Tensor lowered = torch::zeros_like(rows), fell_again = torch::zeros_like(rows);
    torch::Tensor armijo = torch::zeros_like(rows);
    rose = torch::zeros_like(rows);
    torch::Tensor best = e.clone(), last = e.clone();
    torch::Tensor x_dip = x.clone(), x_armijo = x.clone();
    for (int64_t ls = 0; ls < ladder.trials && going.any().item<bool>(); ++ls) {
      torch::Tensor trial = x + by_row(step) * d;
      torch::Tensor e_trial = eval(trial);
      ++info.line_search_steps;
      tried += going.to(torch::kLong);
      torch::Tensor finite = torch::isfinite(e_trial);
      // (a trial within round-off of the best neither moves nor ends the run: in float32 the shortest trials'
      // changes are below it)
      torch::Tensor lower = finite & (e_trial < best - noise) & dipping;
      torch::Tensor up = (finite.logical_not() | (e_trial > last + noise)) & going;
      x_dip = torch::where(by_row(lower), trial, x_dip);
      best = torch::where(lower, e_trial, best);
      fell_again = fell_again | (rose & finite & (e_trial < last - noise) & going);
      torch::Tensor ok = finite & (e_trial <= e + opt.ls_c1 * step * slope + noise) & going & whole;
      x_armijo = torch::where(by_row(ok), trial, x_armijo);
      armijo = armijo | ok;
      rose = rose | up;
      last = torch::where(going, torch::where(finite, e_trial, torch::full_like(e_trial, inf)), last);
      // the first run: after a decrease, until a trial rises (a long step's, at its first rise)
      dipping = dipping & (up & (lowered | whole | first_rise_ends)).logical_not();
      lowered = lowered | lower;
      step = step / ladder.ratio;
      const torch::Tensor in_reach = step <= 1 / std::sqrt(ladder.ratio);  // (1, as round-off leaves it)
      dipping = dipping & in_reach;
      going = (dipping | (whole & rows)) & in_reach;
    }
    const torch::Tensor by_armijo = whole & fell_again.logical_not();
    moved = torch::where(by_armijo, armijo, lowered);
    return torch::where(by_row(by_armijo), x_armijo, x_dip);
  };

  info = SolveInfo();
  torch::Tensor x = x0.detach().reshape({batch, n}).clone();
  torch::Tensor g0_norm, threshold, g_norm;
  torch::Tensor failed = torch::zeros({batch}, torch::TensorOptions().dtype(torch::kBool).device(x0.device()));
  const double ulp = x0.scalar_type() == torch::kFloat64 ? std::numeric_limits<double>::epsilon()
                                                         : std::numeric_limits<float>::epsilon();
  std::ostringstream why;
  // opt.reuse_factor: the last factorization's solve, and how many CG iterations on it are worth a try.
  LinearOperator stale;
  int64_t reuse_iter = 0;
  bool probed = false;  // for negative curvature at a stationary start
  int64_t probe_factorizations = 0;
  // By autograd, the backtracking's last trial, evaluated with its graph: where Newton takes it (every row, as
  // it mostly does), the next iteration builds its gradient from that forward instead of evaluating again.
  std::shared_ptr<SecondOrderPoint> last_trial;
  for (int64_t it = 0;; ++it) {
    const bool reuse = last_trial && last_trial->has_graph() && torch::equal(last_trial->x(), x);
    AnalyticDerivatives point = reuse ? derivatives_of(last_trial)
                                      : derivatives_at(energy, analytic, x, shape, consts, opt.batched);
    last_trial.reset();
    const torch::Tensor& g = point.grad;
    const torch::Tensor e = groups(point.energy);
    tried = torch::zeros(e.sizes(), e.options().dtype(torch::kLong));  // (the stationary probe's too; reset below)
    const torch::Tensor e_scale = point.energy_scale.defined() ? groups(point.energy_scale) : e.abs();
    const bool per_problem = e.size(0) == batch && batch > 1;
    g_norm = row_norm(g);
    torch::Tensor row_finite = torch::isfinite(g_norm) & (per_problem ? torch::isfinite(e) : torch::isfinite(e).expand({batch}));
    if (it == 0) {
      if (!row_finite.all().item<bool>()) {
        throw std::invalid_argument("energy or its gradient is not finite at x0 (energy = " +
                                    std::to_string(e.sum().item<double>()) + ", problem(s) " +
                                    listed(row_finite.logical_not()) + ")");
      }
      g0_norm = g_norm;
      threshold = torch::clamp_min(g0_norm * rtol, opt.atol);
      info.grad_norm_initial = g0_norm.max().item<double>();
    }
    if (it == 0 && !probed) {
      // A start that is already stationary stops Newton at once, and a saddle or maximum there (zeros on a
      // symmetry plane, a straight chain under compression) would be returned as a minimum. Where H has
      // negative curvature there, a step along it that lowers the energy, and Newton starts again from it.
      probed = true;
      torch::Tensor still = g_norm <= threshold;
      if (still.any().item<bool>() && point.solve) {
        // A factorization says where H is positive definite: where it solves H z = b, as one product measures
        // (a factor of another matrix, such as a sparsity pattern that misses couplings makes, says nothing).
        torch::Tensor b = probe_rhs(still, g);
        torch::Tensor z = point.solve(b);
        probe_factorizations = point.factorizations ? point.factorizations() : 0;
        info.factorizations += probe_factorizations;
        torch::Tensor finite = torch::isfinite(z).all(1);
        torch::Tensor hz = point.hvp(torch::where(finite.unsqueeze(1), z, torch::zeros_like(z)));
        ++info.hvp_count;
        const double tol = x.scalar_type() == torch::kFloat64 ? 1e-6 : 1e-2;
        still = still & (finite & (row_norm(hz - b) <= tol * row_norm(b))).logical_not();
        // Where no row moves, this point is x*: its factorization is the backward's (a later one replaces it).
        if (last_solve) *last_solve = point.solve;
      }
      if (still.any().item<bool>()) {
        int64_t products = 0;
        torch::Tensor d = negative_curvature(point.hvp, still, g, std::min(cg_max_iter, n), products);
        info.hvp_count += products;
        torch::Tensor d_norm = row_norm(d);
        torch::Tensor has = d_norm > 0;
        if (has.any().item<bool>()) {
          // Downhill (the gradient is ~0, not 0), as long as x (or 1), to its first dip (trying the longest
          // step first left a maximum of a periodic energy for a well as far away as x is long).
          d = torch::where((row_dot(g, d) > 0).unsqueeze(1), -d, d);
          d = d * (torch::clamp_min(row_norm(x), 1.0) / torch::where(has, d_norm, torch::ones_like(d_norm))).unsqueeze(1);
          torch::Tensor moved, rose;
          const DipLadder ladder = dip_ladder(opt, x.scalar_type());
          torch::Tensor x_next =
              ladder_search(x, d, e, e_scale, per_problem ? has : torch::ones_like(e, torch::kBool),
                            torch::full_like(e, ladder.shortest()),
                            torch::zeros_like(e, torch::kBool), torch::zeros_like(e), per_problem, moved, rose);
          if (!torch::equal(x_next, x)) {
            x = x_next;
            probe_factorizations = 0;  // counted: that point is left
            if (last_solve) *last_solve = LinearOperator();  // the probe's factor is of the point left
            it = -1;  // Newton from the new start: its gradient sets the tolerance
            continue;
          }
        }
      }
    }
    info.energy = e.sum().item<double>();
    info.iterations = it;
    torch::Tensor bad = row_finite.logical_not() & failed.logical_not();
    if (bad.any().item<bool>()) {
      why << "the gradient is not finite at Newton iteration " << it << " for problem(s) " << listed(bad) << "; ";
      failed = failed | bad;
    }
    // Failed problems count too (frozen at their last point): the record says where the solve ended.
    const double inf = std::numeric_limits<double>::infinity();
    info.grad_norm = torch::where(torch::isnan(g_norm), torch::full_like(g_norm, inf), g_norm).max().item<double>();
    torch::Tensor active = (g_norm > threshold) & failed.logical_not();
    if (!active.any().item<bool>()) break;
    // With atol 0 the tolerance is rtol times ||g0||: a start at or near the minimum (a solve warm-started from
    // its own answer) puts it below the gradient's round-off, where no x reaches it: said where a failure may be
    // that (only where the gradient fell since the start: not for a problem diverging, or one that did not move).
    auto atol_hint = [&](const torch::Tensor& rows) {
      const torch::Tensor near = rows & (g_norm < g0_norm);
      if (opt.atol == 0 && near.any().item<bool>())
        why << " (atol is 0, so the tolerance is rtol x ||g0||, here down to "
            << torch::where(near, threshold, torch::full_like(threshold, inf)).min().item<double>()
            << ": where that is below the gradient's round-off, as from a start at or near the minimum, no x "
               "reaches it; set atol)";
    };
    if (it == opt.max_iter) {
      torch::Tensor ratio = g_norm / threshold.clamp_min(std::numeric_limits<double>::min());
      why << "max_iter = " << opt.max_iter << " Newton iterations reached with the gradient norm at "
          << torch::where(active, ratio, torch::zeros_like(ratio)).max().item<double>()
          << " x its tolerance (||g|| = " << info.grad_norm << ") for problem(s) " << listed(active);
      atol_hint(active);
      why << "; ";
      break;
    }

    // Newton direction: H p = -g on the unconverged rows, to a relative tolerance eta (the forcing term).
    torch::Tensor rhs = torch::where(active.unsqueeze(1), -g, torch::zeros_like(g));
    // Active rows have ||g0|| > 0 (a zero gradient at x0 has converged); the others get cg_rtol, not 0 / 0.
    torch::Tensor eta = torch::clamp_max(
        (g_norm / torch::where(active, g0_norm, torch::ones_like(g0_norm))).sqrt(), opt.cg_rtol);
    eta = torch::where(active, eta, torch::full_like(eta, opt.cg_rtol));
    // By the point's factorization where it has one (else CG); with reuse_factor, after the first, by CG on the
    // previous factorization first, and by a new one only for the rows where that CG stalls.
    auto solve = [&](const torch::Tensor& b) {
      CGResult out = solve_rows(point, b, eta, cg_max_iter, /*truncate=*/true);
      if (point.solve) {
        if (opt.reuse_factor) reuse_iter = std::min(cg_max_iter, reuse_budget(point));
        // Kept for the next iteration's try, or for the backward; else freed with this point.
        if ((opt.reuse_factor && reuse_iter >= kMinReuseIterations) || last_solve) stale = point.solve;
      }
      info.cg_iterations += out.iterations;
      info.hvp_count += out.iterations;
      return out;
    };
    CGResult cg;
    if (opt.reuse_factor && stale && point.solve && reuse_iter >= kMinReuseIterations) {
      cg = conjugate_gradient(point.hvp, rhs, eta, reuse_iter, /*truncate=*/true, by_factor(stale, point.precondition));
      info.cg_iterations += cg.iterations;
      info.hvp_count += cg.iterations;
      torch::Tensor by_stale = (cg.residual <= eta).unsqueeze(1);
      if (!by_stale.all().item<bool>()) {
        CGResult fresh = solve(torch::where(by_stale, torch::zeros_like(rhs), rhs));
        cg.x = torch::where(by_stale, cg.x, fresh.x);
        cg.indefinite = torch::where(by_stale.squeeze(1), cg.indefinite, fresh.indefinite);
      }
    } else {
      cg = solve(rhs);
    }
    // (less the probe's at a stationary start: the same point's factorization, counted there)
    if (point.factorizations) info.factorizations += point.factorizations() - (it == 0 ? probe_factorizations : 0);
    if (point.probes) info.hvp_count += point.probes();
    if (last_solve && stale) *last_solve = stale;
    // A row whose CG direction is numerically useless (no descent) falls back to steepest descent.
    torch::Tensor row_slope = row_dot(g, cg.x);
    torch::Tensor descent = row_slope < 0;
    info.fallback_steps += (descent.logical_not() & active).sum().item<int64_t>();
    torch::Tensor p = torch::where(descent.unsqueeze(1), cg.x, rhs);
    row_slope = row_dot(g, p);

    // The step's length. Where CG met non-positive curvature, or gave no descent, the direction's length is no
    // Newton step's: a truncated iterate whose curvature was nearly 0, or the gradient. Without a preconditioner
    // (minimize's energies; the fused simulator's block-Jacobi one carries the inertia's scale) that is the
    // energy's scale: an Armijo search from step 1 took a long one wherever the energy was lower, many wells
    // away on a periodic energy, and a short one crept (1e-4 cos(x) from 0.3 stopped at max_iter). A Newton step
    // longer than x over a curvature near 0 leapt wells too. So, without a preconditioner, the step is the line's
    // first dip (ladder_search):
    // - non-positive curvature or no descent: along the direction made as long as x (or 1), from the shortest
    //   trial up: the trials are the same whatever the energy's scale, and so is the dip;
    // - a Newton step longer than x (or 1): along the step, from x's length (the ladder's trial below it) up to
    //   the step, or as far as the ladder's trials reach, where the energy along them has more than one valley;
    //   in one, the longest trial with Armijo's decrease (the step itself, where it has it).
    // Where no trial is taken, backtracking below the first trial where one rose; else (every change within
    // round-off) a long step backtracks from the step itself, and an unscaled direction has failed.
    // Elsewhere, backtracking from step 1. Both per problem when the energy gives per-problem values (a summed
    // energy's one search serves every problem); non-finite trial energies are rejected. A problem whose search
    // fails is frozen and reported; the others go on.
    torch::Tensor unscaled_rows = torch::zeros_like(active);  // made as long as x, from the shortest trial
    torch::Tensor long_rows = torch::zeros_like(active);      // long Newton steps, from x's length
    torch::Tensor reach, p_norm;
    if (!point.precondition) {
      reach = torch::clamp_min(row_norm(x), 1.0);
      p_norm = row_norm(p);
      const torch::Tensor unscaled =
          (cg.indefinite.defined() ? cg.indefinite : torch::zeros_like(active)) | descent.logical_not();
      unscaled_rows = active & unscaled & (p_norm > 0);
      long_rows = active & unscaled.logical_not() & (p_norm > reach) & torch::isfinite(p_norm);
    }
    auto any = [&](const torch::Tensor& rows) { return per_problem ? rows : rows.any().reshape({1}); };
    const torch::Tensor dip = any(unscaled_rows | long_rows);
    const torch::Tensor from_shortest = any(unscaled_rows);
    tried = torch::zeros(e.sizes(), e.options().dtype(torch::kLong));
    torch::Tensor x_next = x.clone();
    torch::Tensor accepted = per_problem ? active.logical_not() : torch::zeros_like(e, torch::kBool);
    torch::Tensor searched = accepted.clone();
    // d = scale p: the unscaled directions made as long as x
    const bool dips = dip.any().item<bool>();
    const torch::Tensor scale = dips
        ? torch::where(unscaled_rows, reach / torch::where(unscaled_rows, p_norm, reach), torch::ones_like(g_norm))
        : torch::ones_like(g_norm);
    const torch::Tensor d = p * scale.unsqueeze(1);
    const torch::Tensor d_slope = row_slope * scale;
    const torch::Tensor slope = per_problem ? d_slope : d_slope.sum().reshape({1});
    torch::Tensor step = torch::ones_like(e);  // backtracking's first step, of d
    if (dips) {
      // a long step's first trial: x's length, down to the ladder's trial below it (a shared search: its
      // shortest); from the shortest trial where any row's direction is unscaled
      const DipLadder ladder = dip_ladder(opt, x.scalar_type());
      torch::Tensor own = torch::where(long_rows, reach / torch::where(long_rows, p_norm, reach), torch::ones_like(reach));
      own = torch::pow(ladder.ratio, torch::ceil(torch::log(own) / std::log(ladder.ratio) - 1e-9));
      torch::Tensor first = per_problem ? own : own.min().reshape({1});
      first = torch::where(from_shortest, torch::full_like(first, ladder.shortest()),
                           first);
      torch::Tensor moved, rose;
      x_next = ladder_search(x, d, e, e_scale, dip, first, from_shortest.logical_not(), slope, per_problem, moved,
                             rose);
      // (an unscaled direction whose trials all rose backtracks below the shortest, as a long step below its
      // first: a well narrower than the shortest trial, which is x's length's, is still found)
      searched = searched | (dip & (moved | (from_shortest & rose.logical_not())));
      accepted = accepted | moved;
      step = torch::where(dip & rose, first * opt.ls_shrink, step);
    }
    for (int64_t ls = 0; ls < opt.ls_max_iter && !searched.all().item<bool>(); ++ls) {
      torch::Tensor trial = x + (per_problem ? step : step.expand({batch})).unsqueeze(1) * d;
      torch::Tensor e_trial;
      if (analytic) {
        e_trial = eval(trial);
      } else {
        last_trial = std::make_shared<SecondOrderPoint>(energy, trial, shape, consts, opt.batched, /*lazy=*/true);
        e_trial = groups(last_trial->energy());
      }
      ++info.line_search_steps;
      tried += searched.logical_not().to(torch::kLong);
      // (a step so short that it leaves x where it was is no decrease: long searches underflow to it)
      const torch::Tensor moves = (trial != x).any(1);
      torch::Tensor ok = torch::isfinite(e_trial) & (e_trial <= e + opt.ls_c1 * step * slope + e_noise * e_scale) &
                         (per_problem ? moves : moves.any().reshape({1})) & searched.logical_not();
      x_next = torch::where((per_problem ? ok : ok.expand({batch})).unsqueeze(1), trial, x_next);
      accepted = accepted | ok;
      searched = searched | ok;
      step = torch::where(searched, step, step * opt.ls_shrink);
    }
    const torch::Tensor x_point = x;
    x = x_next;
    torch::Tensor stuck = (per_problem ? accepted.logical_not() : accepted.logical_not().expand({batch})) & active;
    // A step no longer than x's precision, taken within the search's round-off allowance: no progress either.
    torch::Tensor crept;
    const bool creeping = step_within(x, x_point, ulp, active, stuck, crept);
    bool any_stuck = stuck.any().item<bool>();
    if (creeping || any_stuck) {
      const torch::Tensor retry = stuck | crept;
      // A Newton direction along which no trial lowered the energy, or only by x's last bits: where the Hessian
      // is huge at x but only there (a start on a sharp kink: a smoothed |x - rest| or a contact plane), its step
      // is below x's precision (or at it, in a coordinate near 0). Before such a problem fails (or creeps on),
      // its gradient, made as long as x (or 1), is searched from the shortest trial up, as a direction of
      // non-positive curvature is, but ending at the first rise: the dip it reaches falling all the way, if the
      // energy has one (never one beyond a hill: near a minimum, where steps creep at round-off, the gradient's
      // direction is noise, and its far trials found other wells). (A start on |x - 1| smoothed over 1e-9 in
      // float32 failed at iteration 0, 0.5 from its minimum.) A problem that crept and finds no dip keeps its
      // step, as before.
      const torch::Tensor rows = per_problem ? retry : retry.any().reshape({1});
      const torch::Tensor reach_x = torch::clamp_min(row_norm(x_point), 1.0);
      const torch::Tensor g_len = torch::where(retry, g_norm, torch::ones_like(g_norm));
      const torch::Tensor down = torch::where(retry.unsqueeze(1), -g * (reach_x / g_len).unsqueeze(1),
                                              torch::zeros_like(g));
      torch::Tensor moved, rose;
      const torch::Tensor x_down = ladder_search(
          x_point, down, e, e_scale, rows, torch::full_like(e, dip_ladder(opt, x.scalar_type()).shortest()),
          torch::zeros_like(e, torch::kBool), torch::zeros_like(e), per_problem, moved, rose, /*first_rise_ends=*/true);
      const torch::Tensor took = retry & (per_problem ? moved : moved.expand({batch}));
      x = torch::where(took.unsqueeze(1), x_down, x);
      info.fallback_steps += took.sum().item<int64_t>();
      stuck = stuck & took.logical_not();
      any_stuck = stuck.any().item<bool>();
    }
    if (any_stuck) {
      // (the trials the stuck problems' own searches took this iteration: a first dip's, then backtracking's;
      // the most among them)
      const torch::Tensor stuck_groups = per_problem ? stuck : stuck.any().reshape({1});
      why << "the line search found no decrease of the energy after "
          << torch::where(stuck_groups, tried, torch::zeros_like(tried)).max().item<int64_t>()
          << " trials at Newton iteration "
          << it << " for problem(s) " << listed(stuck) << " (||g|| = "
          << torch::where(stuck, g_norm, torch::zeros_like(g_norm)).max().item<double>() << ", tolerance "
          << torch::where(stuck, threshold, torch::zeros_like(threshold)).max().item<double>() << ")";
      atol_hint(stuck);
      why << "; ";
      failed = failed | stuck;
    }
  }

  torch::Tensor row_ok = ((g_norm <= threshold) & failed.logical_not()).cpu();
  info.problem_converged.assign(row_ok.data_ptr<bool>(), row_ok.data_ptr<bool>() + batch);
  info.converged = row_ok.all().item<bool>();
  info.message = info.converged ? "converged" : why.str().substr(0, why.str().size() - 2);
  if (!info.converged && opt.raise_on_failure) throw ConvergenceError("Newton did not converge: " + info.message);
  return x.view(shape);
}

}  // namespace diffsoft
