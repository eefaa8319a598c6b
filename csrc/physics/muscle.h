// The term of one muscle k between vertices i and j: E = k/2 s^2 with the strain s = l / t - 1, the target
// length t = a l0 (activation times rest length) and l = sqrt(|x_i - x_j|^2 + kMuscleLengthFloor). With
// delta = x_i - x_j and u = delta / l: grad_delta E = (k s / t) u, and the Hessian in delta,
// (k / t^2) u u^T + (k s / (t l)) (I - u u^T), enters the 2d x 2d block as [kd, -kd; -kd, kd].
#pragma once

#include <cmath>

#include "physics/kernels.h"

namespace diffsoft::kernels {

// delta = x_i - x_j and l of muscle k.
template <typename S, int D>
S muscle_length(const View<S, D>& v, const S* y, const S* x0, int64_t k, Vec<S, D>& delta) {
  delta = v.x(y, x0, v.muscles[2 * k]) - v.x(y, x0, v.muscles[2 * k + 1]);
  return std::sqrt(delta.squaredNorm() + S(kMuscleLengthFloor));
}

template <typename S, int D>
S muscle_energy(const View<S, D>& v, const S* y, const S* x0, const S* act, int64_t k) {
  Vec<S, D> delta;
  const S length = muscle_length(v, y, x0, k, delta);
  const S strain = length / (act[k] * v.rest_length[k]) - 1;
  return S(0.5) * v.stiffness[k] * strain * strain;
}

// Adds the muscle's gradient to grad (F, d) and writes its (2d)^2 block, row-major.
template <typename S, int D>
void muscle_derivatives(const View<S, D>& v, const S* y, const S* x0, const S* act, int64_t k, S* grad, S* block) {
  const int64_t i = v.muscles[2 * k], j = v.muscles[2 * k + 1];
  Vec<S, D> delta;
  const S length = muscle_length(v, y, x0, k, delta);
  const S target = act[k] * v.rest_length[k], strain = length / target - 1, stiff = v.stiffness[k];
  const Vec<S, D> u = delta / length;
  const Vec<S, D> g = (stiff * strain / target) * u;
  v.add_free(grad, i, g);
  v.add_free(grad, j, -g);
  const Mat<S, D> uu = u * u.transpose();
  const Mat<S, D> kd =
      (stiff / (target * target)) * uu + (stiff * strain / (target * length)) * (Mat<S, D>::Identity() - uu);
  Eigen::Map<Eigen::Matrix<S, 2 * D, 2 * D, Eigen::RowMajor>> K(block);
  K.template topLeftCorner<D, D>() = kd;
  K.template bottomRightCorner<D, D>() = kd;
  K.template topRightCorner<D, D>() = -kd;
  K.template bottomLeftCorner<D, D>() = -kd;
}

// The muscle's parameter derivatives, added to o; weight and dir as in elastic_param_grads. The first order
// goes through t: dE/dt = -k s l / t^2; the mixed one differentiates grad_delta E . ddelta = (k s / t) u . ddelta.
template <typename S, int D>
void muscle_param_grads(const View<S, D>& v, const S* y, const S* x0, const S* act, int64_t k, const S* dir,
                        S weight, const StepParams<S*>& o) {
  const int64_t i = v.muscles[2 * k], j = v.muscles[2 * k + 1];
  Vec<S, D> delta;
  const S length = muscle_length(v, y, x0, k, delta), a = act[k], l0 = v.rest_length[k];
  const S t = a * l0, strain = length / t - 1, stiff = v.stiffness[k];
  const Vec<S, D> u = delta / length;
  S* activation = o[StepParam::activation] + k;
  S* rest_length = o[StepParam::muscle_rest_length] + k;
  S* stiffness = o[StepParam::muscle_stiffness] + k;
  S* fixed = o[StepParam::x0];
  if (!dir) {
    const S de_dt = -stiff * strain * length / (t * t);
    *activation += weight * de_dt * l0;
    *rest_length += weight * de_dt * a;
    *stiffness += weight * S(0.5) * strain * strain;
    const Vec<S, D> g = (weight * stiff * strain / t) * u;
    v.add_fixed(fixed, i, g);
    v.add_fixed(fixed, j, -g);
    return;
  }
  const Vec<S, D> dd = v.free_at(dir, i) - v.free_at(dir, j);
  const S ud = u.dot(dd), dg_dt = stiff * ud * (-length / (t * t * t) - strain / (t * t));
  *activation += dg_dt * l0;
  *rest_length += dg_dt * a;
  *stiffness += strain / t * ud;
  const Mat<S, D> uu = u * u.transpose();
  const Vec<S, D> kd = (stiff / (t * t)) * uu * dd + (stiff * strain / (t * length)) * (dd - uu * dd);
  v.add_fixed(fixed, i, kd);
  v.add_fixed(fixed, j, -kd);
}

}  // namespace diffsoft::kernels
