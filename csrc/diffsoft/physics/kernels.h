// Internal to the physics kernels: Eigen aliases, one problem of a batch as raw pointers (View, Point), the
// stencils a term sums over and the lists that register terms and collider kinds (terms.h, colliders.h), and
// the dispatch over dtype and dimension. step_energy.cpp and hessian_blocks.cpp loop over problems.
#pragma once

#include <ATen/Dispatch.h>

#include <Eigen/Dense>
#include <algorithm>
#include <array>
#include <initializer_list>
#include <memory>
#include <type_traits>
#include <vector>

#include "diffsoft/physics/model.h"

namespace diffsoft::kernels {

template <typename S, int D>
using Mat = Eigen::Matrix<S, D, D, Eigen::RowMajor>;
template <typename S, int D>
using Vec = Eigen::Matrix<S, D, 1>;
// The (d+1) x d matrix W of an element, with vec F = W^T-weighted vertex sum: F_ab = sum_j x_ja W_jb.
template <typename S, int D>
using Weights = Eigen::Matrix<S, D + 1, D, Eigen::RowMajor>;
// d2psi/dF2 over row-major vec F.
template <typename S, int D>
using Tangent = Eigen::Matrix<S, D * D, D * D>;

// What a term sums over, and so the shape of its Hessian blocks: elements ((d+1)d square blocks), muscles (2d),
// free vertices (d), or pairs of a free vertex and a collider (d, added to the vertex's block).
enum class Stencil { element, muscle, vertex, vertex_collider };

// The registered terms (terms.h): T::stencil says which loop runs T's functions, in the list's order.
template <typename... Ts>
struct TermList {
  // f(T()) for each T of the list with stencil `st`, in order.
  template <Stencil st, typename F>
  static void each(F&& f) {
    (..., apply<st, Ts>(f));
  }

 private:
  template <Stencil st, typename T, typename F>
  static void apply(F& f) {
    if constexpr (T::stencil == st) f(T());
  }
};

// The registered collider kinds (colliders.h), Collider::kind indexing them.
template <typename... Gs>
struct KindList {
  static constexpr int64_t size = sizeof...(Gs);
  // f(G()) for the kind-th G.
  template <typename F>
  static void visit(int64_t kind, F&& f) {
    int64_t i = 0;
    (..., (i++ == kind ? f(Gs()) : void()));
  }
  // f(G()) for every G, in order.
  template <typename F>
  static void each(F&& f) {
    (..., f(Gs()));
  }
};

// A parameter of the model as a problem reads it: shared by the batch (stride 0), or one slice per problem
// (stride = the slice's size). Null for an undefined or empty tensor.
template <typename S>
struct PerProblem {
  const S* data = nullptr;
  int64_t stride = 0;
  PerProblem() = default;
  // t has `dims` dimensions when shared, dims + 1 when per problem.
  PerProblem(const torch::Tensor& t, int64_t dims)
      : data(t.defined() && t.numel() ? t.data_ptr<S>() : nullptr),
        stride(t.defined() && t.dim() > dims ? t.numel() / t.size(0) : 0) {}
  const S* at(int64_t b) const { return data ? data + b * stride : nullptr; }
  S value(int64_t b) const { return data ? data[b * stride] : S(0); }
};

// A parameter's shape for one problem: up to 3 sizes, -1 for any size >= 2 (a height field's samples).
struct Shape {
  int rank = 0;
  std::array<int64_t, 3> sizes{};
  Shape() = default;
  Shape(std::initializer_list<int64_t> s) : rank(static_cast<int>(s.size())) {
    std::copy(s.begin(), s.end(), sizes.begin());
  }
};

// The most parameters a collider kind's geometry has, and the most sizes one of them has.
constexpr int kMaxGeometryParams = 4;
constexpr int kMaxGeometryDims = 2;

// One collider as one problem reads it: the contact's scalars, and pointers to the geometry's parameters with
// their sizes (those of one problem).
template <typename S>
struct ColliderParams {
  int64_t kind = 0;
  S stiffness = 0, friction = 0, friction_eps = 0;
  std::array<const S*, kMaxGeometryParams> geometry{};
  std::array<std::array<int64_t, kMaxGeometryDims>, kMaxGeometryParams> sizes{};
};

// A problem's colliders: a view of the batch's table, which the problem's View shares rather than copies.
template <typename S>
struct ColliderSpan {
  const ColliderParams<S>* data = nullptr;
  size_t count = 0;
  size_t size() const { return count; }
  const ColliderParams<S>& operator[](size_t c) const { return data[c]; }
};

// The dimensions of geometry parameter j of a collider of this kind in d dimensions, when shared by the batch
// (colliders.h's shapes; defined with the kinds in step_energy.cpp).
int64_t geometry_rank(int64_t kind, size_t j, int64_t d);

// One problem's state: the unknowns y (F, d), x0 (N, d), x0_free and x_hat (F, d), the activations (M,).
template <typename S>
struct Point {
  const S *y, *x0, *x0_free, *x_hat, *act;
};

// The data of one problem of the batch, as raw pointers into contiguous tensors, and its scalars.
template <typename S, int D>
struct View {
  using scalar = S;
  static constexpr int dim = D;
  const StepModel& m;
  int64_t n, f, e, nm;
  const int64_t *elements, *muscles, *slot;
  // Problem b's (see problem()).
  const S *mass, *dm_inv, *mu, *lam, *rest_length, *stiffness;
  S h, gravity;
  ColliderSpan<S> colliders;

