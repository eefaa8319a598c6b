// The fused step-energy kernels: gradient, Hessian-vector products and parameter derivatives against central
// differences of the kernel's own value and gradient, for each material in 2D and 3D; the analytic path's
// factorizations; bad shapes and indices are refused.
#include <functional>
#include <limits>
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include "diffsoft/physics/step_energy.h"
#include "diffsoft/physics/step_solver.h"

using torch::Tensor;

namespace {

const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
const auto i64 = torch::TensorOptions().dtype(torch::kLong);

struct Problem {
  diffsoft::StepModel model;
  diffsoft::StepState state;
};

// A collider of `kind` (the position of its name in collider_kinds()) with contact stiffness, friction and band
// kc, kf, eps and its geometry's parameters.
diffsoft::Collider collider(const std::string& name, double kc, double kf, double eps, std::vector<Tensor> geometry) {
  const auto kinds = diffsoft::collider_kinds();
  int64_t kind = 0;
  while (kinds.at(kind).name != name) ++kind;
  std::vector<Tensor> params = {torch::tensor(kc, f64), torch::tensor(kf, f64), torch::tensor(eps, f64)};
  params.insert(params.end(), geometry.begin(), geometry.end());
  return {kind, params};
}

// Two elements sharing a face (2D: an edge) plus one muscle, vertex 0 fixed, two problems in the batch, and one
// collider of each kind placed so that some vertices are in contact with it or within its friction band: a
// slightly tilted plane near y = 0.02, a height field of random heights around 0.02, a ball under vertex 1. With
// per_problem, every model parameter has one value per problem (a leading B, each problem's a little different).
Problem make(int d, int64_t material, bool per_problem = false) {
  torch::manual_seed(7);
  Problem p;
  const int64_t n = d + 2, e = 2, b = 2;
  Tensor rest = torch::zeros({n, d}, f64);
  for (int k = 0; k < d; ++k) rest[k + 1][k] = 1.0;
  rest[n - 1] = torch::full({d}, 0.8, f64);
  p.model.elements = d == 2 ? torch::tensor({0, 1, 2, 1, 3, 2}, i64).view({e, 3})
                            : torch::tensor({0, 1, 2, 3, 1, 4, 2, 3}, i64).view({e, 4});
  std::vector<Tensor> dinv;
  for (int64_t k = 0; k < e; ++k) {
    Tensor idx = p.model.elements[k];
    Tensor ds = (rest.index_select(0, idx.slice(0, 1)) - rest[idx[0].item<int64_t>()]).t();
    dinv.push_back(torch::inverse(ds));
  }
  p.model.Dm_inv = torch::stack(dinv);
  p.model.muscles = torch::tensor({int64_t(1), n - 1}, i64).view({1, 2});
  p.model.slot = torch::arange(-1, n - 1, i64);  // vertex 0 fixed
  p.model.mass = torch::rand({n - 1}, f64) + 0.5;
  p.model.mu = torch::full({e}, 3.0, f64);
  p.model.lam = torch::full({e}, 5.0, f64);
  p.model.rest_length = torch::full({1}, 1.2, f64);
  p.model.stiffness = torch::full({1}, 4.0, f64);
  p.model.material = material;
  p.model.h = torch::tensor(0.05, f64), p.model.gravity = torch::tensor(9.8, f64);
  Tensor normal = d == 2 ? torch::tensor({-0.1, 1.0}, f64) : torch::tensor({-0.1, 1.0, -0.05}, f64);
  Tensor samples = d == 2 ? torch::empty({7}, f64) : torch::empty({7, 6}, f64);
  samples.uniform_(0.0, 0.04);
  p.model.colliders = {
      collider("plane", 50.0, 3.0, 0.05, {normal / normal.norm(), torch::tensor(0.02, f64)}),
      collider("height_field", 40.0, 2.0, 0.05,
               {torch::full({d - 1}, -0.5, f64), torch::full({d - 1}, 0.3, f64), samples}),
      collider("sphere", 60.0, 4.0, 0.05,
               {d == 2 ? torch::tensor({1.0, -0.45}, f64) : torch::tensor({1.0, -0.45, 0.05}, f64),
                torch::tensor(0.5, f64)}),
      collider("capsule", 45.0, 3.5, 0.05,
               {d == 2 ? torch::tensor({0.2, -0.5}, f64) : torch::tensor({0.2, -0.5, 0.1}, f64),
                d == 2 ? torch::tensor({1.3, -0.4}, f64) : torch::tensor({1.3, -0.4, -0.1}, f64),
                torch::tensor(0.45, f64)}),
      collider("smooth_height_field", 35.0, 2.5, 0.05,
               {torch::full({d - 1}, -0.4, f64), torch::full({d - 1}, 0.25, f64), 2 * samples - 0.03})};
  if (per_problem) {
    std::vector<Tensor*> model_params = {&p.model.mass, &p.model.Dm_inv, &p.model.mu, &p.model.lam,
                                         &p.model.rest_length, &p.model.stiffness, &p.model.h, &p.model.gravity};
    for (auto& c : p.model.colliders)
      for (Tensor& t : c.params) model_params.push_back(&t);
    for (Tensor* t : model_params) {
      std::vector<int64_t> shape = {b};
      shape.insert(shape.end(), t->sizes().begin(), t->sizes().end());
      *t = (*t * (1 + 0.05 * torch::rand(shape, f64))).contiguous();
    }
  }
  Tensor x0 = rest.unsqueeze(0).repeat({b, 1, 1}) + 0.02 * torch::randn({b, n, d}, f64);
  p.state.x0 = x0;
  p.state.x0_free = x0.slice(1, 1);
  p.state.x_hat = p.state.x0_free + 0.05 * torch::randn({b, n - 1, d}, f64);
  p.state.y = p.state.x0_free + 0.03 * torch::randn({b, n - 1, d}, f64);
  p.state.activation = torch::full({b, 1}, 0.8, f64);
  return p;
}

double total(const Problem& p, const Tensor& y) {
  diffsoft::StepState s = p.state;
  s.y = y;
  return diffsoft::step_energy_value(p.model, s).sum().item<double>();
}

// How many step parameters p has: the body's and the state's, then its colliders'.
int num_params(const Problem& p) {
  int count = diffsoft::kNumStepParams;
  for (const auto& c : p.model.colliders) count += static_cast<int>(c.params.size());
  return count;
}

// The tensor of step parameter k (in the order of StepParams::flat()).
Tensor& param(Problem& p, int k) {
  Tensor* tensors[] = {&p.state.x_hat,      &p.state.x0,         &p.state.x0_free,  &p.model.mass,
                       &p.model.Dm_inv,     &p.model.mu,         &p.model.lam,      &p.state.activation,
                       &p.model.rest_length, &p.model.stiffness, &p.model.gravity,  &p.model.h};
  static_assert(sizeof(tensors) / sizeof(tensors[0]) == diffsoft::kNumStepParams);
  if (k < diffsoft::kNumStepParams) return *tensors[k];
  k -= diffsoft::kNumStepParams;
  for (auto& c : p.model.colliders) {
    if (k < static_cast<int>(c.params.size())) return c.params[k];
    k -= static_cast<int>(c.params.size());
  }
  throw std::out_of_range("no such step parameter");
}

// Its name, for messages.
std::string param_name(const Problem& p, int k) {
  if (k < diffsoft::kNumStepParams) return diffsoft::kStepParamNames[k];
  k -= diffsoft::kNumStepParams;
  const auto kinds = diffsoft::collider_kinds();
  for (size_t c = 0; c < p.model.colliders.size(); ++c) {
    const auto& params = kinds.at(p.model.colliders[c].kind).params;
    if (k < static_cast<int>(params.size())) return "colliders[" + std::to_string(c) + "]." + params[k];
    k -= static_cast<int>(params.size());
  }
  return "?";
}

// p with step parameter k moved by h * dir.
Problem shifted(Problem p, int k, const Tensor& dir, double h) {
  param(p, k) = param(p, k) + h * dir;
  return p;
}

// A random direction for step parameter k, shaped like the parameter.
Tensor direction(Problem p, int k) { return torch::randn_like(param(p, k)); }

}  // namespace

