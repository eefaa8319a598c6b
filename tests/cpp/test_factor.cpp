// GoogleTest suite of core/factor.h: the assembly pattern, the factorization back ends, and factors made again
// in the memory of freed ones.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "diffsoft/core/factor.h"

namespace {

// The lower-triangle entries of a 5-point Laplacian on a k x k grid (7-point on k x k x depth) plus shift * I,
// as a sequence with repeats (every diagonal entry comes twice, halves summed), values drawn from gen: the
// matrix is symmetric positive definite for shift > 0 and not for shift < 0.
struct Grid {
  int64_t n;
  std::vector<std::pair<int, int>> entries;
  std::vector<double> values;
};

// A grid's sides: k x k (depth 1, 2D) or k x k x depth (3D).
struct Shape {
  int k, depth;
  int64_t n() const { return int64_t(k) * k * depth; }
};

Grid grid(Shape s, double shift, std::mt19937& gen) {
  std::uniform_real_distribution<double> coupling(0.5, 1.0);
  const int k = s.k;
  Grid g{s.n(), {}, {}};
  std::vector<double> diag(g.n, shift);
  for (int l = 0; l < s.depth; ++l)
    for (int j = 0; j < k; ++j)
      for (int i = 0; i < k; ++i) {
        const int v = (l * k + j) * k + i;
        for (int w : {i + 1 < k ? v + 1 : -1, j + 1 < k ? v + k : -1, l + 1 < s.depth ? v + k * k : -1}) {
          if (w < 0) continue;
          const double c = coupling(gen);
          g.entries.emplace_back(w, v);
          g.values.push_back(-c);
          diag[v] += c, diag[w] += c;
        }
      }
  for (int v = 0; v < g.n; ++v)
    for (int half = 0; half < 2; ++half) {
      g.entries.emplace_back(v, v);
      g.values.push_back(0.5 * diag[v]);
    }
  return g;
}

Eigen::VectorXd product(const Grid& g, const Eigen::VectorXd& x) {
  Eigen::VectorXd y = Eigen::VectorXd::Zero(g.n);
  for (size_t k = 0; k < g.entries.size(); ++k) {
    const auto [r, c] = g.entries[k];
    y[r] += g.values[k] * x[c];
    if (r != c) y[c] += g.values[k] * x[r];
  }
  return y;
}

std::vector<double> assembled(const diffsoft::LowerPattern& p, const Grid& g) {
  std::vector<double> values(p.nnz(), 0.0);
  for (size_t k = 0; k < g.entries.size(); ++k) values[p.place[k]] += g.values[k];
  return values;
}

std::vector<Eigen::Triplet<double>> triplets(const Grid& g) {
  std::vector<Eigen::Triplet<double>> t;
  for (size_t k = 0; k < g.entries.size(); ++k) t.emplace_back(g.entries[k].first, g.entries[k].second, g.values[k]);
  return t;
}

}  // namespace

// Dense (n <= 100), then CHOLMOD's (Eigen's simplicial where the build has no CHOLMOD): simplicial on the 2D
// grids of 225 and 1600 unknowns, supernodal on the 3D one of 4096 (its factor is denser).
class FactorSizes : public ::testing::TestWithParam<Shape> {};

TEST_P(FactorSizes, PatternAndTripletsGiveTheSameSolve) {
  std::mt19937 gen(7);
  const Grid g = grid(GetParam(), 0.1, gen);
  const diffsoft::LowerPattern pattern(g.n, g.entries);
  EXPECT_LT(pattern.nnz(), static_cast<int64_t>(g.entries.size()));  // repeats share one place
  EXPECT_EQ(pattern.outer.back(), pattern.nnz());
  const Eigen::VectorXd b = Eigen::VectorXd::LinSpaced(g.n, -1.0, 2.0);
  auto from_pattern = diffsoft::factor_symmetric(pattern, assembled(pattern, g));
  auto from_triplets = diffsoft::factor_symmetric(g.n, triplets(g));
  ASSERT_TRUE(from_pattern && from_triplets);
  const Eigen::VectorXd x = from_pattern->solve(b);
  EXPECT_LT((product(g, x) - b).norm(), 1e-10 * b.norm());
  EXPECT_LT((from_triplets->solve(b) - x).norm(), 1e-10 * x.norm());
}

