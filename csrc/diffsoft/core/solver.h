// diffsoft core: Newton minimization with matrix-free CG on Hessian-vector products, and the
// implicit-function-theorem backward. Pure LibTorch: no pybind, no Python.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace diffsoft {

// energy(x, params) -> 0-dim tensor. x has the caller's shape. For a batch (dim 0 indexes independent
// problems) it returns either their summed energy (0-dim) or one energy per problem, shape (B,): the latter
// gives each problem its own line search. Every tensor the energy depends on and that may need a gradient
// must be in params.
using EnergyFn = std::function<torch::Tensor(const torch::Tensor& x, const std::vector<torch::Tensor>& params)>;

// An optional fast path for energies that know their own derivatives (the built-in fused energies): value,
// gradient and Hessian-vector products on (B, n) rows without autograd. The EnergyFn stays the reference
// (both must describe the same energy at the same parameter values); it gives the derivatives with respect
// to the parameters (the backward's final product) unless the AnalyticEnergy has mixed_vjp. "Analytic" says
// where the derivatives come from (closed forms, or probing), not how the systems are solved: any of them
// may also offer a factorization (AnalyticDerivatives::solve).
using LinearOperator = std::function<torch::Tensor(const torch::Tensor&)>;  // (B, n) -> (B, n)

// What one problem's factorization and a solve with it cost, counted from the structure of the factor (never
// timed, so that what Newton decides from them is the same on every run): n unknowns, nnz_a nonzeros in the
// factored matrix's lower triangle, nnz_l entries of L that a solve sweeps twice, the numeric factorization's
// flops (CHOLMOD's own count after its analysis; sum of squared column counts otherwise), and whether it is
// CHOLMOD's supernodal one (whose many small dense blocks cost more than their flops on 2D meshes).
struct FactorCounts {
  int64_t n = 0;
  double nnz_a = 0, nnz_l = 0, flops = 0;
  bool supernodal = false;
};

struct AnalyticDerivatives {
  torch::Tensor energy;  // 0-dim, or (B,) per problem
  // Optional, shaped like energy: the scale of its round-off, such as the sum of its terms' magnitudes (a total
  // whose terms nearly cancel rounds like its terms); the line search's allowance for it. Default |energy|.
  torch::Tensor energy_scale;
  torch::Tensor grad;    // (B, n)
  LinearOperator hvp;
  LinearOperator precondition;  // optional: M^-1 v for a symmetric positive definite M ~ H (CG's preconditioner)
  // Optional: H^-1 b by a factorization (a sparse direct solve), used instead of CG. Rows whose H is not
  // positive definite come back non-finite, and those rows fall back to (truncated) CG.
  LinearOperator solve;
  std::function<int64_t()> factorizations;  // optional: how many factorizations solve has made so far
  std::function<int64_t()> probes;          // optional: Hessian-vector products made outside CG so far
  std::function<FactorCounts()> factor_counts;  // optional, with solve: one problem's factor (the largest made)
};
struct AnalyticEnergy {
  std::function<torch::Tensor(const torch::Tensor& x_rows)> value;  // 0-dim, or (B,) per problem
  std::function<AnalyticDerivatives(const torch::Tensor& x_rows)> derivatives;
  // Optional: d/dparams [grad_x E(x) . w] with x and w as (B, n) rows, for the params at the indices `wanted`
  // (one tensor each, shaped like the param; undefined where it does not enter E), without autograd.
  std::function<std::vector<torch::Tensor>(const torch::Tensor& x_rows, const torch::Tensor& w_rows,
                                           const std::vector<size_t>& wanted)>
      mixed_vjp;
};