class StepEnergyKernel : public ::testing::TestWithParam<std::tuple<int, int64_t, bool>> {};

TEST_P(StepEnergyKernel, GradientAndHessianProductsMatchCentralDifferences) {
  const auto [d, material, per_problem] = GetParam();
  Problem p = make(d, material, per_problem);
  auto derivatives = diffsoft::step_energy_derivatives(p.model, p.state);
  Tensor grad = derivatives.grad;
  const double h = 1e-6;
  Tensor y = p.state.y;
  Tensor fd = torch::zeros_like(y);
  for (int64_t i = 0; i < y.numel(); ++i) {
    Tensor e = torch::zeros_like(y);
    e.view(-1)[i] = h;
    fd.view(-1)[i] = (total(p, y + e) - total(p, y - e)) / (2 * h);
  }
  EXPECT_TRUE(torch::allclose(grad, fd, 1e-6, 1e-6)) << (grad - fd).abs().max();

  Tensor v = torch::randn_like(y);
  Tensor hv = diffsoft::step_energy_hvp(p.model, derivatives, v);
  diffsoft::StepState plus = p.state, minus = p.state;
  plus.y = y + h * v, minus.y = y - h * v;
  Tensor fd_hv = (diffsoft::step_energy_derivatives(p.model, plus).grad -
                  diffsoft::step_energy_derivatives(p.model, minus).grad) / (2 * h);
  EXPECT_TRUE(torch::allclose(hv, fd_hv, 1e-6, 1e-6)) << (hv - fd_hv).abs().max();
}