TEST_P(FactorSizes, AFreedFactorIsMadeAgainInPlaceAndStaysRight) {
  std::mt19937 gen(11);
  auto cache = std::make_shared<diffsoft::FactorCache>();
  const Eigen::VectorXd b = Eigen::VectorXd::Ones(GetParam().n());
  std::unique_ptr<diffsoft::LowerPattern> pattern;
  for (int round = 0; round < 3; ++round) {
    const Grid g = grid(GetParam(), 0.1 + round, gen);  // new values, the same pattern
    if (!pattern) pattern = std::make_unique<diffsoft::LowerPattern>(g.n, g.entries);
    auto factor = diffsoft::factor_symmetric(*pattern, assembled(*pattern, g), cache.get());
    ASSERT_TRUE(factor);
    EXPECT_LT((product(g, factor->solve(b)) - b).norm(), 1e-10 * b.norm()) << "round " << round;
  }  // each round's factor is freed before the next is made
  // An indefinite matrix of the pattern: no factor, and its partial factor is not kept for reuse.
  const Grid bad = grid(GetParam(), -20.0, gen);
  EXPECT_FALSE(diffsoft::factor_symmetric(*pattern, assembled(*pattern, bad), cache.get()));
  const Grid good = grid(GetParam(), 1.0, gen);
  auto factor = diffsoft::factor_symmetric(*pattern, assembled(*pattern, good), cache.get());
  ASSERT_TRUE(factor);
  EXPECT_LT((product(good, factor->solve(b)) - b).norm(), 1e-10 * b.norm());
  if (diffsoft::has_cholmod() && GetParam().n() > 100) {
    EXPECT_EQ(cache->analyses, 1);
    // Rounds 1 and 2 reuse, and so does the indefinite one, whose partial factor is dropped: the last is fresh.
    EXPECT_EQ(cache->reused, 3);
  } else {
    EXPECT_EQ(cache->reused, 0);  // dense and Eigen's simplicial factors are not pooled
  }
}

// The counts that reuse_factor's budget is computed from: a function of the pattern alone (the same for new
// values, with or without a cache), between the pattern's own size and a dense factor's.
TEST_P(FactorSizes, CountsDependOnThePatternOnly) {
  std::mt19937 gen(5);
  auto cache = std::make_shared<diffsoft::FactorCache>();
  const Grid g = grid(GetParam(), 0.1, gen);
  const diffsoft::LowerPattern pattern(g.n, g.entries);
  auto first = diffsoft::factor_symmetric(pattern, assembled(pattern, g), cache.get());
  auto again = diffsoft::factor_symmetric(pattern, assembled(pattern, grid(GetParam(), 2.0, gen)), cache.get());
  auto uncached = diffsoft::factor_symmetric(pattern, assembled(pattern, g));
  ASSERT_TRUE(first && again && uncached);
  const diffsoft::FactorCounts c = first->counts;
  const double n = double(g.n);
  EXPECT_EQ(c.n, g.n);
  EXPECT_EQ(c.nnz_a, double(pattern.nnz()));
  EXPECT_GE(c.nnz_l, double(pattern.nnz()));  // L holds A's lower pattern and its fill
  EXPECT_LE(c.nnz_l, n * (n + 1) / 2);
  EXPECT_GE(c.flops, double(pattern.nnz()));  // sum of squared column counts >= their sum
  EXPECT_LE(c.flops, n * (n + 1) * (2 * n + 1) / 6);
  EXPECT_EQ(c.supernodal, diffsoft::has_cholmod() && GetParam().depth > 1);
  if (g.n <= 100) EXPECT_EQ(c.flops, n * (n + 1) * (2 * n + 1) / 6);  // dense
  for (const auto* other : {&again->counts, &uncached->counts}) {
    EXPECT_EQ(other->n, c.n);
    EXPECT_EQ(other->nnz_a, c.nnz_a);
    EXPECT_EQ(other->nnz_l, c.nnz_l);
    EXPECT_EQ(other->flops, c.flops);
    EXPECT_EQ(other->supernodal, c.supernodal);
  }
}

INSTANTIATE_TEST_SUITE_P(DenseSimplicialSupernodal, FactorSizes,
                         ::testing::Values(Shape{6, 1}, Shape{15, 1}, Shape{40, 1}, Shape{16, 16}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::to_string(info.param.k) + "x" + std::to_string(info.param.depth);
                         });

TEST(LowerPattern, RefusesEntriesOutsideTheLowerTriangle) {
  EXPECT_THROW(diffsoft::LowerPattern(3, {{0, 1}}), std::invalid_argument);
  EXPECT_THROW(diffsoft::LowerPattern(3, {{3, 0}}), std::invalid_argument);
  EXPECT_THROW(diffsoft::LowerPattern(3, {{1, -1}}), std::invalid_argument);
}
