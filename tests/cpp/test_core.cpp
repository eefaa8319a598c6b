// GoogleTest suite of the C++ core, used from LibTorch alone (energies as C++ callables).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include <torch/version.h>

#include "diffsoft/core/solver.h"

using diffsoft::EnergyFn;
using torch::Tensor;

namespace {

const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);

class Core : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(1234); }
};

Tensor spd(int64_t n) {
  Tensor m = torch::randn({n, n}, f64);
  return m.mm(m.t()) + n * torch::eye(n, f64);
}

// E(x; A, b) = 1/2 x^T A x - b^T x with A symmetric.
const EnergyFn quadratic = [](const Tensor& x, const std::vector<Tensor>& p) {
  return 0.5 * x.dot(p[0].mv(x)) - p[1].dot(x);
};

// E(x; k, b) = sum 1/2 k x^2 + 1/4 x^4 - b x: Hessian diag(k + 3 x^2).
const EnergyFn quartic = [](const Tensor& x, const std::vector<Tensor>& p) {
  return (0.5 * p[0] * x * x + 0.25 * x.pow(4) - p[1] * x).sum();
};

// Rosenbrock in n dimensions, scaled by a parameter a: minimum at x = (1, ..., 1), indefinite Hessian at 0.
const EnergyFn rosenbrock = [](const Tensor& x, const std::vector<Tensor>& p) {
  Tensor head = x.slice(0, 0, -1), tail = x.slice(0, 1);
  return (p[0] * (tail - head * head).square() + (1 - head).square()).sum();
};

}  // namespace