// Thrown when a solve does not converge and the caller asked for errors rather than warnings.
struct ConvergenceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct SolverOptions {
  // Newton stops when every problem's gradient norm is <= max(atol, rtol * its norm at x0).
  // rtol <= 0 means "by dtype": 1e-8 for float64, 1e-4 for float32.
  double atol = 0.0;
  double rtol = 0.0;
  int64_t max_iter = 100;
  // Forcing term: CG on H p = -g stops at ||r|| <= eta ||g|| with eta = min(cg_rtol, sqrt(||g|| / ||g0||)),
  // loose far from the minimum and tightening as Newton converges (superlinear convergence).
  double cg_rtol = 0.5;
  int64_t cg_max_iter = 0;  // <= 0: the number of unknowns per problem
  // Adjoint solve H lambda = dL/dx* in the backward: relative residual and iteration cap.
  // backward_rtol 0 means "by dtype" (default_backward_rtol): 1e-10 for float64, 1e-5 for float32.
  double backward_rtol = 0.0;
  int64_t backward_max_iter = 0;  // <= 0: 10 x the number of unknowns per problem
  // Backtracking (Armijo) line search: accept E(x + a p) <= E(x) + c1 a g.p, else a *= shrink (where the
  // Hessian is not positive definite, sometimes the first dip along p instead: newton.cpp).
  double ls_c1 = 1e-4;
  double ls_shrink = 0.5;
  int64_t ls_max_iter = 30;
  // Keep the forward's last factorization (a factored Hessian) for the backward, where it replaces a
  // fresh factorization at x*: a back-substitution plus iterative refinement (and CG preconditioned by it)
  // solves the adjoint system. Newton's last factor was made one step before x*, so a few refinements reach
  // the tolerance. Costs the factor's memory until the backward has run.
  bool keep_factor = false;
  // With a factored Hessian, solve each Newton system after the first by CG preconditioned with the previous
  // factorization, and factor again only the problems where that CG stalls within a budget of iterations: half
  // a factorization's cost over one iteration's, both counted from the factor (FactorCounts), never timed, so
  // the iterates are the same on every run; none where a factorization is cheap (creatures). Pays where one is
  // dear and the Hessian changes little from one Newton iteration to the next (large meshes).
  bool reuse_factor = false;
  // With a sparsity pattern (probed_energy): Hessian-vector products per autograd call when probing the Hessian.
  // 0: measured (probe.cpp: 1, 2, 4, ... while faster per probe); 1: one per call; K > 1: up to K per call where
  // a BatchedVjp is given. Always at most kMaxProbeElements / (B n) per call.
  int64_t probe_batch = 0;
  bool batched = false;         // dim 0 of x indexes independent problems
  bool raise_on_failure = false;  // throw ConvergenceError instead of reporting it in SolveInfo
};

// What a solve did. The forward fills the first block; the backward (adjoint solve) fills the second.
struct SolveInfo {
  bool converged = false;
  int64_t iterations = 0;
  int64_t cg_iterations = 0;
  int64_t hvp_count = 0;
  int64_t factorizations = 0;      // factorizations of H made for Newton's steps (a factored Hessian)
  int64_t line_search_steps = 0;
  int64_t fallback_steps = 0;      // (problem, iteration) pairs where Newton's direction was no descent
                                   // direction, or its search found no decrease beyond x's precision, and a
                                   // (scaled) gradient step was taken instead
  double energy = 0.0;
  double grad_norm = 0.0;          // max over problems of ||grad E(x*)|| (failed ones too; inf if not finite)
  double grad_norm_initial = 0.0;  // max over problems of ||grad E(x0)||
  std::vector<bool> problem_converged;
  std::string message;

  bool backward_ran = false;
  bool backward_converged = false;
  int64_t backward_cg_iterations = 0;
  bool backward_direct = false;    // the adjoint system was solved by a factorization
  double backward_residual = 0.0;  // max over problems of ||H lambda - dL/dx*|| / ||dL/dx*||
  std::string backward_message;
};

// K vector-Jacobian products in one autograd call: v is (K, *output.shape); returns (K, *input.shape), the k-th
// being v[k] . d output / d input, with the graph retained; or an undefined tensor where this graph cannot be
// batched (the caller then takes them one at a time). diffsoft's Python layer gives one that calls torch's
// vmap over the backward (torch.autograd.grad(..., is_grads_batched=True)), which LibTorch's C++ API lacks.
using BatchedVjp =
    std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& input, const torch::Tensor& v)>;

