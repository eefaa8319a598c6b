// Fused CPU kernels of the built-in step energy; see step_energy.h for the model and the shapes.
#include "physics/step_energy.h"

#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace diffsoft {

namespace {

template <typename S, int D>
using Mat = Eigen::Matrix<S, D, D, Eigen::RowMajor>;
template <typename S, int D>
using Vec = Eigen::Matrix<S, D, 1>;

// The data of one problem of the batch, as raw pointers into contiguous tensors.
template <typename S, int D>
struct View {
  using scalar = S;
  static constexpr int dim = D;
  const StepModel& m;
  int64_t n, f, e, nm;
  const int64_t *elements, *muscles, *slot;
  const S *mass, *dm_inv, *mu, *lam, *rest_length, *stiffness;

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
        stiffness(nm ? model.stiffness.data_ptr<S>() : nullptr) {}

  // Position of vertex i: the unknown if free, x0 if fixed.
  Vec<S, D> x(const S* y, const S* x0, int64_t i) const {
    const int64_t s = slot[i];
    return Eigen::Map<const Vec<S, D>>(s >= 0 ? y + s * D : x0 + i * D);
  }

  // F of element k, and W, the (d+1) x d matrix with vec F = W^T-weighted vertex sum: F_ab = sum_j x_ja W_jb.
  Mat<S, D> deformation(const S* y, const S* x0, int64_t k, Eigen::Matrix<S, D + 1, D, Eigen::RowMajor>& w) const {
    Eigen::Map<const Mat<S, D>> dinv(dm_inv + k * D * D);
    w.row(0) = -dinv.colwise().sum();
    w.template bottomRows<D>() = dinv;
    Mat<S, D> F = Mat<S, D>::Zero();
    for (int j = 0; j <= D; ++j) F += x(y, x0, elements[k * (D + 1) + j]) * w.row(j);
    return F;
  }
};

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
Eigen::Matrix<S, D * D, D * D> det_hessian(const Mat<S, D>& F) {
  Eigen::Matrix<S, D * D, D * D> H = Eigen::Matrix<S, D * D, D * D>::Zero();
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
Mat<S, D> stress(int64_t material, const Mat<S, D>& F, S mu, S lam, Eigen::Matrix<S, D * D, D * D>* A = nullptr) {
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

template <typename S, int D>
S problem_energy(const View<S, D>& v, const S* y, const S* x0, const S* x0_free, const S* x_hat, const S* act) {
  const StepModel& m = v.m;
  S e = 0;
  Eigen::Matrix<S, D + 1, D, Eigen::RowMajor> w;
  for (int64_t k = 0; k < v.e; ++k) e += density<S, D>(m.material, v.deformation(y, x0, k, w), v.mu[k], v.lam[k]);
  for (int64_t k = 0; k < v.nm; ++k) {
    const Vec<S, D> delta = v.x(y, x0, v.muscles[2 * k]) - v.x(y, x0, v.muscles[2 * k + 1]);
    const S length = std::sqrt(delta.squaredNorm() + S(1e-6));
    const S strain = length / (act[k] * v.rest_length[k]) - 1;
    e += S(0.5) * v.stiffness[k] * strain * strain;
  }
  const S h2 = S(m.h * m.h);
  for (int64_t i = 0; i < v.n; ++i) {
    const int64_t s = v.slot[i];
    if (s < 0) continue;
    Eigen::Map<const Vec<S, D>> yi(y + s * D), xh(x_hat + s * D), xi0(x0_free + s * D);
    e += S(0.5) * v.mass[s] * (yi - xh).squaredNorm() / h2 + S(m.gravity) * v.mass[s] * (yi(1) - xi0(1));
    if (m.has_ground) {
      const S depth = std::min(yi(1) - S(m.ground), S(0));
      const S wf = S(m.friction) * std::max(S(m.eps) - (xi0(1) - S(m.ground)), S(0));
      S slip = (yi(0) - xi0(0)) * (yi(0) - xi0(0));
      if (D == 3) slip += (yi(2) - xi0(2)) * (yi(2) - xi0(2));
      e += S(m.contact_stiffness) * depth * depth + wf * slip / h2;
    }
  }
  return e;
}

template <typename S, int D>
void problem_derivatives(const View<S, D>& v, const S* y, const S* x0, const S* x0_free, const S* x_hat, const S* act,
                         S* grad,
                         S* k_el, S* k_mu, S* diag) {
  constexpr int ND = (D + 1) * D;
  const StepModel& m = v.m;
  std::fill(grad, grad + v.f * D, S(0));
  auto add_grad = [&](int64_t vertex, const Vec<S, D>& g) {
    const int64_t s = v.slot[vertex];
    if (s >= 0) Eigen::Map<Vec<S, D>>(grad + s * D) += g;
  };
  Eigen::Matrix<S, D + 1, D, Eigen::RowMajor> w;
  for (int64_t k = 0; k < v.e; ++k) {
    const Mat<S, D> F = v.deformation(y, x0, k, w);
    Eigen::Matrix<S, D * D, D * D> A;
    const Mat<S, D> P = stress<S, D>(m.material, F, v.mu[k], v.lam[k], &A);
    const Eigen::Matrix<S, D + 1, D, Eigen::RowMajor> g = w * P.transpose();  // g(j, a) = dE/dx_ja
    for (int j = 0; j <= D; ++j) add_grad(v.elements[k * (D + 1) + j], g.row(j).transpose());
    // K[(j,a),(l,c)] = sum_{b,e} W_jb A[(a,b),(c,e)] W_le
    Eigen::Map<Eigen::Matrix<S, ND, ND, Eigen::RowMajor>> K(k_el + k * ND * ND);
    for (int a = 0; a < D; ++a)
      for (int c = 0; c < D; ++c) {
        const Eigen::Matrix<S, D + 1, D + 1> block = w * A.template block<D, D>(a * D, c * D) * w.transpose();
        for (int j = 0; j <= D; ++j)
          for (int l = 0; l <= D; ++l) K(j * D + a, l * D + c) = block(j, l);
      }
  }
  for (int64_t k = 0; k < v.nm; ++k) {
    const int64_t i = v.muscles[2 * k], j = v.muscles[2 * k + 1];
    const Vec<S, D> delta = v.x(y, x0, i) - v.x(y, x0, j);
    const S length = std::sqrt(delta.squaredNorm() + S(1e-6));
    const S target = act[k] * v.rest_length[k], strain = length / target - 1, stiff = v.stiffness[k];
    const Vec<S, D> u = delta / length;
    const Vec<S, D> g = (stiff * strain / target) * u;
    add_grad(i, g);
    add_grad(j, -g);
    const Mat<S, D> uu = u * u.transpose();
    const Mat<S, D> kd = (stiff / (target * target)) * uu + (stiff * strain / (target * length)) * (Mat<S, D>::Identity() - uu);
    Eigen::Map<Eigen::Matrix<S, 2 * D, 2 * D, Eigen::RowMajor>> K(k_mu + k * 4 * D * D);
    K.template topLeftCorner<D, D>() = kd;
    K.template bottomRightCorner<D, D>() = kd;
    K.template topRightCorner<D, D>() = -kd;
    K.template bottomLeftCorner<D, D>() = -kd;
  }
  const S h2 = S(m.h * m.h);
  for (int64_t i = 0; i < v.n; ++i) {
    const int64_t s = v.slot[i];
    if (s < 0) continue;
    Eigen::Map<const Vec<S, D>> yi(y + s * D), xh(x_hat + s * D), xi0(x0_free + s * D);
    Eigen::Map<Vec<S, D>> gi(grad + s * D), di(diag + s * D);
    gi += v.mass[s] * (yi - xh) / h2;
    gi(1) += S(m.gravity) * v.mass[s];
    di.setConstant(v.mass[s] / h2);
    if (m.has_ground) {
      const S depth = std::min(yi(1) - S(m.ground), S(0));
      gi(1) += 2 * S(m.contact_stiffness) * depth;
      if (depth < 0) di(1) += 2 * S(m.contact_stiffness);
      const S wf = 2 * S(m.friction) * std::max(S(m.eps) - (xi0(1) - S(m.ground)), S(0)) / h2;
      for (int t = 0; t < D; t += 2) {  // tangential: x, and z in 3D
        gi(t) += wf * (yi(t) - xi0(t));
        di(t) += wf;
      }
    }
  }
}

// Where one problem's parameter derivatives go: pointers into the outputs of step_energy_param_grads, in the
// order of StepParams.
template <typename S>
struct ParamOut {
  S *x_hat, *x0, *x0_free, *mass, *dm_inv, *mu, *lam, *activation, *rest_length, *stiffness, *gravity, *contact,
      *friction;
};

// Derivatives of one problem's energy with respect to its parameters: weight * dE/dtheta when dir is null
// (first order), d/dtheta [grad_y E . dir] otherwise (the mixed second derivative of the adjoint's product).
// The densities are linear in (mu, lam), so psi_mu = psi(F; 1, 0) and P_mu = P(F; 1, 0). With F = Ds Dm_inv:
// dpsi/dDm_inv = Ds^T P, and for the mixed term, with dF = dDs Dm_inv the direction's deformation and
// dP = dP/dF : dF, d/dDm_inv [P : dF] = Ds^T dP + dDs^T P; a fixed vertex j of the element (its x0) gets
// P w_j, or dP w_j.
template <typename S, int D>
void problem_param_grads(const View<S, D>& v, const S* y, const S* x0, const S* x0_free, const S* x_hat,
                         const S* act, const S* dir, S weight, const ParamOut<S>& o) {
  const StepModel& m = v.m;
  const bool mixed = dir != nullptr;
  auto dir_at = [&](int64_t vertex) -> Vec<S, D> {
    const int64_t s = v.slot[vertex];
    return mixed && s >= 0 ? Vec<S, D>(Eigen::Map<const Vec<S, D>>(dir + s * D)) : Vec<S, D>::Zero();
  };
  auto add_fixed = [&](int64_t vertex, const Vec<S, D>& g) {
    if (v.slot[vertex] < 0) Eigen::Map<Vec<S, D>>(o.x0 + vertex * D) += g;
  };
  Eigen::Matrix<S, D + 1, D, Eigen::RowMajor> w;
  for (int64_t k = 0; k < v.e; ++k) {
    const int64_t* el = v.elements + k * (D + 1);
    const Mat<S, D> F = v.deformation(y, x0, k, w);
    Mat<S, D> Ds, dDs;
    for (int j = 1; j <= D; ++j) {
      Ds.col(j - 1) = v.x(y, x0, el[j]) - v.x(y, x0, el[0]);
      dDs.col(j - 1) = dir_at(el[j]) - dir_at(el[0]);
    }
    Eigen::Map<Mat<S, D>> dm(o.dm_inv + k * D * D);
    if (!mixed) {
      const Mat<S, D> P = stress<S, D>(m.material, F, v.mu[k], v.lam[k]);
      o.mu[k] += weight * density<S, D>(m.material, F, 1, 0);
      o.lam[k] += weight * density<S, D>(m.material, F, 0, 1);
      dm += weight * Ds.transpose() * P;
      for (int j = 0; j <= D; ++j) add_fixed(el[j], weight * P * w.row(j).transpose());
      continue;
    }
    Mat<S, D> dF = Mat<S, D>::Zero();
    for (int j = 0; j <= D; ++j) dF += dir_at(el[j]) * w.row(j);
    Eigen::Matrix<S, D * D, D * D> A;
    const Mat<S, D> P = stress<S, D>(m.material, F, v.mu[k], v.lam[k], &A);
    Mat<S, D> dP;
    Eigen::Map<Eigen::Matrix<S, D * D, 1>>(dP.data()) = A * Eigen::Map<const Eigen::Matrix<S, D * D, 1>>(dF.data());
    o.mu[k] += stress<S, D>(m.material, F, 1, 0).cwiseProduct(dF).sum();
    o.lam[k] += stress<S, D>(m.material, F, 0, 1).cwiseProduct(dF).sum();
    dm += Ds.transpose() * dP + dDs.transpose() * P;
    for (int j = 0; j <= D; ++j) add_fixed(el[j], dP * w.row(j).transpose());
  }
  // Muscles: E = k/2 s^2, s = l / t - 1, t = a l0; with u = delta / l, grad_delta E = (k s / t) u.
  for (int64_t k = 0; k < v.nm; ++k) {
    const int64_t i = v.muscles[2 * k], j = v.muscles[2 * k + 1];
    const Vec<S, D> delta = v.x(y, x0, i) - v.x(y, x0, j);
    const S length = std::sqrt(delta.squaredNorm() + S(1e-6)), a = act[k], l0 = v.rest_length[k];
    const S t = a * l0, strain = length / t - 1, stiff = v.stiffness[k];
    const Vec<S, D> u = delta / length;
    if (!mixed) {
      const S de_dt = -stiff * strain * length / (t * t);
      o.activation[k] += weight * de_dt * l0;
      o.rest_length[k] += weight * de_dt * a;
      o.stiffness[k] += weight * S(0.5) * strain * strain;
      const Vec<S, D> g = (weight * stiff * strain / t) * u;
      add_fixed(i, g);
      add_fixed(j, -g);
      continue;
    }
    const Vec<S, D> dd = dir_at(i) - dir_at(j);
    const S ud = u.dot(dd), dg_dt = stiff * ud * (-length / (t * t * t) - strain / (t * t));
    o.activation[k] += dg_dt * l0;
    o.rest_length[k] += dg_dt * a;
    o.stiffness[k] += strain / t * ud;
    const Mat<S, D> uu = u * u.transpose();
    const Vec<S, D> kd = (stiff / (t * t)) * uu * dd + (stiff * strain / (t * length)) * (dd - uu * dd);
    add_fixed(i, kd);
    add_fixed(j, -kd);
  }
  const S h2 = S(m.h * m.h), g = S(m.gravity);
  for (int64_t i = 0; i < v.n; ++i) {
    const int64_t s = v.slot[i];
    if (s < 0) continue;
    Eigen::Map<const Vec<S, D>> yi(y + s * D), xh(x_hat + s * D), xi0(x0_free + s * D);
    Eigen::Map<Vec<S, D>> gx_hat(o.x_hat + s * D), gx0(o.x0_free + s * D);
    const S mass = v.mass[s];
    // The per-vertex terms' parameter derivatives are linear in the "probe" p: p = weight * (y - x_hat) etc.
    // for the first order, the direction for the mixed one.
    const Vec<S, D> di = mixed ? Vec<S, D>(Eigen::Map<const Vec<S, D>>(dir + s * D)) : Vec<S, D>::Zero();
    if (!mixed) {
      gx_hat += -weight * mass * (yi - xh) / h2;
      o.mass[s] += weight * (S(0.5) * (yi - xh).squaredNorm() / h2 + g * (yi(1) - xi0(1)));
      gx0(1) += -weight * g * mass;
      *o.gravity += weight * mass * (yi(1) - xi0(1));
    } else {
      gx_hat += -mass * di / h2;
      o.mass[s] += (yi - xh).dot(di) / h2 + g * di(1);
      *o.gravity += mass * di(1);
    }
    if (!m.has_ground) continue;
    const S depth = std::min(yi(1) - S(m.ground), S(0));
    const S base = std::max(S(m.eps) - (xi0(1) - S(m.ground)), S(0)), kf = S(m.friction);
    S slip = 0, slip_dir = 0;  // |(y - x0)_t|^2 and (y - x0)_t . dir_t
    for (int c = 0; c < D; c += 2) {
      slip += (yi(c) - xi0(c)) * (yi(c) - xi0(c));
      slip_dir += (yi(c) - xi0(c)) * di(c);
    }
    if (!mixed) {
      *o.contact += weight * depth * depth;
      *o.friction += weight * base * slip / h2;
      for (int c = 0; c < D; c += 2) gx0(c) += -weight * 2 * kf * base * (yi(c) - xi0(c)) / h2;
      if (base > 0) gx0(1) += -weight * kf * slip / h2;
    } else {
      *o.contact += 2 * depth * di(1);
      *o.friction += 2 * base * slip_dir / h2;
      for (int c = 0; c < D; c += 2) gx0(c) += -2 * kf * base * di(c) / h2;
      if (base > 0) gx0(1) += -2 * kf * slip_dir / h2;
    }
  }
}

template <typename S, int D>
void problem_hvp(const View<S, D>& v, const S* k_el, const S* k_mu, const S* diag, const S* in, S* out) {
  constexpr int ND = (D + 1) * D;
  for (int64_t s = 0; s < v.f * D; ++s) out[s] = diag[s] * in[s];
  auto gather = [&](const int64_t* idx, int count, S* local) {
    for (int j = 0; j < count; ++j) {
      const int64_t s = v.slot[idx[j]];
      for (int a = 0; a < D; ++a) local[j * D + a] = s >= 0 ? in[s * D + a] : S(0);
    }
  };
  auto scatter = [&](const int64_t* idx, int count, const S* local) {
    for (int j = 0; j < count; ++j) {
      const int64_t s = v.slot[idx[j]];
      if (s >= 0)
        for (int a = 0; a < D; ++a) out[s * D + a] += local[j * D + a];
    }
  };
  Eigen::Matrix<S, ND, 1> le, re;
  for (int64_t k = 0; k < v.e; ++k) {
    gather(v.elements + k * (D + 1), D + 1, le.data());
    re.noalias() = Eigen::Map<const Eigen::Matrix<S, ND, ND, Eigen::RowMajor>>(k_el + k * ND * ND) * le;
    scatter(v.elements + k * (D + 1), D + 1, re.data());
  }
  Eigen::Matrix<S, 2 * D, 1> lm, rm;
  for (int64_t k = 0; k < v.nm; ++k) {
    gather(v.muscles + 2 * k, 2, lm.data());
    rm.noalias() = Eigen::Map<const Eigen::Matrix<S, 2 * D, 2 * D, Eigen::RowMajor>>(k_mu + k * 4 * D * D) * lm;
    scatter(v.muscles + 2 * k, 2, rm.data());
  }
}

// The Hessian's diagonal: the per-vertex terms plus the diagonals of the element and muscle blocks.
template <typename S, int D>
void problem_hessian_diagonal(const View<S, D>& v, const S* k_el, const S* k_mu, const S* diag, S* out) {
  constexpr int ND = (D + 1) * D;
  std::copy(diag, diag + v.f * D, out);
  auto add = [&](const int64_t* idx, int count, const S* block) {
    for (int j = 0; j < count; ++j) {
      const int64_t s = v.slot[idx[j]];
      if (s >= 0)
        for (int a = 0; a < D; ++a) out[s * D + a] += block[(j * D + a) * (count * D) + j * D + a];
    }
  };
  for (int64_t k = 0; k < v.e; ++k) add(v.elements + k * (D + 1), D + 1, k_el + k * ND * ND);
  for (int64_t k = 0; k < v.nm; ++k) add(v.muscles + 2 * k, 2, k_mu + k * 4 * D * D);
}

// Calls f(row, col, value) for every entry of one problem's H over its free degrees of freedom: the diagonal,
// then the element and muscle blocks (entries shared by blocks come once per block).
template <typename S, int D, typename F>
void for_each_entry(const View<S, D>& v, const S* k_el, const S* k_mu, const S* diag, F&& f) {
  constexpr int ND = (D + 1) * D;
  for (int64_t i = 0; i < v.f * D; ++i) f(i, i, double(diag[i]));
  auto add = [&](const int64_t* idx, int count, const S* block) {
    for (int j = 0; j < count; ++j) {
      const int64_t sj = v.slot[idx[j]];
      if (sj < 0) continue;
      for (int l = 0; l < count; ++l) {
        const int64_t sl = v.slot[idx[l]];
        if (sl < 0) continue;
        for (int a = 0; a < D; ++a)
          for (int c = 0; c < D; ++c) f(sj * D + a, sl * D + c, double(block[(j * D + a) * (count * D) + l * D + c]));
      }
    }
  };
  for (int64_t k = 0; k < v.e; ++k) add(v.elements + k * (D + 1), D + 1, k_el + k * ND * ND);
  for (int64_t k = 0; k < v.nm; ++k) add(v.muscles + 2 * k, 2, k_mu + k * 4 * D * D);
}

// The factor of one problem's H, or null where H is not positive definite (the solver then falls back to CG
// for this problem).
template <typename S, int D>
std::unique_ptr<Factor> problem_factor(const View<S, D>& v, const S* k_el, const S* k_mu, const S* diag) {
  std::vector<Eigen::Triplet<double>> lower;
  lower.reserve(v.f * D + v.e * (D + 1) * D * ((D + 1) * D + 1) / 2 + v.nm * D * (2 * D + 1));
  for_each_entry(v, k_el, k_mu, diag, [&](int64_t i, int64_t j, double value) {
    if (i >= j) lower.emplace_back(i, j, value);
  });
  return factor_symmetric(v.f * D, lower, v.m.factor_cache.get());
}

StepModel contiguous(const StepModel& m) {
  StepModel c = m;
  for (torch::Tensor* t : {&c.elements, &c.muscles, &c.slot, &c.mass, &c.Dm_inv, &c.mu, &c.lam, &c.rest_length,
                           &c.stiffness})
    if (t->defined()) *t = t->contiguous();
  return c;
}

void check(const StepModel& m, const StepState& s) {
  const int64_t d = s.y.size(-1);
  if (!s.y.device().is_cpu()) throw std::invalid_argument("the fused step kernels run on CPU tensors only");
  if (s.y.dim() != 3 || (d != 2 && d != 3)) throw std::invalid_argument("y must be (B, F, d) with d = 2 or 3");
  if (s.x0_free.sizes() != s.y.sizes() || s.x_hat.sizes() != s.y.sizes())
    throw std::invalid_argument("x0_free and x_hat must have the shape of y");
  if (s.x0.dim() != 3 || s.x0.size(0) != s.y.size(0) || s.x0.size(1) != m.slot.size(0) || s.x0.size(2) != d)
    throw std::invalid_argument("x0 must be (B, N, d)");
  if (m.mass.size(0) != s.y.size(1)) throw std::invalid_argument("mass must have one entry per free vertex");
  const int64_t nm = m.muscles.size(0);
  if (nm && (s.activation.dim() != 2 || s.activation.size(0) != s.y.size(0) || s.activation.size(1) != nm))
    throw std::invalid_argument("activation must be (B, M)");
  if (m.mu.numel() != m.elements.size(0) || m.lam.numel() != m.elements.size(0) ||
      m.Dm_inv.size(0) != m.elements.size(0))
    throw std::invalid_argument("mu, lam and Dm_inv must have one entry per element");
  if (nm && (m.rest_length.numel() != nm || m.stiffness.numel() != nm))
    throw std::invalid_argument("rest_length and stiffness must have one entry per muscle");
  const int64_t n = m.slot.size(0);
  for (const torch::Tensor* idx : {&m.elements, &m.muscles})
    if (idx->numel() && (idx->min().item<int64_t>() < 0 || idx->max().item<int64_t>() >= n))
      throw std::invalid_argument("element or muscle vertex index out of range");
  if (m.slot.numel() && m.slot.max().item<int64_t>() >= s.y.size(1))
    throw std::invalid_argument("slot refers to a free vertex beyond y");
  if (m.elements.size(1) != d + 1) throw std::invalid_argument("elements must be (E, d + 1)");
  if (m.material < 0 || m.material > 2) throw std::invalid_argument("unknown material code");
}

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

// Calls f(view, b, element blocks, muscle blocks, diagonal) with problem b's pointers into the blocks of
// step_energy_derivatives, for every problem of the batch, in parallel.
template <typename F>
void for_each_problem(const StepModel& m, const std::vector<torch::Tensor>& blocks, F&& f) {
  const torch::Tensor &k_el = blocks.at(1), &k_mu = blocks.at(2), &diag = blocks.at(3);
  const int64_t batch = diag.size(0), e = m.elements.size(0), nm = m.muscles.size(0);
  dispatch(diag, [&](auto s, auto dim) {
    using S = decltype(s);
    constexpr int D = decltype(dim)::value;
    constexpr int ND = (D + 1) * D;
    View<S, D> v(m);
    at::parallel_for(0, batch, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b)
        f(v, b, k_el.data_ptr<S>() + b * e * ND * ND, k_mu.data_ptr<S>() + b * nm * 4 * D * D,
          diag.data_ptr<S>() + b * v.f * D);
    });
  });
}

}  // namespace