  // Problem 0's view, of a batch of `batch` problems (the colliders' table has one row per problem: views of
  // the batch's problems share it, so that problem() allocates nothing).
  explicit View(const StepModel& model, int64_t batch = 1)
      : m(model),
        n(model.slot.size(0)),
        f(model.mass.size(-1)),
        e(model.elements.size(0)),
        nm(model.muscles.size(0)),
        elements(model.elements.data_ptr<int64_t>()),
        muscles(model.muscles.data_ptr<int64_t>()),
        slot(model.slot.data_ptr<int64_t>()),
        mass_(model.mass, 1),
        dm_inv_(model.Dm_inv, 3),
        mu_(model.mu, 1),
        lam_(model.lam, 1),
        rest_length_(model.rest_length, 1),
        stiffness_(model.stiffness, 1),
        h_(model.h, 0),
        gravity_(model.gravity, 0) {
    const size_t count = model.colliders.size();
    batch = std::max<int64_t>(batch, 1);
    auto table = std::make_shared<std::vector<ColliderParams<S>>>(count * batch);
    for (size_t c = 0; c < count; ++c) {
      const Collider& col = model.colliders[c];
      ColliderParams<S> shared;
      shared.kind = col.kind;
      std::vector<PerProblem<S>> params;
      for (size_t j = 0; j < col.params.size(); ++j) {
        // The contact's three scalars, then the geometry's: a parameter per problem has one more dimension than
        // the kind's shape (step_energy.cpp checked them against it).
        const int64_t dims = j < 3 ? 0 : geometry_rank(col.kind, j - 3, D);
        params.push_back(PerProblem<S>(col.params[j], dims));
        if (j >= 3)
          for (int64_t k = 0; k < dims && k < kMaxGeometryDims; ++k)
            shared.sizes[j - 3][k] = col.params[j].size(col.params[j].dim() - dims + k);
      }
      for (int64_t b = 0; b < batch; ++b) {
        ColliderParams<S>& out = (*table)[b * count + c];
        out = shared;
        auto value = [&](size_t j) { return j < params.size() ? params[j].value(b) : S(0); };
        out.stiffness = value(0), out.friction = value(1), out.friction_eps = value(2);
        for (size_t j = 3; j < params.size() && j - 3 < kMaxGeometryParams; ++j)
          out.geometry[j - 3] = params[j].at(b);
      }
    }
    collider_table_ = std::move(table);
    select(0);
  }