// Energy, gradient and the graph of the gradient at one point, so that Hessian-vector products by double
// backward can follow without re-evaluating the energy. Vectors are (B, n) rows: B problems of n unknowns.
class SecondOrderPoint {
 public:
  // The energy at x_rows with its graph, and its gradient's (lazy: only on build_gradient(), as a line search's
  // trial, whose forward Newton's next iteration reuses when the trial is taken).
  SecondOrderPoint(const EnergyFn& energy, const torch::Tensor& x_rows, at::IntArrayRef shape,
                   const std::vector<torch::Tensor>& params, bool batched = false, bool lazy = false);
  // The gradient's graph from the energy's (once; a lazy point's first call), by the energy's backward.
  void build_gradient();
  // Whether the energy's value had a graph to x (a lazy point's may not: where it did not, its gradient is
  // built by evaluating afresh, which says what is wrong).
  bool has_graph() const { return energy_graph_.defined() || grad_graph_.defined(); }
  const torch::Tensor& x() const { return x_; }            // (B, n), the point (requires grad)
  const torch::Tensor& energy() const { return energy_; }  // 0-dim or (B,) per problem, detached
  const torch::Tensor& grad() const { return grad_; }      // (B, n), detached
  torch::Tensor hvp(const torch::Tensor& v) const;          // (B, n) -> (B, n)
  // K products in one autograd call by batched_vjp: (K, B, n) -> (K, B, n), undefined where it declines.
  torch::Tensor hvps(const torch::Tensor& v, const BatchedVjp& batched_vjp) const;
  // d/dparams [grad_x E . w] for the params in `wrt`; undefined where a param does not enter the energy.
  std::vector<torch::Tensor> mixed_vjp(const torch::Tensor& w, const std::vector<torch::Tensor>& wrt) const;

 private:
  // H v where the gradient has no graph to x: 0 for an energy linear (or piecewise linear) in x; a
  // std::invalid_argument naming the lost second derivative where the gradient changes with x all the same, at
  // least in proportion to the move (checked once per point).
  torch::Tensor zero_hessian(const torch::Tensor& v) const;

  EnergyFn energy_fn_;
  std::vector<int64_t> shape_;
  std::vector<torch::Tensor> params_;
  mutable bool linear_checked_ = false;
  torch::Tensor x_, energy_graph_, grad_graph_, energy_, grad_;
};

// Row-wise 2-norms of (B, n) rows, scale-safe: each row is divided by its largest magnitude before squaring
// (as LAPACK's nrm2 does), so that a gradient of 1e-300 or 1e160 has its true norm, not 0 or inf.
torch::Tensor row_norm(const torch::Tensor& a);
torch::Tensor row_dot(const torch::Tensor& a, const torch::Tensor& b);  // (B, n), (B, n) -> (B,)
// Per row of (B, n) rows marked in `rows` and not in `except` ((B,) bool each), whether ||to - from|| <= eps
// max(||from||, 1) (scale-safe norms), false elsewhere, into `out` ((B,) bool); returns whether any is.
bool step_within(const torch::Tensor& to, const torch::Tensor& from, double eps, const torch::Tensor& rows,
                 const torch::Tensor& except, torch::Tensor& out);

struct CGResult {
  torch::Tensor x;          // (B, n)
  int64_t iterations = 0;   // = number of Hessian-vector products
  bool converged = false;   // every row met its tolerance
  bool negative_curvature = false;
  torch::Tensor indefinite; // (B,) bool: the rows that met non-positive curvature
  torch::Tensor residual;   // (B,) relative residuals ||b - A x|| / ||b|| (0 where b = 0)
};

// (Preconditioned) conjugate gradient on rows: solves A x_b = b_b for each row b, stopping row b at
// ||r_b|| <= rtol_b ||b_b|| (rtol: (B,); the true residual, not the preconditioned one). The rows are solved
// scaled to norm 1, so that neither they nor the tolerance under- or overflow. With truncate=true (Newton), a
// row that meets non-positive curvature stops and returns its current iterate, or M^-1 b if that happens on
// the first iteration: always a descent direction for -g = b. precondition may be empty (M = I).
CGResult conjugate_gradient(const LinearOperator& apply_a, const torch::Tensor& b, const torch::Tensor& rtol,
                            int64_t max_iter, bool truncate, const LinearOperator& precondition = nullptr);

// Newton's method with backtracking line search and truncated CG. Returns x* with x0's shape; fills info.
// Throws std::invalid_argument for bad input (non-scalar or non-finite energy at x0, bad options), and
// ConvergenceError when options.raise_on_failure and the solve failed.
// last_solve, if given, receives the solve operator of Newton's last factorization (empty if none was made).
torch::Tensor newton_minimize(const EnergyFn& energy, const torch::Tensor& x0, const std::vector<torch::Tensor>& params,
                              const SolverOptions& options, SolveInfo& info,
                              const AnalyticEnergy* analytic = nullptr, LinearOperator* last_solve = nullptr);

// Throws the caller's own exception for a message (e.g. a Python exception the autograd engine passes through
// unchanged, where it would turn a C++ ConvergenceError into a plain error).
using RaiseFn = std::function<void(const std::string& message)>;

