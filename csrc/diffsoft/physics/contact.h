// Contact and friction of one free vertex s against one collider c (colliders.h: phi, its gradient n):
//   E = k_c min(phi(y_s), 0)^2 + w_s |t_s|^2 / h^2,  t_s = P0 (y_s - x0_s),  P0 = I - n0 n0^T,
//   w_s = k_f max(eps - phi(x0_s), 0),  n0 = n(x0_s) / |n(x0_s)| (n itself where the kind's n is unit):
// a penalty on the depth inside the collider, and a lagged friction on the slip in the collider's tangent plane
// at the start of the step, acting within eps of its surface. Both the weight and the plane depend on the start of
// the step only, so the friction is quadratic in y: its vertex block is 2 w P0^2 / h^2 (= 2 w P0 / h^2: the
// derivatives are those of the formula as written, exact for any n0, so that a plane's normal may be
// differentiated as a free vector); the contact's is 2 k_c (n n^T + phi d2phi/dq2) inside. Parameters: the
// collider's k_c, k_f, eps and geometry, x0_free and h. With a horizontal plane this is the flat ground's model,
// bit for bit (n = +y: the products with n's zeros are exact).
#pragma once

#include <algorithm>

#include "diffsoft/physics/colliders.h"

namespace diffsoft::kernels {

struct Contact {
  static constexpr Stencil stencil = Stencil::vertex_collider;

  template <typename S, int D>
  static S energy(const View<S, D>& v, const Point<S>& pt, int64_t s, size_t c) {
    S out = 0;
    ColliderKinds::visit(v.colliders[c].kind, [&](auto g) { out = energy_with<decltype(g)>(v, pt, s, v.colliders[c]); });
    return out;
  }

  // Adds the vertex's gradient to grad (F, d) and its d x d block to block.
  template <typename S, int D>
  static void derivatives(const View<S, D>& v, const Point<S>& pt, int64_t s, size_t c, S* grad, S* block) {
    ColliderKinds::visit(v.colliders[c].kind,
                         [&](auto g) { derivatives_with<decltype(g)>(v, pt, s, v.colliders[c], grad, block); });
  }

  // The parameter derivatives, added to o (the collider's in o.colliders[c]: k_c, k_f, eps, then the geometry's);
  // weight and dir as in Elastic::param_grads. With m = min(phi(y), 0), b = max(eps - phi(x0), 0), s = y - x0,
  // t = P0 s: dE/dtheta = 2 k_c m dphi(y) + k_f / h^2 (db |t|^2 + b d|t|^2), db = -[b > 0] dphi(x0),
  // d|t|^2 = 2 t . dP0 s = -2 (n0 . s)(t . dn0) - 2 (t . n0)(s . dn0) for the geometry's, and through x0 (s,
  // phi(x0), and n0: dn0/dx0 = d2phi(x0)). The mixed ones differentiate grad_y E . v = 2 k_c m (n . v) +
  // 2 w z / h^2, z = t . P0 v = s^T P0^2 v, alike.
  template <typename S, int D>
  static void param_grads(const View<S, D>& v, const Point<S>& pt, int64_t s, size_t c, const S* dir, S weight,
                          const StepParams<S*>& o) {
    ColliderKinds::visit(v.colliders[c].kind, [&](auto g) {
      param_grads_with<decltype(g)>(v, pt, s, v.colliders[c], dir, weight, o.colliders[c], o);
    });
  }

 private:
  // The surface at the start of the step as the friction takes it: n made unit where the kind's is not
  // (unit_normal: P0's normal), and d phi/dq there returned (the weight's gradient).
  template <typename G, typename S, int D>
  static Vec<S, D> at_start(const ColliderParams<S>& c, const Vec<S, D>& q, bool entries, Surface<S, D>& out) {
    G::at(c, q, entries, out);
    const Vec<S, D> grad = out.n;
    if constexpr (!HasUnitNormal<G>::value) unit_normal(out);
    return grad;
  }

  template <typename G, typename S, int D>
  static S energy_with(const View<S, D>& v, const Point<S>& pt, int64_t s, const ColliderParams<S>& c) {
    const S h2 = v.h * v.h;
    const Vec<S, D> yi = Eigen::Map<const Vec<S, D>>(pt.y + s * D), xi0 = Eigen::Map<const Vec<S, D>>(pt.x0_free + s * D);
    Surface<S, D> at_y, at_0;
    G::at(c, yi, false, at_y);
    at_start<G>(c, xi0, false, at_0);
    const S depth = std::min(at_y.phi, S(0));
    const S wf = c.friction * std::max(c.friction_eps - at_0.phi, S(0));
    S out = c.stiffness * depth * depth;
    if (wf != 0) {  // outside the band (most vertices, on flat ground) the friction adds an exact 0
      const Vec<S, D> slip = yi - xi0;
      const Vec<S, D> t = slip - at_0.n * at_0.n.dot(slip);
      out += wf * t.squaredNorm() / h2;
    }
    return out;
  }

