// A user energy's Hessian recovered by coloured probing, and factored: the analytic path for energies written
// in torch whose sparsity is known from a mesh. See probed_energy in solver.h.
#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>

#include "diffsoft/core/factor.h"
#include "diffsoft/core/parallel.h"
#include "diffsoft/core/solver.h"

namespace diffsoft {

namespace {

// Vertex i's neighbours (itself included): the vertices that share an element with it, sorted.
std::vector<std::vector<int64_t>> neighbours(int64_t n, const torch::Tensor& elements) {
  torch::Tensor el = elements.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t count = el.size(0), k = el.size(1);
  const int64_t* idx = el.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> out(n);
  for (int64_t i = 0; i < n; ++i) out[i].push_back(i);
  for (int64_t e = 0; e < count; ++e)
    for (int64_t a = 0; a < k; ++a)
      for (int64_t b = 0; b < k; ++b) out[idx[e * k + a]].push_back(idx[e * k + b]);
  for (auto& nb : out) {
    std::sort(nb.begin(), nb.end());
    nb.erase(std::unique(nb.begin(), nb.end()), nb.end());
  }
  return out;
}

// Greedy distance-2 colouring: no two vertices of one colour share a neighbour, so that a probe summing the
// unit vectors of one colour's vertices gives, in each row, at most one of them.
std::vector<int64_t> colour(const std::vector<std::vector<int64_t>>& nb, int64_t& colours) {
  const int64_t n = nb.size();
  std::vector<int64_t> c(n, -1), seen;
  colours = 0;
  for (int64_t i = 0; i < n; ++i) {
    seen.assign(colours + 1, -1);
    for (int64_t j : nb[i])
      for (int64_t l : nb[j])
        if (c[l] >= 0) seen[c[l]] = i;
    int64_t pick = 0;
    while (seen[pick] == i) ++pick;
    c[i] = pick;
    colours = std::max(colours, pick + 1);
  }
  return c;
}

}  // namespace

AnalyticEnergy probed_energy(const EnergyFn& energy, const std::vector<torch::Tensor>& params, at::IntArrayRef shape,
                           bool batched, const torch::Tensor& elements, std::shared_ptr<FactorCache> cache,
                           BatchedVjp batched_vjp, int64_t probe_batch) {
  if (shape.size() != (batched ? 3u : 2u))
    throw std::invalid_argument("with a sparsity pattern, x must be (N, d), or (B, N, d) with batched=True");
  const int64_t batch = batched ? shape[0] : 1, n_vertices = shape[shape.size() - 2], d = shape.back();
  if (elements.dim() != 2 || elements.scalar_type() != torch::kLong)
    throw std::invalid_argument("the sparsity pattern must be an (E, k) int64 tensor of vertex indices");
  if (probe_batch < 0) throw std::invalid_argument("probe_batch must be >= 0, got " + std::to_string(probe_batch));
  if (elements.numel() && (elements.min().item<int64_t>() < 0 || elements.max().item<int64_t>() >= n_vertices))
    throw std::invalid_argument("a sparsity pattern's vertex index is out of range [0, " + std::to_string(n_vertices) +
                                ")");
  auto nb = std::make_shared<const std::vector<std::vector<int64_t>>>(neighbours(n_vertices, elements));
  int64_t entries = 0;  // neighbour pairs: the matrix's d x d blocks
  for (const auto& list : *nb) entries += static_cast<int64_t>(list.size());
  int64_t colours = 0;
  auto c = std::make_shared<const std::vector<int64_t>>(colour(*nb, colours));
  const torch::Tensor colour_of = torch::tensor(*c, torch::kLong);
  const std::vector<int64_t> full(shape.begin(), shape.end());
  std::vector<torch::Tensor> consts;
  for (const auto& p : params) consts.push_back(p.defined() ? p.detach() : p);

  AnalyticEnergy analytic;
  analytic.value = [energy, consts, full](const torch::Tensor& x_rows) {
    torch::NoGradGuard no_grad;
    return energy(x_rows.view(full), consts);
  };
  // Probes per autograd call, shared by the solve's points: given, or being measured (see below).
  struct ProbePlan {
    int64_t per_call = 1;
    bool settled = true;
    int64_t fastest = 1;  // the measured size with the fewest seconds per probe so far
    double per_probe = std::numeric_limits<double>::infinity();
    int64_t trials = 0;  // calls of the size being measured so far, and their fewest seconds per probe
    double this_size = std::numeric_limits<double>::infinity();
  };
  auto plan = std::make_shared<ProbePlan>();
  if (batched_vjp && probe_batch > 0) plan->per_call = probe_batch;
  if (batched_vjp && probe_batch == 0) plan->settled = false;
  analytic.derivatives = [=](const torch::Tensor& x_rows) {
    auto point = std::make_shared<SecondOrderPoint>(energy, x_rows, full, consts, batched);
    AnalyticDerivatives out;
    out.energy = point->energy();
    out.grad = point->grad();
    out.hvp = [point](const torch::Tensor& v) { return point->hvp(v); };
    auto probes = std::make_shared<int64_t>(0);
    auto factors = std::make_shared<LazyFactors>(
        batch, [=](const std::vector<char>& need, std::vector<std::unique_ptr<Factor>>& out) {
          // Probe p = k d + a is the sum of the unit vectors (i, a) over the vertices i of colour k: H times it
          // holds column (i, a) of H at the rows of i's neighbours.
          const int64_t total = colours * d;
          const auto probe_vectors = [&](int64_t p0, int64_t p1) {  // probes [p0, p1) as (p1 - p0, B, n)
            torch::Tensor v = torch::zeros({p1 - p0, n_vertices, d}, x_rows.options());
            for (int64_t p = p0; p < p1; ++p) v[p - p0].select(1, p % d).copy_(colour_of.eq(p / d));
            return v.unsqueeze(1).expand({p1 - p0, batch, n_vertices, d}).reshape({p1 - p0, batch, n_vertices * d});
          };
          std::vector<torch::Tensor> hv(total);  // (B, n) float64 each
          const auto one_by_one = [&](int64_t p) {
            hv[p] = point->hvp(probe_vectors(p, p + 1)[0]).to(torch::kCPU, torch::kFloat64).contiguous();
          };
          const auto in_one_call = [&](int64_t p0, int64_t p1) {
            torch::Tensor h = point->hvps(probe_vectors(p0, p1), batched_vjp);
            if (!h.defined()) return false;
            h = h.to(torch::kCPU, torch::kFloat64).contiguous();
            for (int64_t p = p0; p < p1; ++p) hv[p] = h[p - p0];
            return true;
          };
          // How many probes per autograd call (see kMaxProbeElements and probe_batch in solver.h). A batch runs
          // the backward's operations once on K-times larger tensors: faster per probe where the per-operation
          // overhead dominates (small meshes), slower where the larger buffers cost more than the calls they
          // save (on this project's 2-core VM, whose allocator returns and re-faults every buffer over 128 KiB,
          // sheets of a few thousand unknowns): which one depends on the machine and the energy, hence, unless
          // probe_batch says, a measurement: one probe alone, then batches of 2, 4, 8, ... while each is faster
          // per probe than the last (each size timed twice, its faster call counting), settling on the fastest.
          // The products are the same either way (bit for bit in the tests). benchmarks/README.md has the
          // figures.
          const int64_t cap = std::max<int64_t>(1, kMaxProbeElements / std::max<int64_t>(1, batch * n_vertices * d));
          for (int64_t p = 0; p < total;) {
            const int64_t size = std::min(plan->per_call, cap), k = std::min(size, total - p);
            const auto t0 = std::chrono::steady_clock::now();
            if (k > 1 && !in_one_call(p, p + k)) {  // torch cannot batch this graph: one at a time from here on
              plan->per_call = 1;
              plan->settled = true;
              continue;
            }
            if (k == 1) one_by_one(p);
            p += k;
            if (plan->settled || k < size) continue;  // a last, smaller call measures nothing
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            plan->this_size = std::min(plan->this_size, seconds / k);
            if (++plan->trials < 2) continue;  // each size is judged by the faster of two calls (noise)
            const double per_probe = plan->this_size;
            plan->trials = 0;
            plan->this_size = std::numeric_limits<double>::infinity();
            if (per_probe < plan->per_probe) {
              plan->per_probe = per_probe;
              plan->fastest = size;
              plan->per_call = std::min(2 * size, cap);
              plan->settled = size == cap;
            } else {
              plan->per_call = plan->fastest;
              plan->settled = true;
            }
          }
          *probes += total;
          // Each problem's matrix from the products, then its factor: on the batch's threads (core/parallel.h),
          // at about 50 ns an entry for the triplets' sort, and a dense factorization's cost.
          const double n = double(n_vertices * d), ns = 50.0 * double(entries) * d * d + kDenseFactorNs * n * n * n;
          for_each_in_batch(batch, ns, [&](int64_t r) {
            if (!need[r]) return;
            std::vector<Eigen::Triplet<double>> lower;
            for (int64_t j = 0; j < n_vertices; ++j)
              for (int64_t i : (*nb)[j])
                for (int64_t a = 0; a < d; ++a) {
                  const double* col = hv[(*c)[i] * d + a].data_ptr<double>() + r * n_vertices * d;
                  for (int64_t b = 0; b < d; ++b)
                    if (j * d + b >= i * d + a) lower.emplace_back(j * d + b, i * d + a, col[j * d + b]);
                }
            out[r] = factor_symmetric(n_vertices * d, lower, cache.get());
          });
        });
    out.solve = [factors](const torch::Tensor& b) { return factors->solve(b); };
    out.factorizations = [factors] { return factors->count(); };
    out.probes = [probes] { return *probes; };
    return out;
  };
  return analytic;
}

}  // namespace diffsoft