TEST_F(Core, HessianVectorProductsMatchKnownHessians) {
  const int64_t n = 9;
  Tensor a = spd(n), b = torch::randn({n}, f64), x = torch::randn({1, n}, f64);
  diffsoft::SecondOrderPoint qp(quadratic, x, {n}, {a, b});
  Tensor v = torch::randn({1, n}, f64);
  EXPECT_TRUE(torch::allclose(qp.hvp(v)[0], a.mv(v[0]), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(qp.grad()[0], a.mv(x[0]) - b, 1e-12, 1e-12));

  Tensor k = torch::rand({n}, f64) + 1;
  diffsoft::SecondOrderPoint qr(quartic, x, {n}, {k, b});
  EXPECT_TRUE(torch::allclose(qr.hvp(v)[0], (k + 3 * x[0].square()) * v[0], 1e-12, 1e-12));
}

TEST_F(Core, ConjugateGradientSolvesSpdRowsToTheirTolerances) {
  const int64_t n = 40;
  Tensor a1 = spd(n), a2 = spd(n) * 1e3;
  auto apply = [&](const Tensor& v) { return torch::stack({a1.mv(v[0]), a2.mv(v[1])}); };
  Tensor b = torch::randn({2, n}, f64);
  Tensor tol = 1e-10 * b.norm(2, 1);
  auto r = diffsoft::conjugate_gradient(apply, b, torch::full({2}, 1e-10, f64), 10 * n, /*truncate=*/false);
  ASSERT_TRUE(r.converged);
  EXPECT_FALSE(r.negative_curvature);
  EXPECT_LE(r.iterations, 3 * n);
  Tensor resid = b - apply(r.x);
  EXPECT_LE(resid[0].norm().item<double>(), 1.01 * tol[0].item<double>() + 1e-12);
  EXPECT_LE(resid[1].norm().item<double>(), 1.01 * tol[1].item<double>() + 1e-12);
  EXPECT_TRUE(torch::allclose(r.x[0], at::linalg_solve(a1, b[0], /*left=*/true), 1e-8, 1e-10));
}

TEST_F(Core, RowNormsAndConjugateGradientAreScaleSafe) {
  Tensor a = torch::tensor({3e-300, 4e-300, 0.0, 3e200, 4e200, 0.0, 0.0, 0.0, 0.0}, f64).view({3, 3});
  Tensor norms = diffsoft::row_norm(a);
  EXPECT_NEAR(norms[0].item<double>() / 5e-300, 1.0, 1e-15);
  EXPECT_NEAR(norms[1].item<double>() / 5e200, 1.0, 1e-15);
  EXPECT_EQ(norms[2].item<double>(), 0.0);
  a[2][1] = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(std::isinf(diffsoft::row_norm(a)[2].item<double>()));

  // H = 1e-300 A, b = 1e-300 c: x solves A x = c, though H b underflows to 0.
  const int64_t n = 8;
  Tensor m = spd(n), c = torch::randn({1, n}, f64);
  auto apply = [&](const Tensor& v) { return (1e-300 * m).mm(v.t()).t(); };
  auto r = diffsoft::conjugate_gradient(apply, 1e-300 * c, torch::full({1}, 1e-10, f64), 10 * n, false);
  ASSERT_TRUE(r.converged);
  EXPECT_TRUE(torch::allclose(r.x[0], at::linalg_solve(m, c[0], /*left=*/true), 1e-8, 1e-10));
  EXPECT_LE(r.residual[0].item<double>(), 1e-10);
}

TEST_F(Core, TruncatedConjugateGradientReturnsADescentDirectionOnIndefiniteSystems) {
  const int64_t n = 6;
  Tensor d = torch::linspace(-2, 3, n, f64);  // indefinite diagonal
  auto apply = [&](const Tensor& v) { return v * d; };
  Tensor b = torch::ones({1, n}, f64);  // b = -g
  auto r = diffsoft::conjugate_gradient(apply, b, torch::full({1}, 1e-12, f64), n, /*truncate=*/true);
  EXPECT_TRUE(r.negative_curvature);
  EXPECT_GT((r.x * b).sum().item<double>(), 0.0);  // p . (-g) > 0: descent
  auto strict = diffsoft::conjugate_gradient(apply, b, torch::full({1}, 1e-12, f64), n, /*truncate=*/false);
  EXPECT_FALSE(strict.converged);
}

TEST_F(Core, NewtonFindsTheRosenbrockMinimumFromAnIndefiniteStart) {
  diffsoft::SolveInfo info;
  diffsoft::SolverOptions opt;
  opt.rtol = 1e-12;
  opt.max_iter = 200;
  Tensor x = diffsoft::newton_minimize(rosenbrock, torch::zeros({6}, f64), {torch::full({}, 100.0, f64)}, opt, info);
  ASSERT_TRUE(info.converged) << info.message;
  EXPECT_TRUE(torch::allclose(x, torch::ones({6}, f64), 1e-8, 1e-8));
  EXPECT_GT(info.cg_iterations, 0);
  EXPECT_EQ(info.hvp_count, info.cg_iterations);
}

TEST_F(Core, NewtonBatchJudgesEachProblemOnItsOwnTolerance) {
  const int64_t n = 5;
  Tensor k = torch::rand({3, n}, f64) + 1;
  Tensor b = torch::randn({3, n}, f64) * torch::tensor({1e-4, 1.0, 1e4}, f64).unsqueeze(1);
  diffsoft::SolverOptions opt;
  opt.batched = true;
  opt.rtol = 1e-10;
  diffsoft::SolveInfo info;
  Tensor x = diffsoft::newton_minimize(quartic, torch::zeros({3, n}, f64), {k, b}, opt, info);
  ASSERT_TRUE(info.converged) << info.message;
  ASSERT_EQ(info.problem_converged.size(), 3u);
  Tensor g = k * x + x.pow(3) - b;
  for (int64_t i = 0; i < 3; ++i) EXPECT_LE(g[i].norm().item<double>(), 1e-10 * b[i].norm().item<double>());
}

TEST_F(Core, ImplicitBackwardMatchesCentralFiniteDifferences) {
  const int64_t n = 7;
  Tensor k = (torch::rand({n}, f64) + 1).requires_grad_();
  Tensor b = torch::randn({n}, f64).requires_grad_();
  Tensor w = torch::randn({n}, f64);
  diffsoft::SolverOptions opt;
  opt.rtol = 1e-14;
  auto info = std::make_shared<diffsoft::SolveInfo>();
  Tensor x = diffsoft::implicit_minimize(quartic, torch::zeros({n}, f64), {k, b}, opt, info);
  ASSERT_TRUE(x.requires_grad());
  auto grads = torch::autograd::grad({x.dot(w)}, {k, b});
  EXPECT_TRUE(info->backward_ran && info->backward_converged) << info->backward_message;

  auto loss = [&](const Tensor& kk, const Tensor& bb) {
    torch::NoGradGuard no_grad;
    diffsoft::SolveInfo i;
    return diffsoft::newton_minimize(quartic, torch::zeros({n}, f64), {kk, bb}, opt, i).dot(w).item<double>();
  };
  const double h = 1e-6;
  for (int64_t i = 0; i < n; ++i) {
    Tensor e = torch::zeros({n}, f64);
    e[i] = h;
    Tensor kd = k.detach(), bd = b.detach();
    const double fd_k = (loss(kd + e, bd) - loss(kd - e, bd)) / (2 * h);
    const double fd_b = (loss(kd, bd + e) - loss(kd, bd - e)) / (2 * h);
    EXPECT_NEAR(grads[0][i].item<double>(), fd_k, 1e-7);
    EXPECT_NEAR(grads[1][i].item<double>(), fd_b, 1e-7);
  }
}

TEST_F(Core, ImplicitBackwardOfAQuadraticIsTheLinearSolve) {
  const int64_t n = 10;
  Tensor a = spd(n);
  Tensor b = torch::randn({n}, f64).requires_grad_();
  Tensor w = torch::randn({n}, f64);
  diffsoft::SolverOptions opt;
  opt.rtol = 1e-13;
  Tensor x = diffsoft::implicit_minimize(quadratic, torch::zeros({n}, f64), {a, b}, opt);
  auto g = torch::autograd::grad({x.dot(w)}, {b})[0];
  EXPECT_TRUE(torch::allclose(g, at::linalg_solve(a, w, /*left=*/true), 1e-9, 1e-11));
}

TEST_F(Core, TheAdjointToleranceDefaultsToWhatTheDtypeResolves) {
  // float32 round-off bounds the adjoint's relative residual near cond(H) x 1.2e-7: a default of float64's
  // 1e-10 would report every float32 backward as failed. backward_rtol 0 (the default) is the dtype's.
  const int64_t n = 10;
  Tensor a = spd(n);
  Tensor b = torch::randn({n}, f64);
  Tensor w = torch::randn({n}, f64);
  diffsoft::SolverOptions opt;
  EXPECT_EQ(opt.backward_rtol, 0.0);
  EXPECT_EQ(diffsoft::default_backward_rtol(torch::kFloat64), 1e-10);
  EXPECT_EQ(diffsoft::default_backward_rtol(torch::kFloat32), 1e-5);
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    for (double rtol : {0.0, 1e-10}) {
      opt.backward_rtol = rtol;
      auto info = std::make_shared<diffsoft::SolveInfo>();
      Tensor bb = b.to(dtype).requires_grad_();
      Tensor x = diffsoft::implicit_minimize(quadratic, torch::zeros({n}, dtype), {a.to(dtype), bb}, opt, info);
      auto g = torch::autograd::grad({x.dot(w.to(dtype))}, {bb})[0];
      const double wanted = rtol > 0 ? rtol : diffsoft::default_backward_rtol(dtype);
      EXPECT_LE(info->backward_residual, std::max(wanted, 1e-6));
      // float32 cannot resolve 1e-10: asked for it, the backward says so; by default it converges.
      const bool reachable = dtype == torch::kFloat64 || rtol == 0.0;
      EXPECT_EQ(info->backward_converged, reachable) << info->backward_message;
      if (!reachable) EXPECT_NE(info->backward_message.find("1e-10"), std::string::npos) << info->backward_message;
      EXPECT_TRUE(torch::allclose(g.to(torch::kFloat64), at::linalg_solve(a, w, /*left=*/true), 1e-4, 1e-6));
    }
  }
  opt.backward_rtol = -1.0;
  EXPECT_THROW(diffsoft::check_options(opt), std::invalid_argument);
}

