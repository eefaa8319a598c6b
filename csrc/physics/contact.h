// Ground contact and friction of one free vertex s (only with a ground): k_c min(y_s,y - ground, 0)^2, a
// penalty on the depth below the ground, plus w_s |(y_s - x0_s)_t / h|^2 over the tangential components t (x,
// and z in 3D), w_s = k_f max(eps - (x0_s,y - ground), 0). The friction weight depends on the start of the step
// only, so the term is quadratic in y: a lagged friction, whose Hessian is diagonal like the contact's.
#pragma once

#include <algorithm>

#include "physics/kernels.h"

namespace diffsoft::kernels {

template <typename S, int D>
S contact_energy(const View<S, D>& v, const S* y, const S* x0_free, int64_t s) {
  const S h2 = v.h * v.h;
  Eigen::Map<const Vec<S, D>> yi(y + s * D), xi0(x0_free + s * D);
  const S depth = std::min(yi(1) - v.ground, S(0));
  const S wf = v.friction * std::max(v.friction_eps - (xi0(1) - v.ground), S(0));
  S slip = (yi(0) - xi0(0)) * (yi(0) - xi0(0));
  if (D == 3) slip += (yi(2) - xi0(2)) * (yi(2) - xi0(2));
  return v.contact_stiffness * depth * depth + wf * slip / h2;
}

// Adds the vertex's gradient to grad (F, d) and its Hessian to diag (F, d).
template <typename S, int D>
void contact_derivatives(const View<S, D>& v, const S* y, const S* x0_free, int64_t s, S* grad, S* diag) {
  const S h2 = v.h * v.h;
  Eigen::Map<const Vec<S, D>> yi(y + s * D), xi0(x0_free + s * D);
  Eigen::Map<Vec<S, D>> gi(grad + s * D), di(diag + s * D);
  const S depth = std::min(yi(1) - v.ground, S(0));
  gi(1) += 2 * v.contact_stiffness * depth;
  if (depth < 0) di(1) += 2 * v.contact_stiffness;
  const S wf = 2 * v.friction * std::max(v.friction_eps - (xi0(1) - v.ground), S(0)) / h2;
  for (int t = 0; t < D; t += 2) {  // tangential: x, and z in 3D
    gi(t) += wf * (yi(t) - xi0(t));
    di(t) += wf;
  }
}

// The vertex's parameter derivatives, added to o; weight and dir as in elastic_param_grads. x0 enters through
// the slip and, while the vertex starts within eps of the ground, through the friction weight; so do the
// ground's height (also through the depth) and eps. The friction term is homogeneous of degree -2 in h.
template <typename S, int D>
void contact_param_grads(const View<S, D>& v, const S* y, const S* x0_free, int64_t s, const S* dir, S weight,
                         const StepParams<S*>& o) {
  const S h = v.h, h2 = h * h;
  Eigen::Map<const Vec<S, D>> yi(y + s * D), xi0(x0_free + s * D);
  Eigen::Map<Vec<S, D>> gx0(o[StepParam::x0_free] + s * D);
  S* contact = o[StepParam::contact_stiffness];
  S* friction = o[StepParam::friction];
  S* step = o[StepParam::h];
  S* ground = o[StepParam::ground];
  S* eps = o[StepParam::friction_eps];
  const Vec<S, D> di = dir ? Vec<S, D>(Eigen::Map<const Vec<S, D>>(dir + s * D)) : Vec<S, D>::Zero();
  const S depth = std::min(yi(1) - v.ground, S(0));
  const S base = std::max(v.friction_eps - (xi0(1) - v.ground), S(0)), kf = v.friction, kc = v.contact_stiffness;
  const S in_band = base > 0 ? S(1) : S(0);  // d base / d eps = d base / d ground = -d base / d x0_y
  S slip = 0, slip_dir = 0;  // |(y - x0)_t|^2 and (y - x0)_t . dir_t
  for (int c = 0; c < D; c += 2) {
    slip += (yi(c) - xi0(c)) * (yi(c) - xi0(c));
    slip_dir += (yi(c) - xi0(c)) * di(c);
  }
  if (!dir) {
    *contact += weight * depth * depth;
    *friction += weight * base * slip / h2;
    for (int c = 0; c < D; c += 2) gx0(c) += -weight * 2 * kf * base * (yi(c) - xi0(c)) / h2;
    gx0(1) += -weight * in_band * kf * slip / h2;
    *step += -2 * weight * kf * base * slip / (h2 * h);
    *ground += weight * (-2 * kc * depth + in_band * kf * slip / h2);
    *eps += weight * in_band * kf * slip / h2;
  } else {
    const S in_contact = depth < 0 ? S(1) : S(0);
    *contact += 2 * depth * di(1);
    *friction += 2 * base * slip_dir / h2;
    for (int c = 0; c < D; c += 2) gx0(c) += -2 * kf * base * di(c) / h2;
    gx0(1) += -2 * in_band * kf * slip_dir / h2;
    *step += -4 * kf * base * slip_dir / (h2 * h);
    *ground += -2 * kc * in_contact * di(1) + 2 * in_band * kf * slip_dir / h2;
    *eps += 2 * in_band * kf * slip_dir / h2;
  }
}

}  // namespace diffsoft::kernels
