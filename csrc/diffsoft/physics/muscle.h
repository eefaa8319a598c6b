// The term of one muscle k between vertices i and j: E = k/2 s^2 with the strain s = l / t - 1, the target
// length t = a l0 (activation times rest length) and l = sqrt(|x_i - x_j|^2 + kMuscleLengthFloor). With
// delta = x_i - x_j and u = delta / l: grad_delta E = (k s / t) u, and the Hessian in delta,
// (k / t^2) u u^T + (k s / (t l)) (I - u u^T), enters the 2d x 2d block as [kd, -kd; -kd, kd]. Parameters:
// activation, muscle_rest_length, muscle_stiffness, and x0 (fixed ends).
#pragma once

#include <cmath>

#include "diffsoft/physics/kernels.h"

namespace diffsoft::kernels {

struct Muscle {
  static constexpr Stencil stencil = Stencil::muscle;

  // delta = x_i - x_j and l of muscle k.
  template <typename S, int D>
  static S length(const View<S, D>& v, const Point<S>& pt, int64_t k, Vec<S, D>& delta) {
    delta = v.x(pt.y, pt.x0, v.muscles[2 * k]) - v.x(pt.y, pt.x0, v.muscles[2 * k + 1]);
    return std::sqrt(delta.squaredNorm() + S(kMuscleLengthFloor));
  }

  template <typename S, int D>
  static S energy(const View<S, D>& v, const Point<S>& pt, int64_t k) {
    Vec<S, D> delta;
    const S l = length(v, pt, k, delta);
    const S strain = l / (pt.act[k] * v.rest_length[k]) - 1;
    return S(0.5) * v.stiffness[k] * strain * strain;
  }

  // Adds the muscle's gradient to grad (F, d) and its (2d)^2 block, row-major, to block.
  template <typename S, int D>
  static void derivatives(const View<S, D>& v, const Point<S>& pt, int64_t k, S* grad, S* block) {
    const int64_t i = v.muscles[2 * k], j = v.muscles[2 * k + 1];
    Vec<S, D> delta;
    const S l = length(v, pt, k, delta);
    const S target = pt.act[k] * v.rest_length[k], strain = l / target - 1, stiff = v.stiffness[k];
    const Vec<S, D> u = delta / l;
    const Vec<S, D> g = (stiff * strain / target) * u;
    v.add_free(grad, i, g);
    v.add_free(grad, j, -g);
    const Mat<S, D> uu = u * u.transpose();
    const Mat<S, D> kd =
        (stiff / (target * target)) * uu + (stiff * strain / (target * l)) * (Mat<S, D>::Identity() - uu);
    Eigen::Map<Eigen::Matrix<S, 2 * D, 2 * D, Eigen::RowMajor>> K(block);
    K.template topLeftCorner<D, D>() += kd;
    K.template bottomRightCorner<D, D>() += kd;
    K.template topRightCorner<D, D>() -= kd;
    K.template bottomLeftCorner<D, D>() -= kd;
  }

  // The muscle's parameter derivatives, added to o; weight and dir as in Elastic::param_grads. The first order
  // goes through t: dE/dt = -k s l / t^2; the mixed one differentiates grad_delta E . ddelta = (k s / t) u . ddelta.
  template <typename S, int D>
  static void param_grads(const View<S, D>& v, const Point<S>& pt, int64_t k, const S* dir, S weight,
                          const StepParams<S*>& o) {
    const int64_t i = v.muscles[2 * k], j = v.muscles[2 * k + 1];
    Vec<S, D> delta;
    const S l = length(v, pt, k, delta), a = pt.act[k], l0 = v.rest_length[k];
    const S t = a * l0, strain = l / t - 1, stiff = v.stiffness[k];
    const Vec<S, D> u = delta / l;
    S* activation = o[StepParam::activation] + k;
    S* rest_length = o[StepParam::muscle_rest_length] + k;
    S* stiffness = o[StepParam::muscle_stiffness] + k;
    S* fixed = o[StepParam::x0];
    if (!dir) {
      const S de_dt = -stiff * strain * l / (t * t);
      *activation += weight * de_dt * l0;
      *rest_length += weight * de_dt * a;
      *stiffness += weight * S(0.5) * strain * strain;
      const Vec<S, D> g = (weight * stiff * strain / t) * u;
      v.add_fixed(fixed, i, g);
      v.add_fixed(fixed, j, -g);
      return;
    }
    const Vec<S, D> dd = v.free_at(dir, i) - v.free_at(dir, j);
    const S ud = u.dot(dd), dg_dt = stiff * ud * (-l / (t * t * t) - strain / (t * t));
    *activation += dg_dt * l0;
    *rest_length += dg_dt * a;
    *stiffness += strain / t * ud;
    const Mat<S, D> uu = u * u.transpose();
    const Vec<S, D> kd = (stiff / (t * t)) * uu * dd + (stiff * strain / (t * l)) * (dd - uu * dd);
    v.add_fixed(fixed, i, kd);
    v.add_fixed(fixed, j, -kd);
  }
};

}  // namespace diffsoft::kernels