TEST_P(StepEnergyKernel, ParameterDerivativesMatchCentralDifferences) {
  const auto [d, material, per_problem] = GetParam();
  Problem p = make(d, material, per_problem);
  const Tensor v = torch::randn_like(p.state.y);
  auto grad_dot_v = [&](const Problem& q) {
    return (diffsoft::step_energy_derivatives(q.model, q.state).grad * v).sum().item<double>();
  };
  const auto first = diffsoft::step_energy_param_grads(p.model, p.state, torch::ones({2}, f64), {}).flat();
  const auto mixed = diffsoft::step_energy_param_grads(p.model, p.state, {}, v).flat();
  ASSERT_EQ(static_cast<int>(first.size()), num_params(p));
  const double h = 1e-6;
  for (int k = 0; k < num_params(p); ++k) {
    const Tensor dir = direction(p, k);
    // Shared parameters get one derivative per problem: their sum is the total energy's. Per-problem ones
    // get theirs.
    const double fd1 = (total(shifted(p, k, dir, h), p.state.y) - total(shifted(p, k, dir, -h), p.state.y)) / (2 * h);
    const double fd2 = (grad_dot_v(shifted(p, k, dir, h)) - grad_dot_v(shifted(p, k, dir, -h))) / (2 * h);
    const Tensor ours1_t = first[k].sum_to_size(dir.sizes()), ours2_t = mixed[k].sum_to_size(dir.sizes());
    const double ours1 = (ours1_t * dir).sum().item<double>(), ours2 = (ours2_t * dir).sum().item<double>();
    EXPECT_NEAR(ours1, fd1, 1e-6 * (1 + std::abs(fd1))) << "first order, " << param_name(p, k);
    EXPECT_NEAR(ours2, fd2, 1e-6 * (1 + std::abs(fd2))) << "mixed, " << param_name(p, k);
  }
}

TEST_P(StepEnergyKernel, DirectSolvesFactorOnlyWhatTheyNeed) {
  const auto [d, material, per_problem] = GetParam();
  Problem p = make(d, material, per_problem);
  diffsoft::AnalyticEnergy analytic = diffsoft::step_analytic_energy(p.model, p.state, /*factorize=*/true);
  const Tensor x = p.state.y.reshape({2, -1});
  diffsoft::AnalyticDerivatives point = analytic.derivatives(x);
  EXPECT_EQ(point.factorizations(), 0);
  Tensor b = torch::randn_like(x);
  b[1].zero_();  // a converged problem: no factorization
  Tensor sol = point.solve(b);
  EXPECT_EQ(point.factorizations(), 1);
  EXPECT_TRUE(sol[1].eq(0).all().item<bool>());
  if (sol[0].isfinite().all().item<bool>())  // else H is not positive definite there, and CG takes over
    EXPECT_TRUE(torch::allclose(point.hvp(sol), b, 1e-8, 1e-8)) << (point.hvp(sol) - b).abs().max();
  point.solve(b);
  EXPECT_EQ(point.factorizations(), 1);  // made once
}