namespace {

// Calls f(view, b, y, x0, x0_free, x_hat, activation) with problem b's pointers into the (checked) state,
// for every problem of the batch, in parallel.
template <typename F>
void for_each_state(const StepModel& model, const StepState& state, F&& f) {
  const StepModel m = contiguous(model);
  torch::Tensor y = state.y.contiguous(), x0 = state.x0.contiguous(), x0_free = state.x0_free.contiguous(),
                x_hat = state.x_hat.contiguous();
  torch::Tensor act = m.muscles.size(0) ? state.activation.contiguous() : state.activation;
  dispatch(y, [&](auto s, auto dim) {
    using S = decltype(s);
    constexpr int D = decltype(dim)::value;
    View<S, D> v(m);
    at::parallel_for(0, y.size(0), 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b)
        f(v, b, y.data_ptr<S>() + b * v.f * D, x0.data_ptr<S>() + b * v.n * D, x0_free.data_ptr<S>() + b * v.f * D,
          x_hat.data_ptr<S>() + b * v.f * D, v.nm ? act.data_ptr<S>() + b * v.nm : nullptr);
    });
  });
}

}  // namespace

torch::Tensor step_energy_value(const StepModel& model, const StepState& state) {
  check(model, state);
  torch::Tensor out = torch::empty({state.y.size(0)}, state.y.options());
  for_each_state(model, state, [&](const auto& v, int64_t b, const auto* y, const auto* x0, const auto* x0_free,
                                   const auto* x_hat, const auto* act) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    out.data_ptr<S>()[b] = problem_energy(v, y, x0, x0_free, x_hat, act);
  });
  return out;
}

