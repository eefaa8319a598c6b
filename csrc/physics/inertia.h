// Inertia and gravity of one free vertex s: m_s/(2 h^2) |y_s - x_hat_s|^2 + g m_s (y_s - x0_s)_y, with a
// diagonal Hessian, m_s / h^2.
#pragma once

#include "physics/kernels.h"

namespace diffsoft::kernels {

template <typename S, int D>
S inertia_energy(const View<S, D>& v, const S* y, const S* x0_free, const S* x_hat, int64_t s) {
  const StepModel& m = v.m;
  const S h2 = S(m.h * m.h);
  Eigen::Map<const Vec<S, D>> yi(y + s * D), xh(x_hat + s * D), xi0(x0_free + s * D);
  return S(0.5) * v.mass[s] * (yi - xh).squaredNorm() / h2 + S(m.gravity) * v.mass[s] * (yi(1) - xi0(1));
}

// Adds the vertex's gradient to grad (F, d) and writes its diagonal (F, d).
template <typename S, int D>
void inertia_derivatives(const View<S, D>& v, const S* y, const S* x_hat, int64_t s, S* grad, S* diag) {
  const S h2 = S(v.m.h * v.m.h);
  Eigen::Map<const Vec<S, D>> yi(y + s * D), xh(x_hat + s * D);
  Eigen::Map<Vec<S, D>> gi(grad + s * D), di(diag + s * D);
  gi += v.mass[s] * (yi - xh) / h2;
  gi(1) += S(v.m.gravity) * v.mass[s];
  di.setConstant(v.mass[s] / h2);
}

// The vertex's parameter derivatives, added to o; weight and dir as in elastic_param_grads. They are linear in
// the "probe": weight * (y - x_hat) etc. for the first order, the direction for the mixed one.
template <typename S, int D>
void inertia_param_grads(const View<S, D>& v, const S* y, const S* x0_free, const S* x_hat, int64_t s, const S* dir,
                         S weight, const StepParams<S*>& o) {
  const S h2 = S(v.m.h * v.m.h), g = S(v.m.gravity);
  Eigen::Map<const Vec<S, D>> yi(y + s * D), xh(x_hat + s * D), xi0(x0_free + s * D);
  Eigen::Map<Vec<S, D>> gx_hat(o[StepParam::x_hat] + s * D), gx0(o[StepParam::x0_free] + s * D);
  S* mass_out = o[StepParam::mass] + s;
  S* gravity = o[StepParam::gravity];
  const S mass = v.mass[s];
  if (!dir) {
    gx_hat += -weight * mass * (yi - xh) / h2;
    *mass_out += weight * (S(0.5) * (yi - xh).squaredNorm() / h2 + g * (yi(1) - xi0(1)));
    gx0(1) += -weight * g * mass;
    *gravity += weight * mass * (yi(1) - xi0(1));
  } else {
    const Vec<S, D> di = Eigen::Map<const Vec<S, D>>(dir + s * D);
    gx_hat += -mass * di / h2;
    *mass_out += (yi - xh).dot(di) / h2 + g * di(1);
    *gravity += mass * di(1);
  }
}

}  // namespace diffsoft::kernels