INSTANTIATE_TEST_SUITE_P(Materials, StepEnergyKernel,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(0, 1, 2),
                                            ::testing::Values(false, true)));

// The batch's loops split it between threads (tests/cpp/threaded_loops.cpp): values, gradients, products,
// parameter derivatives and direct solves are the same bits on one thread as on two.
TEST(StepEnergyKernelThreads, OneThreadAndTwoGiveTheSameBits) {
  const int before = at::get_num_threads();
  for (int d : {2, 3}) {
    const Problem p = make(d, 1, /*per_problem=*/true);
    const Tensor v = torch::randn_like(p.state.y);
    std::vector<std::vector<Tensor>> out;
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      const diffsoft::StepDerivatives all = diffsoft::step_energy_derivatives(p.model, p.state);
      diffsoft::AnalyticEnergy analytic = diffsoft::step_analytic_energy(p.model, p.state, /*factorize=*/true);
      const diffsoft::AnalyticDerivatives point = analytic.derivatives(p.state.y.reshape({2, -1}));
      out.push_back({diffsoft::step_energy_value(p.model, p.state), all.grad,
                     diffsoft::step_energy_hvp(p.model, all, v), point.solve(v.reshape({2, -1})),
                     diffsoft::step_energy_param_grads(p.model, p.state, {}, v).flat()[4]});
    }
    for (size_t k = 0; k < out[0].size(); ++k)
      EXPECT_TRUE(torch::equal(out[0][k], out[1][k])) << "d = " << d << ", output " << k;
  }
  at::set_num_threads(before);
}

// A FactorCache shared with a model of another topology is refused, by the thread of the batch's loop that
// finds it: the error reaches the caller.
TEST(StepEnergyKernelThreads, AnErrorInALoopsThreadReachesTheCaller) {
  Problem p = make(2, 1);
  p.model.factor_cache = std::make_shared<diffsoft::FactorCache>();
  Problem other = p;
  other.model.muscles = torch::tensor({1, 3, 1, 2}, i64).view({2, 2});
  other.model.rest_length = torch::full({2}, 1.2, f64);
  other.model.stiffness = torch::full({2}, 4.0, f64);
  other.state.activation = torch::cat({p.state.activation, p.state.activation}, 1);
  const Tensor b = torch::randn_like(p.state.y).reshape({2, -1});
  diffsoft::step_analytic_energy(p.model, p.state, true).derivatives(p.state.y.reshape({2, -1})).solve(b);
  auto solve = [&] {
    diffsoft::step_analytic_energy(other.model, other.state, true).derivatives(other.state.y.reshape({2, -1})).solve(b);
  };
  try {
    solve();
    FAIL() << "a factor cache of another topology was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("another topology"), std::string::npos) << e.what();
  }
}

// A batch whose parameters are per problem: each problem's energy and gradient are those of the problem alone
// with its own parameters.
TEST(StepEnergyKernelPerProblem, EachProblemIsItsOwnModel) {
  for (int d : {2, 3}) {
    const Problem p = make(d, 1, /*per_problem=*/true);
    const Tensor energy = diffsoft::step_energy_value(p.model, p.state);
    const Tensor grad = diffsoft::step_energy_derivatives(p.model, p.state).grad;
    for (int64_t b = 0; b < 2; ++b) {
      Problem alone = p;
      for (int k = 0; k < num_params(p); ++k) {
        Tensor& t = param(alone, k);
        const bool model_param = k != 0 && k != 1 && k != 2 && k != 7;  // not the state's
        t = model_param ? t[b].contiguous() : t.slice(0, b, b + 1).contiguous();
      }
      alone.state.y = p.state.y.slice(0, b, b + 1);
      EXPECT_NEAR(diffsoft::step_energy_value(alone.model, alone.state).item<double>(), energy[b].item<double>(),
                  1e-12 * std::abs(energy[b].item<double>()));
      EXPECT_TRUE(torch::allclose(diffsoft::step_energy_derivatives(alone.model, alone.state).grad[0], grad[b],
                                  1e-12, 1e-12));
    }
  }
}

