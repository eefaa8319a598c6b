// The elastic materials as functions of F: psi(I1, J) with I1 = tr F^T F and J = det F, its first
// Piola-Kirchhoff stress P = 2 psi_I1 F + psi_J C (C = dJ/dF, the cofactor) and its tangent
// dP/dF = 2 psi_I1 Id + 4 psi_I1I1 F (x) F + psi_JJ C (x) C + psi_J d2J/dF2, for the three material codes of
// StepModel::material. mu and lam have the element's weight folded in; every density is linear in (mu, lam).
#pragma once

#include <cmath>
#include <limits>

#include "diffsoft/physics/kernels.h"

namespace diffsoft::kernels {

// (I1 - d, J - 1) from G = F - I, so that both keep a round-off relative to the strain, as the reference.
template <typename S, int D>
void strain_invariants(const Mat<S, D>& F, S& i1, S& dj) {
  Mat<S, D> G = F - Mat<S, D>::Identity();
  const S tr = G.trace();
  i1 = G.squaredNorm() + 2 * tr;
  dj = tr + G.determinant();
  if (D == 3) dj += S(0.5) * (tr * tr - G.cwiseProduct(G.transpose()).sum());
}

template <typename S, int D>
S density(int64_t material, const Mat<S, D>& F, S mu, S lam) {
  S i1, dj;
  strain_invariants<S, D>(F, i1, dj);
  if (material == 0) {
    const S q = dj - S(0.5) * dj * dj;
    return S(0.5) * mu * i1 - mu * q + S(0.5) * lam * q * q;
  }
  if (material == 1) {
    if (!(dj > -1)) return std::numeric_limits<S>::infinity();
    const S lj = std::log1p(dj);
    return S(0.5) * mu * i1 - mu * lj + S(0.5) * lam * lj * lj;
  }
  const S d = D, mu_s = (d + 1) / d * mu, lam_s = lam + (d * (d + 1) - 2) / (d * (d + 1)) * mu;
  return S(0.5) * mu_s * i1 + S(0.5) * lam_s * dj * (dj - 2 * mu / lam_s) - S(0.5) * mu_s * std::log1p(i1 / (d + 1));
}

// psi_I1, psi_I1I1, psi_J, psi_JJ of each material at F.
template <typename S, int D>
void invariant_derivatives(int64_t material, const Mat<S, D>& F, S mu, S lam, S out[4]) {
  const S J = F.determinant();
  if (material == 0) {
    const S dj = J - 1, q = dj - S(0.5) * dj * dj, dq = 1 - dj;
    out[0] = S(0.5) * mu, out[1] = 0, out[2] = (lam * q - mu) * dq, out[3] = mu - lam * q + lam * dq * dq;
  } else if (material == 1) {
    const S jc = J > 0 ? J : S(1), lj = std::log(jc);
    out[0] = S(0.5) * mu, out[1] = 0, out[2] = (lam * lj - mu) / jc, out[3] = (mu + lam - lam * lj) / (jc * jc);
  } else {
    const S d = D, mu_s = (d + 1) / d * mu, lam_s = lam + (d * (d + 1) - 2) / (d * (d + 1)) * mu;
    const S r = 1 / (F.squaredNorm() + 1);
    out[0] = S(0.5) * mu_s * (1 - r), out[1] = S(0.5) * mu_s * r * r, out[2] = lam_s * (J - 1 - mu / lam_s),
    out[3] = lam_s;
  }
}

template <typename S, int D>
Mat<S, D> cofactor(const Mat<S, D>& F) {
  Mat<S, D> C;
  if constexpr (D == 2) {
    C << F(1, 1), -F(1, 0), -F(0, 1), F(0, 0);
  } else {
    C.row(0) = F.row(1).cross(F.row(2));
    C.row(1) = F.row(2).cross(F.row(0));
    C.row(2) = F.row(0).cross(F.row(1));
  }
  return C;
}

// d2J/dF2 over row-major vec F.
template <typename S, int D>
Tangent<S, D> det_hessian(const Mat<S, D>& F) {
  Tangent<S, D> H = Tangent<S, D>::Zero();
  if constexpr (D == 2) {
    H(0, 3) = H(3, 0) = 1;
    H(1, 2) = H(2, 1) = -1;
  } else {
    // H[(a,b),(c,e)] = eps_acm eps_ben F_mn: nonzero only for a != c and b != e.
    auto sign = [](int i, int j) { return ((j - i + 3) % 3 == 1) ? 1 : -1; };  // eps_{i j k}, k the third
    for (int a = 0; a < 3; ++a)
      for (int c = 0; c < 3; ++c) {
        if (a == c) continue;
        const int m = 3 - a - c;
        for (int b = 0; b < 3; ++b)
          for (int e = 0; e < 3; ++e) {
            if (b == e) continue;
            H(a * 3 + b, c * 3 + e) = S(sign(a, c) * sign(b, e)) * F(m, 3 - b - e);
          }
      }
  }
  return H;
}

// First Piola-Kirchhoff stress P = dpsi/dF and, if A is given, dP/dF over row-major vec F.
template <typename S, int D>
Mat<S, D> stress(int64_t material, const Mat<S, D>& F, S mu, S lam, Tangent<S, D>* A = nullptr) {
  S dpsi[4];
  invariant_derivatives<S, D>(material, F, mu, lam, dpsi);
  const Mat<S, D> C = cofactor<S, D>(F);
  if (A) {
    Eigen::Map<const Eigen::Matrix<S, D * D, 1>> f(F.data()), c(C.data());
    *A = dpsi[3] * c * c.transpose() + dpsi[2] * det_hessian<S, D>(F);
    A->diagonal().array() += 2 * dpsi[0];
    if (dpsi[1] != 0) *A += 4 * dpsi[1] * f * f.transpose();
  }
  return 2 * dpsi[0] * F + dpsi[2] * C;
}

}  // namespace diffsoft::kernels
