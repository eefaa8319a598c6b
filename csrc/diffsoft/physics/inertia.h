// Inertia and gravity of one free vertex s: m_s/(2 h^2) |y_s - x_hat_s|^2 + g m_s (y_s - x0_s)_y, with the
// vertex block m_s / h^2 I. (x_hat = x0 + h v0 is a parameter of its own: the step's dependence on h through it
// is the caller's, by autograd; here h enters through the 1/h^2 only.) Parameters: x_hat, x0_free, mass,
// gravity, h.
#pragma once

#include "diffsoft/physics/kernels.h"

namespace diffsoft::kernels {

struct Inertia {
  static constexpr Stencil stencil = Stencil::vertex;

  template <typename S, int D>
  static S energy(const View<S, D>& v, const Point<S>& pt, int64_t s) {
    const S h2 = v.h * v.h;
    Eigen::Map<const Vec<S, D>> yi(pt.y + s * D), xh(pt.x_hat + s * D), xi0(pt.x0_free + s * D);
    return S(0.5) * v.mass[s] * (yi - xh).squaredNorm() / h2 + v.gravity * v.mass[s] * (yi(1) - xi0(1));
  }

  // Adds the vertex's gradient to grad (F, d) and its d x d block to block.
  template <typename S, int D>
  static void derivatives(const View<S, D>& v, const Point<S>& pt, int64_t s, S* grad, S* block) {
    const S h2 = v.h * v.h;
    Eigen::Map<const Vec<S, D>> yi(pt.y + s * D), xh(pt.x_hat + s * D);
    Eigen::Map<Vec<S, D>> gi(grad + s * D);
    gi += v.mass[s] * (yi - xh) / h2;
    gi(1) += v.gravity * v.mass[s];
    Eigen::Map<Mat<S, D>>(block).diagonal().array() += v.mass[s] / h2;
  }

  // The vertex's parameter derivatives, added to o; weight and dir as in Elastic::param_grads. They are linear
  // in the "probe": weight * (y - x_hat) etc. for the first order, the direction for the mixed one. The inertia
  // term is homogeneous of degree -2 in h, so its h-derivative is -2/h times itself (and likewise its
  // gradient's).
  template <typename S, int D>
  static void param_grads(const View<S, D>& v, const Point<S>& pt, int64_t s, const S* dir, S weight,
                          const StepParams<S*>& o) {
    const S h = v.h, h2 = h * h, g = v.gravity;
    Eigen::Map<const Vec<S, D>> yi(pt.y + s * D), xh(pt.x_hat + s * D), xi0(pt.x0_free + s * D);
    Eigen::Map<Vec<S, D>> gx_hat(o[StepParam::x_hat] + s * D), gx0(o[StepParam::x0_free] + s * D);
    S* mass_out = o[StepParam::mass] + s;
    S* gravity = o[StepParam::gravity];
    S* step = o[StepParam::h];
    const S mass = v.mass[s];
    if (!dir) {
      const S inertia = S(0.5) * (yi - xh).squaredNorm() / h2;
      gx_hat += -weight * mass * (yi - xh) / h2;
      *mass_out += weight * (inertia + g * (yi(1) - xi0(1)));
      gx0(1) += -weight * g * mass;
      *gravity += weight * mass * (yi(1) - xi0(1));
      *step += -2 * weight * mass * inertia / h;
    } else {
      const Vec<S, D> di = Eigen::Map<const Vec<S, D>>(dir + s * D);
      gx_hat += -mass * di / h2;
      *mass_out += (yi - xh).dot(di) / h2 + g * di(1);
      *gravity += mass * di(1);
      *step += -2 * mass * (yi - xh).dot(di) / (h2 * h);
    }
  }
};

}  // namespace diffsoft::kernels