TEST(StepEnergyKernelInput, RefusesBadShapesAndIndices) {
  Problem p = make(2, 0);
  diffsoft::StepState shared = p.state;
  shared.activation = torch::full({1}, 0.8, f64);  // (M,) instead of (B, M): would read past the end
  EXPECT_THROW(diffsoft::step_energy_value(p.model, shared), std::invalid_argument);
  Problem q = make(2, 0);
  q.model.elements[1][2] = 99;
  EXPECT_THROW(diffsoft::step_energy_derivatives(q.model, q.state), std::invalid_argument);
  Problem r = make(2, 0);
  auto derivatives = diffsoft::step_energy_derivatives(r.model, r.state);
  EXPECT_THROW(diffsoft::step_energy_hvp(r.model, derivatives, torch::zeros({3}, f64)), std::invalid_argument);
  Problem s = make(2, 0);
  s.model.mass = torch::ones({3, s.model.mass.size(0)}, f64);  // a batch of 3 masses for 2 problems
  EXPECT_THROW(diffsoft::step_energy_value(s.model, s.state), std::invalid_argument);
  Problem t = make(2, 0);
  t.model.h = torch::Tensor();  // the time step unset
  EXPECT_THROW(diffsoft::step_energy_value(t.model, t.state), std::invalid_argument);
  Problem u = make(2, 0);
  u.model.colliders[0].kind = 99;  // no such kind
  EXPECT_THROW(diffsoft::step_energy_value(u.model, u.state), std::invalid_argument);
  Problem w = make(2, 0);
  w.model.colliders[1].params.pop_back();  // a height field without heights
  EXPECT_THROW(diffsoft::step_energy_value(w.model, w.state), std::invalid_argument);
  Problem z = make(2, 0);
  z.model.colliders[1].params.back() = torch::zeros({1}, f64);  // one sample: no segment
  EXPECT_THROW(diffsoft::step_energy_value(z.model, z.state), std::invalid_argument);
  Problem q3 = make(3, 0);
  q3.model.colliders[0].params[3] = torch::tensor({0.0, 1.0}, f64);  // a 2D normal in 3D
  EXPECT_THROW(diffsoft::step_energy_derivatives(q3.model, q3.state), std::invalid_argument);
}

namespace {

// What step_energy_value says of a problem: its invalid_argument's message, or "accepted".
std::string message(const Problem& p) {
  try {
    diffsoft::step_energy_value(p.model, p.state);
  } catch (const std::invalid_argument& e) {
    return std::string(e.what());
  }
  return std::string("accepted");
}

}  // namespace

// An unset (undefined) tensor of the model or the state is named, not read as another field's shape.
TEST(StepEnergyKernelInput, NamesTheUnsetTensor) {
  Problem a = make(2, 0);
  a.model.elements = torch::Tensor();  // was "StepModel.Dm_inv must be ..."
  EXPECT_NE(message(a).find("elements, muscles and slot must be int64 CPU tensors"), std::string::npos) << message(a);
  Problem b = make(2, 0);
  b.model.slot = torch::Tensor();  // was "x0 must be (B, N, d)"
  EXPECT_NE(message(b).find("elements, muscles and slot"), std::string::npos) << message(b);
  Problem c = make(2, 0);
  c.state.y = torch::Tensor();  // was c10's "undefined tensor"
  EXPECT_NE(message(c).find("y must be (B, F, d)"), std::string::npos) << message(c);
  Problem e = make(2, 0);
  e.state.x0_free = torch::Tensor();
  EXPECT_NE(message(e).find("StepState.x0_free is an undefined tensor"), std::string::npos) << message(e);
  // The solver's analytic path reads the state's shapes when it is made: named there too (was torch's "shape
  // '[0]' is invalid" at its first evaluation).
  EXPECT_THROW(diffsoft::step_analytic_energy(e.model, e.state, true), std::invalid_argument);
}