std::vector<torch::Tensor> step_energy_derivatives(const StepModel& model, const StepState& state) {
  check(model, state);
  const torch::Tensor& y = state.y;
  const int64_t batch = y.size(0), d = y.size(-1), e = model.elements.size(0), nm = model.muscles.size(0);
  torch::Tensor grad = torch::empty(y.sizes(), y.options()), diag = torch::empty(y.sizes(), y.options());
  torch::Tensor k_el = torch::empty({batch, e, (d + 1) * d, (d + 1) * d}, y.options());
  torch::Tensor k_mu = torch::empty({batch, nm, 2 * d, 2 * d}, y.options());
  for_each_state(model, state, [&](const auto& v, int64_t b, const auto* y, const auto* x0, const auto* x0_free,
                                   const auto* x_hat, const auto* act) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    constexpr int D = std::decay_t<decltype(v)>::dim, ND = (D + 1) * D;
    problem_derivatives(v, y, x0, x0_free, x_hat, act, grad.data_ptr<S>() + b * v.f * D,
                        k_el.data_ptr<S>() + b * e * ND * ND, k_mu.data_ptr<S>() + b * nm * 4 * D * D,
                        diag.data_ptr<S>() + b * v.f * D);
  });
  return {grad, k_el, k_mu, diag};
}