TEST_F(Core, BadInputThrowsInvalidArgument) {
  diffsoft::SolveInfo info;
  diffsoft::SolverOptions opt;
  const EnergyFn vector_valued = [](const Tensor& x, const std::vector<Tensor>&) { return x * x; };
  EXPECT_THROW(diffsoft::newton_minimize(vector_valued, torch::zeros({3}, f64), {}, opt, info),
               std::invalid_argument);
  const EnergyFn log_energy = [](const Tensor& x, const std::vector<Tensor>&) { return x.log().sum(); };
  EXPECT_THROW(diffsoft::newton_minimize(log_energy, -torch::ones({3}, f64), {}, opt, info), std::invalid_argument);
  EXPECT_THROW(diffsoft::newton_minimize(quartic, torch::zeros({3}, torch::kLong), {}, opt, info),
               std::invalid_argument);
  opt.ls_shrink = 1.5;
  EXPECT_THROW(diffsoft::newton_minimize(quartic, torch::zeros({3}, f64), {torch::ones({3}, f64), torch::ones({3}, f64)},
                                         opt, info),
               std::invalid_argument);
  diffsoft::SolverOptions ok;
  EXPECT_THROW(diffsoft::implicit_minimize(quartic, torch::zeros({3}, f64),
                                           {torch::ones({3}, torch::kFloat32), torch::ones({3}, f64)}, ok),
               std::invalid_argument);
}

