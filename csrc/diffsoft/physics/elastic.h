// The elastic term of one element k: psi(F_k; mu_k, lam_k) with F = Ds Dm_inv, Ds the edge vectors of the
// element's current positions. F is linear in the element's vertices, vec F = B x_e, so the element's
// Hessian block is B^T (dP/dF) B. Parameters: Dm_inv, mu, lam, and x0 (the fixed vertices' positions).
#pragma once

#include "diffsoft/physics/materials.h"

namespace diffsoft::kernels {

struct Elastic {
  static constexpr Stencil stencil = Stencil::element;

  template <typename S, int D>
  static S energy(const View<S, D>& v, const Point<S>& pt, int64_t k) {
    Weights<S, D> w;
    return density<S, D>(v.m.material, v.deformation(pt.y, pt.x0, k, w), v.mu[k], v.lam[k]);
  }

  // Adds the element's gradient to grad (F, d) and its ((d+1)d)^2 block K, row-major, to block.
  template <typename S, int D>
  static void derivatives(const View<S, D>& v, const Point<S>& pt, int64_t k, S* grad, S* block) {
    constexpr int ND = (D + 1) * D;
    Weights<S, D> w;
    const Mat<S, D> F = v.deformation(pt.y, pt.x0, k, w);
    Tangent<S, D> A;
    const Mat<S, D> P = stress<S, D>(v.m.material, F, v.mu[k], v.lam[k], &A);
    const Weights<S, D> g = w * P.transpose();  // g(j, a) = dE/dx_ja
    for (int j = 0; j <= D; ++j) v.add_free(grad, v.elements[k * (D + 1) + j], g.row(j).transpose());
    // K[(j,a),(l,c)] = sum_{b,e} W_jb A[(a,b),(c,e)] W_le
    Eigen::Map<Eigen::Matrix<S, ND, ND, Eigen::RowMajor>> K(block);
    for (int a = 0; a < D; ++a)
      for (int c = 0; c < D; ++c) {
        const Eigen::Matrix<S, D + 1, D + 1> b = w * A.template block<D, D>(a * D, c * D) * w.transpose();
        for (int j = 0; j <= D; ++j)
          for (int l = 0; l <= D; ++l) K(j * D + a, l * D + c) += b(j, l);
      }
  }

  // The element's parameter derivatives, added to o (this problem's slices): weight * dE/dtheta when dir is
  // null (first order), d/dtheta [grad_y E . dir] otherwise (the mixed second derivative of the adjoint's
  // product). The densities are linear in (mu, lam), so psi_mu = psi(F; 1, 0) and P_mu = P(F; 1, 0). With
  // F = Ds Dm_inv: dpsi/dDm_inv = Ds^T P, and for the mixed term, with dF = dDs Dm_inv the direction's
  // deformation and dP = dP/dF : dF, d/dDm_inv [P : dF] = Ds^T dP + dDs^T P; a fixed vertex j of the element
  // (its x0) gets P w_j, or dP w_j.
  template <typename S, int D>
  static void param_grads(const View<S, D>& v, const Point<S>& pt, int64_t k, const S* dir, S weight,
                          const StepParams<S*>& o) {
    const S *y = pt.y, *x0 = pt.x0;
    const int64_t material = v.m.material;
    const int64_t* el = v.elements + k * (D + 1);
    Weights<S, D> w;
    const Mat<S, D> F = v.deformation(y, x0, k, w);
    Mat<S, D> Ds, dDs;
    for (int j = 1; j <= D; ++j) {
      Ds.col(j - 1) = v.x(y, x0, el[j]) - v.x(y, x0, el[0]);
      dDs.col(j - 1) = v.free_at(dir, el[j]) - v.free_at(dir, el[0]);
    }
    S* mu = o[StepParam::mu] + k;
    S* lam = o[StepParam::lam] + k;
    Eigen::Map<Mat<S, D>> dm(o[StepParam::Dm_inv] + k * D * D);
    if (!dir) {
      const Mat<S, D> P = stress<S, D>(material, F, v.mu[k], v.lam[k]);
      *mu += weight * density<S, D>(material, F, 1, 0);
      *lam += weight * density<S, D>(material, F, 0, 1);
      dm += weight * Ds.transpose() * P;
      for (int j = 0; j <= D; ++j) v.add_fixed(o[StepParam::x0], el[j], weight * P * w.row(j).transpose());
      return;
    }
    Mat<S, D> dF = Mat<S, D>::Zero();
    for (int j = 0; j <= D; ++j) dF += v.free_at(dir, el[j]) * w.row(j);
    Tangent<S, D> A;
    const Mat<S, D> P = stress<S, D>(material, F, v.mu[k], v.lam[k], &A);
    Mat<S, D> dP;
    Eigen::Map<Eigen::Matrix<S, D * D, 1>>(dP.data()) =
        A * Eigen::Map<const Eigen::Matrix<S, D * D, 1>>(dF.data());
    *mu += stress<S, D>(material, F, 1, 0).cwiseProduct(dF).sum();
    *lam += stress<S, D>(material, F, 0, 1).cwiseProduct(dF).sum();
    dm += Ds.transpose() * dP + dDs.transpose() * P;
    for (int j = 0; j <= D; ++j) v.add_fixed(o[StepParam::x0], el[j], dP * w.row(j).transpose());
  }
};

}  // namespace diffsoft::kernels