// Physical values out of range are refused by field (they had been taken as given: a negative mass or time step
// gave an energy unbounded below, or a wrong step), per problem too; the test problems' own values pass.
TEST(StepEnergyKernelInput, RefusesPhysicalValuesOutOfRange) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const struct {
    std::function<void(diffsoft::StepModel&)> edit;
    const char* said;
  } cases[] = {
      {[](auto& m) { m.mass = m.mass.clone(); m.mass[1] = -1.0; },
       "StepModel.mass holds -1 (flat entry 1): must be positive"},
      {[](auto& m) { m.mass = torch::zeros({2, m.mass.size(0)}, f64) + 1.0; m.mass[1][0] = 0.0; },
       "StepModel.mass holds 0 (flat entry "},
      {[](auto& m) { m.h = torch::tensor(-0.01, f64); }, "StepModel.h holds -0.01"},
      {[&](auto& m) { m.mu = m.mu.clone(); m.mu[0] = nan; }, "StepModel.mu holds nan"},
      {[](auto& m) { m.mu = m.mu.clone(); m.mu[1] = -3.0; }, "StepModel.mu holds -3 (flat entry 1): must be >= 0"},
      {[](auto& m) { m.lam = m.lam.clone(); m.lam[0] = -1.0; }, "StepModel.lam holds -1 (flat entry 0): must be >= 0"},
      {[](auto& m) { m.gravity = torch::tensor(-9.8, f64); }, "StepModel.gravity holds -9.8"},
      {[](auto& m) { m.stiffness = m.stiffness.clone(); m.stiffness[0] = 0.0; }, "StepModel.stiffness holds 0"},
      {[](auto& m) { m.colliders[0].params[1] = torch::tensor(-0.5, f64); }, "StepModel.colliders[0].friction holds"},
      {[](auto& m) { m.colliders[1].params[0] = torch::tensor(-1.0, f64); }, "StepModel.colliders[1].stiffness holds"},
  };
  for (const auto& c : cases) {
    Problem p = make(2, 0);
    ASSERT_GT(p.model.muscles.size(0), 0);
    ASSERT_EQ(message(p), "accepted");
    c.edit(p.model);
    EXPECT_NE(message(p).find(c.said), std::string::npos) << message(p);
  }
  Problem zeros = make(2, 0);  // a collider without contact stiffness or friction, an element without shear
  zeros.model.colliders[0].params[0] = torch::tensor(0.0, f64);
  zeros.model.colliders[0].params[1] = torch::tensor(0.0, f64);
  zeros.model.mu = zeros.model.mu.clone();
  zeros.model.mu[0] = 0.0;
  EXPECT_EQ(message(zeros), "accepted");
  Problem stable = make(2, 0);  // the stable neo-Hookean takes a negative lam (a negative Poisson ratio)
  stable.model.material = 2;
  stable.model.lam = stable.model.lam.clone() * -0.1;
  EXPECT_EQ(message(stable), "accepted");
}

// The test problems exercise every collider kind: each one alone adds energy (contact or friction).
TEST(StepEnergyKernel, EveryColliderKindActsOnTheTestProblems) {
  for (int d : {2, 3}) {
    const Problem p = make(d, 1);
    diffsoft::StepModel free_flight = p.model;
    free_flight.colliders.clear();
    const Tensor with = diffsoft::step_energy_value(p.model, p.state);
    for (size_t c = 0; c < p.model.colliders.size(); ++c) {
      diffsoft::StepModel one = free_flight;
      one.colliders.push_back(p.model.colliders[c]);
      EXPECT_TRUE((diffsoft::step_energy_value(one, p.state) > diffsoft::step_energy_value(free_flight, p.state))
                      .any()
                      .item<bool>())
          << "collider " << c << " in " << d << "D";
    }
    EXPECT_TRUE(with.isfinite().all().item<bool>());
  }
}

TEST(StepParams, NamesFollowTheEnumAndIndicesAreChecked) {
  EXPECT_STREQ(diffsoft::kStepParamNames[static_cast<int>(diffsoft::StepParam::x_hat)], "x_hat");
  EXPECT_STREQ(diffsoft::kStepParamNames[static_cast<int>(diffsoft::StepParam::muscle_stiffness)], "muscle_stiffness");
  EXPECT_STREQ(diffsoft::kStepParamNames[static_cast<int>(diffsoft::StepParam::h)], "h");
  EXPECT_STREQ(diffsoft::kStepParamNames[diffsoft::kNumStepParams - 1], "h");
  EXPECT_EQ(diffsoft::step_param(5), diffsoft::StepParam::mu);
  EXPECT_THROW(diffsoft::step_param(diffsoft::kNumStepParams), std::invalid_argument);
  EXPECT_THROW(diffsoft::step_param(-1), std::invalid_argument);
}