  // About how long one problem's kernels take (a value, its gradient and Hessian blocks, or a product with
  // them), in nanoseconds: 0.75 per entry of the blocks, about 1 us for a biped (28 triangles, 16 muscles, 26
  // vertices) on one core. It sizes the chunks of a batch's loop (core/parallel.h).
  double kernel_ns() const {
    constexpr int ND = (D + 1) * D;
    return 0.75 * double(e * ND * ND + nm * 4 * D * D + f * D * D);
  }

  // Problem b's view (b < the batch this view was made for): its own parameters where they are per problem (a
  // batch of creatures with different bodies or worlds, domain randomisation), else the shared ones.
  View problem(int64_t b) const {
    View out = *this;
    out.select(b);
    return out;
  }

  // Position of vertex i: the unknown if free, x0 if fixed.
  Vec<S, D> x(const S* y, const S* x0, int64_t i) const {
    const int64_t s = slot[i];
    return Eigen::Map<const Vec<S, D>>(s >= 0 ? y + s * D : x0 + i * D);
  }

  // The free-vertex vector u (F, d) at vertex i, 0 where i is fixed or u is null.
  Vec<S, D> free_at(const S* u, int64_t i) const {
    const int64_t s = slot[i];
    return u && s >= 0 ? Vec<S, D>(Eigen::Map<const Vec<S, D>>(u + s * D)) : Vec<S, D>::Zero();
  }

  // out (F, d) += g at vertex i if free; fixed vertices are not unknowns.
  void add_free(S* out, int64_t i, const Vec<S, D>& g) const {
    const int64_t s = slot[i];
    if (s >= 0) Eigen::Map<Vec<S, D>>(out + s * D) += g;
  }

  // out (N, d) += g at vertex i if fixed: a derivative with respect to x0, which only fixed vertices read.
  void add_fixed(S* out, int64_t i, const Vec<S, D>& g) const {
    if (slot[i] < 0) Eigen::Map<Vec<S, D>>(out + i * D) += g;
  }

  // F of element k, and its weights w.
  Mat<S, D> deformation(const S* y, const S* x0, int64_t k, Weights<S, D>& w) const {
    Eigen::Map<const Mat<S, D>> dinv(dm_inv + k * D * D);
    w.row(0) = -dinv.colwise().sum();
    w.template bottomRows<D>() = dinv;
    Mat<S, D> F = Mat<S, D>::Zero();
    for (int j = 0; j <= D; ++j) F += x(y, x0, elements[k * (D + 1) + j]) * w.row(j);
    return F;
  }

 private:
  PerProblem<S> mass_, dm_inv_, mu_, lam_, rest_length_, stiffness_;
  PerProblem<S> h_, gravity_;
  std::shared_ptr<const std::vector<ColliderParams<S>>> collider_table_;  // (batch, colliders), row-major

  void select(int64_t b) {
    mass = mass_.at(b), dm_inv = dm_inv_.at(b), mu = mu_.at(b), lam = lam_.at(b);
    rest_length = rest_length_.at(b), stiffness = stiffness_.at(b);
    h = h_.value(b), gravity = gravity_.value(b);
    const size_t count = m.colliders.size();
    colliders = {collider_table_->data() + b * count, count};
  }
};

// Calls body(S(), std::integral_constant<int, D>()) for y's floating dtype S and last dimension D (2 or 3).
template <typename F>
void dispatch(const torch::Tensor& y, F&& body) {
  const bool two = y.size(-1) == 2;
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "diffsoft_step_energy", [&] {
    if (two)
      body(scalar_t(), std::integral_constant<int, 2>());
    else
      body(scalar_t(), std::integral_constant<int, 3>());
  });
}

// The model with contiguous tensors, as View reads them.
StepModel contiguous(const StepModel& m);

// The model's topology for y's f free vertices in d dimensions, which the loops read as raw pointers (from a
// user too, through torch.ops.diffsoft): int64 elements (E, d + 1) and muscles (M, 2) indexing the slot's N
// vertices; slot (N,), each vertex's free row or -1 (fixed), the rows 0..f-1 each one vertex's; a known material.
// A ValueError (std::invalid_argument) otherwise.
void check_model(const StepModel& m, int64_t f, int64_t d);

}  // namespace diffsoft::kernels