  template <typename G, typename S, int D>
  static void derivatives_with(const View<S, D>& v, const Point<S>& pt, int64_t s, const ColliderParams<S>& c,
                               S* grad, S* block) {
    const S h2 = v.h * v.h;
    const Vec<S, D> yi = Eigen::Map<const Vec<S, D>>(pt.y + s * D), xi0 = Eigen::Map<const Vec<S, D>>(pt.x0_free + s * D);
    Eigen::Map<Vec<S, D>> gi(grad + s * D);
    Eigen::Map<Mat<S, D>> K(block);
    Surface<S, D> at_y, at_0;
    G::at(c, yi, false, at_y);
    at_start<G>(c, xi0, false, at_0);
    const S depth = std::min(at_y.phi, S(0));
    gi += (2 * c.stiffness * depth) * at_y.n;
    if (depth < 0) {
      const S k2 = 2 * c.stiffness;
      K += k2 * (at_y.n * at_y.n.transpose());
      if (at_y.curved) K += (k2 * depth) * at_y.hess;
    }
    const S wf = 2 * c.friction * std::max(c.friction_eps - at_0.phi, S(0)) / h2;
    if (wf == 0) return;
    const Vec<S, D> slip = yi - xi0;
    const Mat<S, D> P0 = Mat<S, D>::Identity() - at_0.n * at_0.n.transpose();
    gi += wf * (P0 * (P0 * slip));
    K += wf * (P0 * P0);
  }

  template <typename G, typename S, int D>
  static void param_grads_with(const View<S, D>& v, const Point<S>& pt, int64_t s, const ColliderParams<S>& c,
                               const S* dir, S weight, const std::vector<S*>& oc, const StepParams<S*>& o) {
    const S h = v.h, h2 = h * h, kc = c.stiffness, kf = c.friction;
    const Vec<S, D> yi = Eigen::Map<const Vec<S, D>>(pt.y + s * D), xi0 = Eigen::Map<const Vec<S, D>>(pt.x0_free + s * D);
    Eigen::Map<Vec<S, D>> gx0(o[StepParam::x0_free] + s * D);
    S* step = o[StepParam::h];
    S *stiffness = oc[0], *friction = oc[1], *eps = oc[2];
    Surface<S, D> at_y, at_0;
    G::at(c, yi, false, at_y);
    G::at(c, xi0, false, at_0);
    const S m = std::min(at_y.phi, S(0)), b = std::max(c.friction_eps - at_0.phi, S(0));
    if (m == 0 && b == 0) return;  // neither in contact nor in the friction band: every derivative is 0
    G::at(c, yi, true, at_y);
    const Vec<S, D> grad0 = at_start<G>(c, xi0, true, at_0);  // the friction weight's; n0 below is its plane's
    const Vec<S, D>&n = at_y.n, &n0 = at_0.n;
    const S in_contact = m < 0 ? S(1) : S(0), in_band = b > 0 ? S(1) : S(0);
    const Vec<S, D> sl = yi - xi0;
    const S ns = n0.dot(sl);
    const Vec<S, D> t = sl - n0 * ns;
    const S tt = t.squaredNorm(), tn = t.dot(n0);
    auto geometry = [&](const typename Surface<S, D>::Entry& e) { return oc[3 + e.param] + e.index; };
    if (!dir) {
      *stiffness += weight * m * m;
      *friction += weight * b * tt / h2;
      *eps += weight * in_band * kf * tt / h2;
      *step += -2 * weight * kf * b * tt / (h2 * h);
      // x0: through s (d|t|^2/ds = 2 P0 t), phi(x0) (its gradient n0) and n0 (d|t|^2/dn0 = -2 ns t - 2 tn s).
      Vec<S, D> d_x0 = -in_band * tt * grad0 - 2 * b * (t - n0 * tn);
      if (at_0.curved) d_x0 += b * at_0.hess * (-2 * ns * t - 2 * tn * sl);
      gx0 += (weight * kf / h2) * d_x0;
      for (int k = 0; k < at_y.count; ++k) *geometry(at_y.entries[k]) += weight * 2 * kc * m * at_y.entries[k].dphi;
      for (int k = 0; k < at_0.count; ++k) {
        const auto& e = at_0.entries[k];
        const S dtt = -2 * ns * t.dot(e.dn) - 2 * tn * sl.dot(e.dn);
        *geometry(e) += (weight * kf / h2) * (-in_band * e.dphi * tt + b * dtt);
      }
      return;
    }
    const Vec<S, D> vi = Eigen::Map<const Vec<S, D>>(dir + s * D);
    const Vec<S, D> u = vi - n0 * n0.dot(vi);  // P0 v
    const S nv = n.dot(vi), z = t.dot(u), n0v = n0.dot(vi), n0u = n0.dot(u);
    *stiffness += 2 * m * nv;
    *friction += 2 * b * z / h2;
    *eps += 2 * in_band * kf * z / h2;
    *step += -4 * kf * b * z / (h2 * h);
    // dz = (dP0 s) . u + t . (dP0 v), dP0 = -(dn0 n0^T + n0 dn0^T): dz/dn0 = -ns u - (n0 . u) s - (n0 . v) t -
    // tn v; and through s, dz/ds = P0 u.
    const Vec<S, D> dz_dn0 = -ns * u - n0u * sl - n0v * t - tn * vi;
    Vec<S, D> d_x0 = -in_band * z * grad0 - b * (u - n0 * n0u);
    if (at_0.curved) d_x0 += b * at_0.hess * dz_dn0;
    gx0 += (2 * kf / h2) * d_x0;
    for (int k = 0; k < at_y.count; ++k) {
      const auto& e = at_y.entries[k];
      *geometry(e) += 2 * kc * (in_contact * e.dphi * nv + m * e.dn.dot(vi));
    }
    for (int k = 0; k < at_0.count; ++k) {
      const auto& e = at_0.entries[k];
      *geometry(e) += (2 * kf / h2) * (-in_band * e.dphi * z + b * e.dn.dot(dz_dn0));
    }
  }
};

}  // namespace diffsoft::kernels