TEST_F(Core, NonConvergenceIsReportedOrThrown) {
  diffsoft::SolverOptions opt;
  opt.max_iter = 1;
  diffsoft::SolveInfo info;
  std::vector<Tensor> p = {torch::ones({4}, f64), torch::randn({4}, f64)};
  diffsoft::newton_minimize(quartic, torch::full({4}, 5.0, f64), p, opt, info);
  EXPECT_FALSE(info.converged);
  EXPECT_NE(info.message.find("max_iter"), std::string::npos);
  opt.raise_on_failure = true;
  EXPECT_THROW(diffsoft::newton_minimize(quartic, torch::full({4}, 5.0, f64), p, opt, info),
               diffsoft::ConvergenceError);
}

namespace {

// Collects the warnings raised on this thread (the autograd engine replays a backward's warnings here). The
// handler's interface moved in torch 2.
struct CapturedWarnings : c10::WarningHandler {
  std::vector<std::string> messages;
#if TORCH_VERSION_MAJOR >= 2
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  using Guard = c10::WarningUtils::WarningHandlerGuard;
#else
  void process(const c10::SourceLocation&, const std::string& msg, const bool) override { messages.push_back(msg); }
  using Guard = c10::Warning::WarningHandlerGuard;
#endif
};

}  // namespace

TEST_F(Core, GradientAtAnUnconvergedSolveIsReportedByTheBackward) {
  // Two problems of one batch: the first starts at its minimum (b = 0, x = 0: converged at once), the second far
  // from it, and Newton gets one iteration: the forward stops short on problem 1. The implicit gradient there is
  // the derivative of an equation that does not hold; the backward must say so, naming the problem, whatever its
  // adjoint solve did.
  const EnergyFn per_problem = [](const Tensor& x, const std::vector<Tensor>& p) {
    return (0.5 * p[0] * x * x + 0.25 * x.pow(4) - p[1] * x).sum(1);
  };
  Tensor k = torch::ones({2, 4}, f64).requires_grad_();
  Tensor b = torch::zeros({2, 4}, f64);
  b[1] = 3.0;
  Tensor x0 = torch::zeros({2, 4}, f64);
  x0[1] = 50.0;
  diffsoft::SolverOptions opt;
  opt.batched = true;
  opt.max_iter = 1;
  auto info = std::make_shared<diffsoft::SolveInfo>();
  CapturedWarnings warnings;
  CapturedWarnings::Guard guard(&warnings);
  Tensor x = diffsoft::implicit_minimize(per_problem, x0, {k, b}, opt, info);
  ASSERT_FALSE(info->converged);
  ASSERT_EQ(info->problem_converged, (std::vector<bool>{true, false}));
  torch::autograd::grad({x.sum()}, {k});
  EXPECT_TRUE(info->backward_ran);
  EXPECT_FALSE(info->backward_converged);
  EXPECT_NE(info->backward_message.find("the forward solve did not converge for problem(s) 1 ("), std::string::npos)
      << info->backward_message;
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("implicit gradient at an unconverged solve"), std::string::npos)
      << warnings.messages[0];
  // A loss that leaves problem 1 out (a trainer skipping a failed creature) asks nothing of its gradient.
  x = diffsoft::implicit_minimize(per_problem, x0, {k, b}, opt, info);
  torch::autograd::grad({x[0].sum()}, {k});
  EXPECT_TRUE(info->backward_converged) << info->backward_message;
  EXPECT_EQ(warnings.messages.size(), 1u);

  // A converged forward keeps a converged backward, and no warning.
  opt.max_iter = 100;
  x = diffsoft::implicit_minimize(per_problem, x0, {k, b}, opt, info);
  ASSERT_TRUE(info->converged);
  torch::autograd::grad({x.sum()}, {k});
  EXPECT_TRUE(info->backward_converged) << info->backward_message;
  EXPECT_EQ(warnings.messages.size(), 1u);
}