std::vector<torch::Tensor> step_energy_param_grads(const StepModel& model, const StepState& state,
                                                   const torch::Tensor& weight, const torch::Tensor& dir) {
  check(model, state);
  const torch::Tensor& y = state.y;
  const bool mixed = dir.defined();
  if (mixed && (dir.sizes() != y.sizes() || dir.scalar_type() != y.scalar_type() || !dir.device().is_cpu()))
    throw std::invalid_argument("dir must be a CPU tensor with the shape and dtype of y");
  if (!mixed && (weight.dim() != 1 || weight.size(0) != y.size(0) || weight.scalar_type() != y.scalar_type()))
    throw std::invalid_argument("weight must be (B,), one weight per problem, in y's dtype");
  const int64_t b = y.size(0), f = y.size(1), d = y.size(2), n = model.slot.size(0), e = model.elements.size(0),
                nm = model.muscles.size(0);
  auto zeros = [&](at::IntArrayRef shape) { return torch::zeros(shape, y.options()); };
  std::vector<torch::Tensor> out = {zeros({b, f, d}), zeros({b, n, d}), zeros({b, f, d}), zeros({b, f}),
                                    zeros({b, e, d, d}), zeros({b, e}), zeros({b, e}), zeros({b, nm}),
                                    zeros({b, nm}), zeros({b, nm}), zeros({b}), zeros({b}), zeros({b})};
  torch::Tensor w = mixed ? torch::Tensor() : weight.contiguous();
  torch::Tensor dr = mixed ? dir.contiguous() : torch::Tensor();
  for_each_state(model, state, [&](const auto& v, int64_t p, const auto* y, const auto* x0, const auto* x0_free,
                                   const auto* x_hat, const auto* act) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    auto slice = [&](int k, int64_t per_problem) { return out[k].data_ptr<S>() + p * per_problem; };
    const int64_t D = std::decay_t<decltype(v)>::dim;
    const ParamOut<S> o{slice(0, f * D), slice(1, n * D), slice(2, f * D), slice(3, f),  slice(4, e * D * D),
                        slice(5, e),     slice(6, e),     slice(7, nm),    slice(8, nm), slice(9, nm),
                        slice(10, 1),    slice(11, 1),    slice(12, 1)};
    problem_param_grads(v, y, x0, x0_free, x_hat, act, mixed ? dr.data_ptr<S>() + p * f * D : nullptr,
                        mixed ? S(1) : w.data_ptr<S>()[p], o);
  });
  return out;
}

