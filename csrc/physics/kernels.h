// Internal to the physics kernels: Eigen aliases, one problem of a batch as raw pointers (View), and the
// dispatch over dtype and dimension. The term headers (elastic.h, muscle.h, inertia.h, contact.h) work on a
// View; step_energy.cpp and hessian_blocks.cpp loop over problems.
#pragma once

#include <ATen/Dispatch.h>

#include <Eigen/Dense>
#include <type_traits>

#include "physics/model.h"

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

// The data of one problem of the batch, as raw pointers into contiguous tensors.
template <typename S, int D>
struct View {
  using scalar = S;
  static constexpr int dim = D;
  const StepModel& m;
  int64_t n, f, e, nm;
  const int64_t *elements, *muscles, *slot;
  const S *mass, *dm_inv, *mu, *lam, *rest_length, *stiffness;
  int64_t material_stride;  // e when the Lame parameters are per problem, (B, E); 0 when shared, (E,)

  explicit View(const StepModel& model)
      : m(model),
        n(model.slot.size(0)),
        f(model.mass.size(0)),
        e(model.elements.size(0)),
        nm(model.muscles.size(0)),
        elements(model.elements.data_ptr<int64_t>()),
        muscles(model.muscles.data_ptr<int64_t>()),
        slot(model.slot.data_ptr<int64_t>()),
        mass(model.mass.data_ptr<S>()),
        dm_inv(model.Dm_inv.data_ptr<S>()),
        mu(model.mu.data_ptr<S>()),
        lam(model.lam.data_ptr<S>()),
        rest_length(nm ? model.rest_length.data_ptr<S>() : nullptr),
        stiffness(nm ? model.stiffness.data_ptr<S>() : nullptr),
        material_stride(model.mu.dim() == 2 ? e : 0) {}

  // Problem b's view: its own Lame parameters when they are per problem (a batch of creatures of different
  // materials, domain randomisation), else the shared ones.
  View problem(int64_t b) const {
    View out = *this;
    out.mu += b * material_stride;
    out.lam += b * material_stride;
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

}  // namespace diffsoft::kernels