TEST_F(Core, EachBackwardJudgesItsOwnForwardWhereTheRecordIsShared) {
  // One record passed to every solve of a rollout: a later converged forward overwrites it before the first
  // solve's backward runs, which must still say that its own forward stopped short (and the other way round:
  // a converged solve's backward is not blamed for a later failure).
  const EnergyFn per_problem = [](const Tensor& x, const std::vector<Tensor>& p) {
    return (0.5 * p[0] * x * x + 0.25 * x.pow(4) - p[1] * x).sum(1);
  };
  Tensor k = torch::ones({1, 4}, f64).requires_grad_();
  Tensor b = torch::full({1, 4}, 3.0, f64);
  diffsoft::SolverOptions short_of, enough;
  short_of.batched = enough.batched = true;
  short_of.max_iter = 1;
  auto info = std::make_shared<diffsoft::SolveInfo>();
  CapturedWarnings warnings;
  CapturedWarnings::Guard guard(&warnings);
  Tensor x1 = diffsoft::implicit_minimize(per_problem, torch::full({1, 4}, 50.0, f64), {k, b}, short_of, info);
  Tensor x2 = diffsoft::implicit_minimize(per_problem, torch::zeros({1, 4}, f64), {k, b}, enough, info);
  ASSERT_TRUE(info->converged);  // the record now holds the second forward
  torch::autograd::grad({x1.sum()}, {k});
  EXPECT_FALSE(info->backward_converged);
  EXPECT_NE(info->backward_message.find("the forward solve did not converge for problem(s) 0 (max_iter"),
            std::string::npos) << info->backward_message;
  ASSERT_EQ(warnings.messages.size(), 1u);
  x1 = diffsoft::implicit_minimize(per_problem, torch::zeros({1, 4}, f64), {k, b}, enough, info);
  x2 = diffsoft::implicit_minimize(per_problem, torch::full({1, 4}, 50.0, f64), {k, b}, short_of, info);
  ASSERT_FALSE(info->converged);
  torch::autograd::grad({x1.sum()}, {k});
  EXPECT_TRUE(info->backward_converged) << info->backward_message;
  EXPECT_EQ(warnings.messages.size(), 1u);
}

TEST_F(Core, ConjugateGradientToATightToleranceStopsAtRoundOffNotAtFalseCurvature) {
  // rtol 0 asks for what round-off allows: the residual reaches 0 or underflows, where p.Ap = 0 once read as H
  // not positive definite (NaN x, negative_curvature on diag(1, 2, 3, 4)).
  Tensor d = torch::arange(1, 5, f64);
  auto apply = [&](const Tensor& v) { return v * d; };
  Tensor b = torch::ones({1, 4}, f64);
  for (bool truncate : {false, true}) {
    auto r = diffsoft::conjugate_gradient(apply, b, torch::zeros({1}, f64), 50, truncate);
    EXPECT_FALSE(r.negative_curvature);
    EXPECT_TRUE(r.converged);
    EXPECT_TRUE(torch::allclose(r.x, b / d, 1e-14, 1e-14)) << r.x;
  }
  // Arguments that do not fit are named.
  EXPECT_THROW(diffsoft::conjugate_gradient(apply, b, torch::zeros({3}, f64), 50, false), std::invalid_argument);
  EXPECT_THROW(diffsoft::conjugate_gradient(apply, b, torch::full({1}, -1.0, f64), 50, false), std::invalid_argument);
  EXPECT_THROW(diffsoft::conjugate_gradient(apply, torch::ones({4}, f64), torch::zeros({1}, f64), 50, false),
               std::invalid_argument);
}