torch::Tensor step_energy_hvp(const StepModel& model, const std::vector<torch::Tensor>& derivatives,
                              const torch::Tensor& v_in) {
  const StepModel m = contiguous(model);
  torch::Tensor vin = v_in.contiguous();
  const torch::Tensor& diag = derivatives.at(3);
  if (vin.sizes() != diag.sizes() || vin.scalar_type() != diag.scalar_type() || !vin.device().is_cpu())
    throw std::invalid_argument("v must be a CPU tensor with the shape and dtype of the gradient");
  torch::Tensor out = torch::empty_like(vin);
  for_each_problem(m, derivatives, [&](const auto& v, int64_t b, const auto* k_el, const auto* k_mu, const auto* d) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    const int64_t offset = b * v.f * std::decay_t<decltype(v)>::dim;
    problem_hvp(v, k_el, k_mu, d, vin.data_ptr<S>() + offset, out.data_ptr<S>() + offset);
  });
  return out;
}

torch::Tensor step_energy_hessian_diagonal(const StepModel& model, const std::vector<torch::Tensor>& derivatives) {
  const StepModel m = contiguous(model);
  torch::Tensor out = torch::empty_like(derivatives.at(3));
  for_each_problem(m, derivatives, [&](const auto& v, int64_t b, const auto* k_el, const auto* k_mu, const auto* d) {
    using S = typename std::decay_t<decltype(v)>::scalar;
    problem_hessian_diagonal(v, k_el, k_mu, d, out.data_ptr<S>() + b * v.f * std::decay_t<decltype(v)>::dim);
  });
  return out;
}