// x* = argmin_x energy(x, params) as a differentiable function of params (implicit function theorem).
// info, if given, receives the forward's record, and the backward's when it runs. sparsity, if defined and
// analytic is not given, is the (E, k) pattern of probed_energy below: the energy's Hessian is then probed
// and factored (with a FactorCache of this solve's own), its probes batched by batched_vjp if given (see
// probed_energy and SolverOptions::probe_batch). With options.raise_on_failure, a failed adjoint
// solve calls raise_backward if given (which must throw), else throws ConvergenceError. The backward is first
// order: run with create_graph=True it throws.
torch::Tensor implicit_minimize(EnergyFn energy, const torch::Tensor& x0, const std::vector<torch::Tensor>& params,
                                const SolverOptions& options, std::shared_ptr<SolveInfo> info = nullptr,
                                std::shared_ptr<const AnalyticEnergy> analytic = nullptr,
                                const torch::Tensor& sparsity = torch::Tensor(), RaiseFn raise_backward = nullptr,
                                BatchedVjp batched_vjp = nullptr);

// A user energy's analytic path when its Hessian's sparsity is known: x is (N, d) per problem (batched: (B, N, d))
// and the energy couples only vertices that share one of `elements` ((E, k) int64). The vertices get a
// distance-2 colouring (no two of a colour share a neighbour), so d probes per colour, Hessian-vector products
// by double backward, recover every nonzero of H; H is factored (core/factor.h) for Newton's steps and the
// adjoint solve when a solve first needs it. Value, gradient, Hessian products and parameter derivatives
// stay autograd's. A pattern that misses couplings makes a wrong factor, which the solver's measured
// residuals and CG polish correct (slowly): the derivatives stay right; so would wrong probes.
// With batched_vjp, up to probe_batch probes (SolverOptions::probe_batch: 0 = measured) are taken per autograd
// call, at most kMaxProbeElements / (B n) of them, one at a time where batched_vjp declines.
struct FactorCache;
// Probes per autograd call are at most this over B n: a batched backward holds each of its intermediates K
// times (the plain-torch step energy's took 240-280 bytes per probe element on a 100 x 100 sheet, so about
// 140 MB at this bound), and batches of over 10^5 probe elements gained little per probe where measured.
constexpr int64_t kMaxProbeElements = int64_t(1) << 19;
AnalyticEnergy probed_energy(const EnergyFn& energy, const std::vector<torch::Tensor>& params, at::IntArrayRef shape,
                             bool batched, const torch::Tensor& elements, std::shared_ptr<FactorCache> cache = nullptr,
                             BatchedVjp batched_vjp = nullptr, int64_t probe_batch = 0);

// The energy's gradient at y_rows (B, n), first order only (no graph kept), detached; zeros where the energy does
// not reach x.
torch::Tensor gradient_at(const EnergyFn& energy, const torch::Tensor& y_rows, at::IntArrayRef shape,
                          const std::vector<torch::Tensor>& params);

// Value, gradient and Hessian products at x_rows: by the analytic path if given, else by autograd.
AnalyticDerivatives derivatives_at(const EnergyFn& energy, const AnalyticEnergy* analytic,
                                   const torch::Tensor& x_rows, at::IntArrayRef shape,
                                   const std::vector<torch::Tensor>& params, bool batched);
// The same by autograd at a point already evaluated (its gradient built here, if it was not).
AnalyticDerivatives derivatives_of(const std::shared_ptr<SecondOrderPoint>& point);

void check_options(const SolverOptions& options);

// The adjoint solve's relative residual where SolverOptions.backward_rtol is 0: 1e-10 in float64; 1e-5 in
// float32, whose round-off bounds the residual near the Hessian's condition number times 1.2e-7.
double default_backward_rtol(torch::ScalarType dtype);

// Solves H x = b on rows to relative residuals rtol ((B,), as conjugate_gradient): by the point's factorization
// where it has one and H is positive definite there, by CG (preconditioned if the point offers it) on the
// remaining rows; direct_rows, if given, receives the (B,) mask of the rows solved by the factorization.
// CGResult.iterations counts CG's only.
CGResult solve_rows(const AnalyticDerivatives& point, const torch::Tensor& b, const torch::Tensor& rtol,
                    int64_t max_iter, bool truncate, torch::Tensor* direct_rows = nullptr);

}  // namespace diffsoft