TEST_F(Core, ALineSearchThatUnderflowsToNoStepFailsAndSaysSo) {
  // An energy whose gradient points the wrong way (its value is sum x^2, its "gradient" 2x + 5): no step lowers
  // it. With a tiny shrink factor the trial step underflows to 0, and x + 0 d once passed the decrease test:
  // Newton went on to max_iter. It must fail as the default search does. (With thousands of trials, steps of an
  // ulp still pass it, within the energy's round-off allowance: not caught.)
  const EnergyFn wrong_gradient = [](const Tensor& x, const std::vector<Tensor>&) {
    return x.square().sum() + (5 * x - (5 * x).detach()).sum();  // value sum x^2, gradient 2 x + 5
  };
  for (auto set : std::vector<std::function<void(diffsoft::SolverOptions&)>>{
           [](diffsoft::SolverOptions&) {}, [](diffsoft::SolverOptions& o) { o.ls_shrink = 1e-200; }}) {
    diffsoft::SolverOptions opt;
    set(opt);
    diffsoft::SolveInfo info;
    diffsoft::newton_minimize(wrong_gradient, torch::ones({3}, f64), {}, opt, info);
    EXPECT_FALSE(info.converged);
    EXPECT_NE(info.message.find("the line search found no decrease"), std::string::npos) << info.message;
    EXPECT_LE(info.iterations, 2) << info.message;
  }
}

TEST_F(Core, AStartOnASharpKinkLeavesItAlongTheGradient) {
  // 1/2 |x - t|^2 + 1/2 |x - r| smoothed over 1e-17, from x0 = r: the Hessian is ~1e17 there and only there, so
  // Newton's step is below x's precision and no trial along it lowers the energy (the solve failed at its first
  // iteration). The gradient's search leaves the kink; x* = t - 1/2 sign(t - r).
  const EnergyFn kinked = [](const Tensor& x, const std::vector<Tensor>& p) {
    return (0.5 * (x - p[0]).square() + 0.5 * ((x - p[1]).square() + 1e-34).sqrt()).sum();
  };
  const Tensor t = torch::tensor({2.0, -1.0, 3.0}, f64), r = torch::tensor({1.0, -2.0, 0.5}, f64);
  diffsoft::SolverOptions opt;
  opt.raise_on_failure = true;
  diffsoft::SolveInfo info;
  const Tensor x = diffsoft::newton_minimize(kinked, r.clone(), {t, r}, opt, info);
  EXPECT_TRUE(info.converged) << info.message;
  EXPECT_GE(info.fallback_steps, 1);
  EXPECT_LE((x - (t - 0.5 * torch::sign(t - r))).abs().max().item<double>(), 1e-12);
}

TEST_F(Core, BadInputNamesTheArgument) {
  diffsoft::SolverOptions opt;
  diffsoft::SolveInfo info;
  const std::vector<Tensor> p = {torch::ones({3}, f64), torch::ones({3}, f64)};
  EXPECT_THROW(diffsoft::newton_minimize(quartic, torch::zeros({3}, torch::kHalf), p, opt, info),
               std::invalid_argument);
  EXPECT_THROW(diffsoft::implicit_minimize(quartic, Tensor(), p, opt), std::invalid_argument);
  opt.probe_batch = -1;
  EXPECT_THROW(diffsoft::newton_minimize(quartic, torch::zeros({3}, f64), p, opt, info), std::invalid_argument);
}