DirectEnergy step_direct_energy(const StepModel& model, const StepState& state, bool factorize,
                                const std::vector<int64_t>& param_slots,
                                const std::vector<std::vector<int64_t>>& param_shapes) {
  if (param_slots.size() != param_shapes.size() ||
      std::any_of(param_slots.begin(), param_slots.end(), [](int64_t k) { return k < 0 || k >= kStepParams; }))
    throw std::invalid_argument("param_slots must name step parameters (0 to 12), one per shape in param_shapes");
  auto m = std::make_shared<const StepModel>(contiguous(model));
  auto st = std::make_shared<const StepState>(
      StepState{torch::Tensor(), state.x0.contiguous(), state.x0_free.contiguous(), state.x_hat.contiguous(),
                m->muscles.size(0) ? state.activation.contiguous() : state.activation});
  const std::vector<int64_t> shape = state.x0_free.sizes().vec();
  auto state_at = [st, shape](const torch::Tensor& x_rows) {
    StepState s = *st;
    s.y = x_rows.view(shape);
    return s;
  };
  DirectEnergy direct;
  direct.value = [m, state_at](const torch::Tensor& x_rows) { return step_energy_value(*m, state_at(x_rows)); };
  direct.derivatives = [m, state_at, shape, factorize](const torch::Tensor& x_rows) {
    const StepState s = state_at(x_rows);
    auto blocks = std::make_shared<const std::vector<torch::Tensor>>(step_energy_derivatives(*m, s));
    auto hvp = [m, blocks, shape](const torch::Tensor& v) {
      return step_energy_hvp(*m, *blocks, v.view(shape)).view({shape[0], -1});
    };
    // Jacobi preconditioner: |diag H|, floored so that it stays positive definite where a diagonal entry
    // vanishes or is negative (compressed elements, contact switching off). Built on first use: with a
    // factorization, CG (and so the preconditioner) is only a fallback.
    auto d = std::make_shared<torch::Tensor>();
    auto precondition = [m, blocks, shape, d](const torch::Tensor& r) {
      if (!d->defined()) {
        torch::Tensor diag = step_energy_hessian_diagonal(*m, *blocks).abs().view({shape[0], -1});
        *d = torch::max(diag, 1e-8 * diag.amax(1, true) + std::numeric_limits<double>::min());
      }
      return r / *d;
    };
    DirectDerivatives out;
    out.energy = step_energy_value(*m, s);
    out.grad = (*blocks)[0].view({shape[0], -1});
    out.hvp = hvp;
    out.precondition = precondition;
    if (factorize) {
      auto factors = std::make_shared<LazyFactors>(
          shape[0], [m, blocks](const std::vector<char>& need, std::vector<std::unique_ptr<Factor>>& out) {
            for_each_problem(*m, *blocks, [&](const auto& v, int64_t r, const auto* k_el, const auto* k_mu,
                                              const auto* d) {
              if (need[r]) out[r] = problem_factor(v, k_el, k_mu, d);
            });
          });
      out.solve = [factors](const torch::Tensor& b) { return factors->solve(b); };
      out.factorizations = [factors] { return factors->count(); };
    }
    return out;
  };
  if (!param_slots.empty()) {
    direct.mixed_vjp = [m, state_at, shape, param_slots, param_shapes](const torch::Tensor& x_rows,
                                                                       const torch::Tensor& w_rows,
                                                                       const std::vector<size_t>& wanted) {
      std::vector<torch::Tensor> grads = step_energy_param_grads(*m, state_at(x_rows), {}, w_rows.view(shape));
      std::vector<torch::Tensor> out;
      for (size_t k : wanted) out.push_back(at::sum_to(grads[param_slots.at(k)], param_shapes.at(k)));
      return out;
    };
  }
  return direct;
}

}  // namespace diffsoft