TEST_F(Core, BackwardRefusesCreateGraph) {
  Tensor k = torch::ones({3}, f64).requires_grad_();
  Tensor x = diffsoft::implicit_minimize(quartic, torch::zeros({3}, f64), {k, torch::ones({3}, f64)},
                                         diffsoft::SolverOptions());
  try {
    torch::autograd::grad({x.sum()}, {k}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "create_graph=True was not refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("first order only"), std::string::npos) << e.what();
  }
}

namespace {

// A convex spring energy on a 5 x 4 grid of 2D vertices; its edges are the sparsity pattern.
Tensor grid_edges() {
  std::vector<int64_t> edges;
  for (int64_t j = 0; j < 4; ++j)
    for (int64_t i = 0; i < 5; ++i) {
      if (i + 1 < 5) edges.insert(edges.end(), {j * 5 + i, j * 5 + i + 1});
      if (j + 1 < 4) edges.insert(edges.end(), {j * 5 + i, (j + 1) * 5 + i});
    }
  return torch::tensor(edges, torch::kLong).view({-1, 2});
}

EnergyFn grid_springs(const Tensor& pattern) {
  return [pattern](const Tensor& x, const std::vector<Tensor>&) {
    Tensor d = x.index_select(-2, pattern.select(1, 0)) - x.index_select(-2, pattern.select(1, 1));
    Tensor s = d.square().sum(-1);
    return (0.25 * s.square() + 0.5 * s).sum() + 0.5 * x.square().sum();
  };
}

}  // namespace

TEST(ProbedEnergy, RecoversAndFactorsTheHessianFromColouredProbes) {
  const Tensor pattern = grid_edges();
  const EnergyFn springs = grid_springs(pattern);
  diffsoft::AnalyticEnergy probed = diffsoft::probed_energy(springs, {}, {20, 2}, false, pattern);
  torch::manual_seed(3);
  Tensor x = torch::randn({1, 40}, f64);
  diffsoft::AnalyticDerivatives point = probed.derivatives(x);
  Tensor b = torch::randn({1, 40}, f64);
  Tensor sol = point.solve(b);
  EXPECT_TRUE(torch::allclose(point.hvp(sol), b, 1e-9, 1e-9)) << (point.hvp(sol) - b).abs().max();
  EXPECT_EQ(point.factorizations(), 1);
  // A 4-neighbour grid needs at least 5 colours at distance 2 (a vertex and its four neighbours), times d.
  EXPECT_GE(point.probes(), 10);
  EXPECT_LT(point.probes(), 40);  // fewer than the 40 columns of H

  diffsoft::SolverOptions opt;
  diffsoft::SolveInfo info;
  Tensor x_star = diffsoft::newton_minimize(springs, torch::randn({20, 2}, f64), {}, opt, info, &probed);
  EXPECT_TRUE(info.converged) << info.message;
  EXPECT_EQ(info.cg_iterations, 0);
  EXPECT_GT(info.factorizations, 0);
  // Given the pattern alone, implicit_minimize probes and factors the same way.
  auto sparse_info = std::make_shared<diffsoft::SolveInfo>();
  diffsoft::implicit_minimize(springs, torch::randn({20, 2}, f64), {}, opt, sparse_info, nullptr, pattern);
  EXPECT_TRUE(sparse_info->converged) << sparse_info->message;
  EXPECT_EQ(sparse_info->cg_iterations, 0);
  EXPECT_GT(sparse_info->factorizations, 0);
  EXPECT_THROW(diffsoft::probed_energy(springs, {}, {20, 2}, false, pattern + 20), std::invalid_argument);
  EXPECT_THROW(diffsoft::probed_energy(springs, {}, {40}, false, pattern), std::invalid_argument);
}

// Probes taken K per call (SolverOptions::probe_batch) give the factor of probes taken one at a time, and a
// BatchedVjp that declines leaves the rest of the solve to one at a time. The BatchedVjp here loops (LibTorch has
// no vmap): what is tested is the chunking and the fallback, not torch's batching.
TEST(ProbedEnergy, BatchedProbesGiveTheSameFactorAndFallBackWhereDeclined) {
  const Tensor pattern = grid_edges();
  const EnergyFn springs = grid_springs(pattern);
  std::vector<int64_t> sizes;
  const diffsoft::BatchedVjp looped = [&sizes](const Tensor& output, const Tensor& input, const Tensor& v) {
    sizes.push_back(v.size(0));
    std::vector<Tensor> out;
    for (int64_t k = 0; k < v.size(0); ++k)
      out.push_back(torch::autograd::grad({output}, {input}, {v[k]}, /*retain_graph=*/true)[0]);
    return torch::stack(out);
  };
  int64_t declined = 0;
  const diffsoft::BatchedVjp declining = [&declined](const Tensor&, const Tensor&, const Tensor&) {
    ++declined;
    return Tensor();
  };
  torch::manual_seed(5);
  const Tensor x = torch::randn({2, 40}, f64), b = torch::randn({2, 40}, f64);
  auto solve = [&](const diffsoft::BatchedVjp& vjp, int64_t probe_batch, int64_t* probes) {
    diffsoft::AnalyticEnergy probed =
        diffsoft::probed_energy(springs, {}, {2, 20, 2}, true, pattern, nullptr, vjp, probe_batch);
    diffsoft::AnalyticDerivatives point = probed.derivatives(x);
    Tensor sol = point.solve(b);
    *probes = point.probes();
    return sol;
  };
  int64_t probes = 0, probes_k = 0, probes_declined = 0;
  const Tensor one_by_one = solve(nullptr, 1, &probes);
  const Tensor batched = solve(looped, 3, &probes_k);
  EXPECT_TRUE(torch::equal(batched, one_by_one)) << (batched - one_by_one).abs().max();
  EXPECT_EQ(probes_k, probes);
  ASSERT_FALSE(sizes.empty());
  int64_t in_calls = 0;
  for (int64_t k : sizes) {
    EXPECT_LE(k, 3);
    in_calls += k;
  }
  EXPECT_EQ(in_calls, probes - (probes % 3 == 1));  // a last probe on its own goes one at a time
  const Tensor fallen_back = solve(declining, 4, &probes_declined);
  EXPECT_TRUE(torch::equal(fallen_back, one_by_one));
  EXPECT_EQ(declined, 1);
  EXPECT_EQ(probes_declined, probes);
  EXPECT_THROW(diffsoft::probed_energy(springs, {}, {20, 2}, false, pattern, nullptr, looped, -1),
               std::invalid_argument);
}

TEST_F(Core, AStationaryStartAtAMaximumIsLeftForAMinimum) {
  // sum (x^2 - 1)^2 from 0: the gradient is 0 there and H = -4 I. Newton once stopped at once and returned the
  // maximum; it now steps along the negative curvature and goes on to a minimum, |x| = 1.
  const EnergyFn well = [](const Tensor& x, const std::vector<Tensor>&) { return (x * x - 1).square().sum(); };
  diffsoft::SolverOptions opt;
  diffsoft::SolveInfo info;
  Tensor x = diffsoft::newton_minimize(well, torch::zeros({5}, f64), {}, opt, info);
  EXPECT_TRUE(info.converged) << info.message;
  EXPECT_GE(info.iterations, 1);
  EXPECT_TRUE(torch::allclose(x.abs(), torch::ones({5}, f64), 0.0, 1e-7)) << x;
  // A degenerate minimum (zero curvature, none negative) is where Newton stays.
  const EnergyFn flat = [](const Tensor& x, const std::vector<Tensor>&) { return x.pow(4).sum(); };
  x = diffsoft::newton_minimize(flat, torch::zeros({3}, f64), {}, opt, info);
  EXPECT_TRUE(info.converged);
  EXPECT_EQ(info.iterations, 0);
  EXPECT_EQ(x.abs().max().item<double>(), 0.0);
}

TEST_F(Core, ALostSecondDerivativeIsNamed) {
  // A gradient without a graph to x that changes with x: Hessian-vector products would all be 0.
  const EnergyFn lost = [](const Tensor& x, const std::vector<Tensor>&) {
    Tensor y = x.detach();
    return (x * (y * y * y)).sum();  // the gradient y^3 is right to first order, its derivative lost
  };
  diffsoft::SolverOptions opt;
  diffsoft::SolveInfo info;
  try {
    diffsoft::newton_minimize(lost, torch::ones({3}, f64), {}, opt, info);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("second derivative is lost"), std::string::npos) << e.what();
  }
  // An energy linear in x has H = 0 for good: not an error (it has no minimum, so Newton fails to converge).
  const EnergyFn linear = [](const Tensor& x, const std::vector<Tensor>&) { return x.sum(); };
  opt.max_iter = 2;
  diffsoft::newton_minimize(linear, torch::zeros({3}, f64), {}, opt, info);
  EXPECT_FALSE(info.converged);
}
