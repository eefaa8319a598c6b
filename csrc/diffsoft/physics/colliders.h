// The collider kinds: each one's geometry as a signed distance phi (negative inside the collider) whose gradient
// n is the unit outward normal, with its Hessian and its derivatives with respect to the geometry's parameters
// where the kind's surface is evaluated. contact.h's term, written once over these, gives every kind contact
// and friction with closed-form derivatives. A new kind: a struct like these, added to ColliderKinds, and its
// reference in diffsoft.colliders (whose order of kinds and parameter names the import checks against these).
#pragma once

#include <cmath>
#include <type_traits>

#include "diffsoft/physics/kernels.h"

namespace diffsoft::kernels {

// A collider's surface at a point q: phi, n = d phi/dq (unit), hess = d2 phi/dq2 (only when curved; 0 on the
// planar pieces of planes and height fields), and, when asked for, the derivatives of phi and n with respect to
// the entries of the geometry's parameters that they depend on here (param: the geometry parameter's position,
// index: the entry's flat index in one problem's value).
constexpr int kMaxSurfaceEntries = 20;  // a smooth height field's in 3D: 16 heights, 2 origins, 2 spacings
template <typename S, int D>
struct Surface {
  struct Entry {
    int param;
    int64_t index;
    S dphi;
    Vec<S, D> dn;
  };
  S phi = 0;
  Vec<S, D> n;
  bool curved = false;
  Mat<S, D> hess;
  std::array<Entry, kMaxSurfaceEntries> entries;
  int count = 0;
  void add(int param, int64_t index, S dphi, const Vec<S, D>& dn) { entries[count++] = {param, index, dphi, dn}; }
};

// Whether a kind's n is a unit vector everywhere (a distance's gradient): the default. A kind whose phi is a
// distance only to first order off its surface sets `static constexpr bool unit_normal = false`: its n (still
// d phi/dq, for the contact's force) is unit on the surface only, and the friction's tangent plane takes
// unit_normal() of it.
template <typename G, typename = void>
struct HasUnitNormal : std::true_type {};
template <typename G>
struct HasUnitNormal<G, std::void_t<decltype(G::unit_normal)>> : std::bool_constant<G::unit_normal> {};

// The surface with n / |n| in place of n, and its derivatives: with P = (I - u u^T) / |n| (u = n / |n|),
// d(n / |n|) = P dn, so each entry's dn becomes P dn, and hess, which contact.h applies as the transposed
// Jacobian of n along q (hess w = (dn/dq)^T w; hess is symmetric), becomes hess P. phi and its derivatives stay.
template <typename S, int D>
void unit_normal(Surface<S, D>& s) {
  const S length = s.n.norm();
  if (!(length > 0)) return;
  const Vec<S, D> u = s.n / length;
  const Mat<S, D> P = (Mat<S, D>::Identity() - u * u.transpose()) / length;
  s.n = u;
  if (s.curved) s.hess = s.hess * P;
  for (int k = 0; k < s.count; ++k) s.entries[k].dn = P * s.entries[k].dn;
}

// A half-space n . q >= offset: phi = n . q - offset, with n a unit vector (diffsoft.colliders.Plane
// normalises the user's normal and folds the user's point into the offset, by autograd).
struct Plane {
  static constexpr const char* name = "plane";
  static constexpr std::array<const char*, 2> params = {"normal", "offset"};
  static Shape shape(size_t j, int64_t d) { return j == 0 ? Shape{d} : Shape{}; }

  template <typename S, int D>
  static void at(const ColliderParams<S>& c, const Vec<S, D>& q, bool entries, Surface<S, D>& out) {
    Eigen::Map<const Vec<S, D>> n(c.geometry[0]);
    out.n = n;
    out.phi = n.dot(q) - c.geometry[1][0];
    if (!entries) return;
    for (int a = 0; a < D; ++a) out.add(0, a, q(a), Vec<S, D>::Unit(a));
    out.add(1, 0, S(-1), Vec<S, D>::Zero());
  }
};

// The terrain y = h(x) (2D) or y = h(x, z) (3D), piecewise linear through heights sampled every spacing from
// origin: in 2D on segments, in 3D on the triangles that split each grid cell along its diagonal from
// (i + 1, j) to (i, j + 1). Beyond the samples it continues flat at the edge's heights (h(x) = h(clamped x)).
// phi = (y - h) / L with L = |(-dh/dx, 1, -dh/dz)|: on each piece the exact signed distance to the piece's
// plane, so that a linear height field is the plane it samples, and a flat one the horizontal plane.
struct HeightField {
  static constexpr const char* name = "height_field";
  static constexpr std::array<const char*, 3> params = {"origin", "spacing", "heights"};
  // origin and spacing: (d - 1,), along x (and z); heights: (nx,) or (nx, nz), at least 2 samples per axis
  // (-1: any size >= 2).
  static Shape shape(size_t j, int64_t d) {
    if (j < 2) return Shape{d - 1};
    return d == 2 ? Shape{-1} : Shape{-1, -1};
  }

  template <typename S, int D>
  static void at(const ColliderParams<S>& c, const Vec<S, D>& q, bool entries, Surface<S, D>& out) {
    constexpr int A = D - 1;  // horizontal axes: x (component 0), and z (component 2) in 3D
    const S* origin = c.geometry[0];
    const S* spacing = c.geometry[1];
    const S* heights = c.geometry[2];
    int64_t cell[A], count[A];
    S frac[A], coord[A];
    bool clamped[A];
    for (int a = 0; a < A; ++a) {
      count[a] = c.sizes[2][a];
      coord[a] = (q(a == 0 ? 0 : 2) - origin[a]) / spacing[a];
      S k = std::floor(coord[a]);
      if (!(k >= 0)) k = 0;  // NaN too
      if (k > S(count[a] - 2)) k = S(count[a] - 2);
      cell[a] = static_cast<int64_t>(k);
      frac[a] = coord[a] - k;
      clamped[a] = !(frac[a] >= 0 && frac[a] <= 1);
      if (clamped[a]) frac[a] = frac[a] < 0 ? S(0) : S(1);
    }
    // The piece's corners (flat indices into heights), their weights in h, and which corners' difference is
    // dh/dfrac[a] = h[corner[hi[a]]] - h[corner[lo[a]]].
    int64_t corner[3];
    S weight[3];
    int lo[A], hi[A];
    if (A == 1) {
      corner[0] = cell[0], corner[1] = cell[0] + 1;
      weight[0] = 1 - frac[0], weight[1] = frac[0];
      lo[0] = 0, hi[0] = 1;
    } else {
      const int64_t nz = count[A - 1];
      const int64_t i = cell[0], j = cell[A - 1];
      const S fu = frac[0], fw = frac[A - 1];
      if (fu + fw <= 1) {  // corners (i, j), (i + 1, j), (i, j + 1)
        corner[0] = i * nz + j, corner[1] = (i + 1) * nz + j, corner[2] = i * nz + j + 1;
        weight[0] = 1 - fu - fw, weight[1] = fu, weight[2] = fw;
        lo[0] = 0, hi[0] = 1, lo[A - 1] = 0, hi[A - 1] = 2;
      } else {  // corners (i + 1, j + 1), (i, j + 1), (i + 1, j)
        corner[0] = (i + 1) * nz + j + 1, corner[1] = i * nz + j + 1, corner[2] = (i + 1) * nz + j;
        weight[0] = fu + fw - 1, weight[1] = 1 - fu, weight[2] = 1 - fw;
        lo[0] = 1, hi[0] = 0, lo[A - 1] = 2, hi[A - 1] = 0;
      }
    }
    S h = 0;
    for (int k = 0; k <= A; ++k) h += weight[k] * heights[corner[k]];
    S slope[A], rise[A];  // dh/dx (and dh/dz); rise[a] = h[hi[a]] - h[lo[a]] along the piece
    S ll = 1;
    for (int a = 0; a < A; ++a) {
      rise[a] = heights[corner[hi[a]]] - heights[corner[lo[a]]];
      slope[a] = clamped[a] ? S(0) : rise[a] / spacing[a];
      ll += slope[a] * slope[a];
    }
    const S L = std::sqrt(ll);
    Vec<S, D> up = Vec<S, D>::Zero();  // (-dh/dx, 1, -dh/dz)
    up(1) = 1;
    for (int a = 0; a < A; ++a) up(a == 0 ? 0 : 2) = -slope[a];
    out.n = up / L;
    out.phi = (q(1) - h) / L;
    if (!entries) return;
    // d phi = (-dh - phi dL) / L with dL = sum_a slope_a dslope_a / L; dn = (dup - n (n . dup)) / L with
    // dup = -dslope along the axes.
    auto add = [&](int param, int64_t index, S dh, const S* dslope) {
      S dl = 0;
      Vec<S, D> dup = Vec<S, D>::Zero();
      for (int a = 0; a < A; ++a) {
        dl += slope[a] * dslope[a];
        dup(a == 0 ? 0 : 2) = -dslope[a];
      }
      dl /= L;
      out.add(param, index, (-dh - out.phi * dl) / L, (dup - out.n * out.n.dot(dup)) / L);
    };
    S zero[A] = {}, dslope[A];
    for (int k = 0; k <= A; ++k) {  // the heights at the corners
      for (int a = 0; a < A; ++a)
        dslope[a] = clamped[a] ? S(0) : ((k == hi[a]) - (k == lo[a])) / spacing[a];
      add(2, corner[k], weight[k], dslope);
    }
    for (int a = 0; a < A; ++a) {  // origin and spacing move the point's coordinate within the piece
      if (clamped[a]) {
        add(0, a, 0, zero), add(1, a, 0, zero);
        continue;
      }
      // frac = (q - origin) / spacing - cell: dfrac/dorigin = -1/spacing, dfrac/dspacing = -coord/spacing;
      // the slope rise / spacing does not move with the origin.
      S ds[A] = {};
      add(0, a, -slope[a], zero);
      ds[a] = -slope[a] / spacing[a];
      add(1, a, -slope[a] * coord[a], ds);
    }
  }
};

// The terrain of a HeightField's parameters made smooth: y = h(x) (2D) or y = h(x, z) (3D) is the uniform cubic
// B-spline whose control points are the heights, placed at the samples (a tensor product in 3D). It is C2, so a
// vertex on it meets no kink, where a piecewise linear field's slope jumps at every sample. The spline smooths the
// samples (at a sample it is (h[i-1] + 4 h[i] + h[i+1]) / 6 along each axis) and reproduces linear ones exactly a
// sample or more in from the edges: a sloped field is its plane there. Beyond the samples the control points
// repeat the edge's, so the terrain bends to flat within a sample of its edges and continues flat. phi = (y - h) /
// L with L = |(-dh/dx, 1, -dh/dz)|, the signed distance to first order in y - h (exact on planes); n = d phi/dq
// exactly (unit on the surface only: unit_normal) and hess = d2 phi/dq2, with the spline's third derivatives,
// which jump at the knots: off the surface (y != h) so does hess, by (y - h) times that jump.
struct SmoothHeightField {
  static constexpr const char* name = "smooth_height_field";
  static constexpr bool unit_normal = false;  // (n is d phi/dq: unit on the surface, |n| - 1 ~ (y - h) curvature)
  static constexpr std::array<const char*, 3> params = HeightField::params;
  static Shape shape(size_t j, int64_t d) { return HeightField::shape(j, d); }

  template <typename S, int D>
  static void at(const ColliderParams<S>& c, const Vec<S, D>& q, bool entries, Surface<S, D>& out) {
    constexpr int A = D - 1;   // horizontal axes: x (component 0), and z (component 2) in 3D
    constexpr int K1 = A == 2 ? 4 : 1;  // control points along the second axis
    using VA = Eigen::Matrix<S, A, 1>;
    using MA = Eigen::Matrix<S, A, A>;
    const S* origin = c.geometry[0];
    const S* spacing = c.geometry[1];
    const S* heights = c.geometry[2];
    // Per axis: the coordinate in samples (clamped to where the terrain is flat beyond the edges: NaN too), the
    // four control points' indices, and their basis functions' values and derivatives (orders 0 to 3) along the
    // axis in physical units (divided by spacing^order).
    S coord[2] = {0, 0};
    int64_t index[2][4] = {};
    S basis[2][4][4] = {};  // [axis][point][order]
    for (int a = 0; a < A; ++a) {
      const int64_t count = c.sizes[2][a];
      S x = (q(a == 0 ? 0 : 2) - origin[a]) / spacing[a];
      if (!(x >= -2)) x = -2;
      if (x > S(count + 1)) x = S(count + 1);
      coord[a] = x;
      const S i = std::floor(x), t = x - i, r = 1 - t, t2 = t * t;
      for (int k = 0; k < 4; ++k)
        index[a][k] = std::min<int64_t>(std::max<int64_t>(static_cast<int64_t>(i) - 1 + k, 0), count - 1);
      const S values[4][4] = {{r * r * r / 6, -r * r / 2, r, S(-1)},
                              {(3 * t2 * t - 6 * t2 + 4) / 6, (3 * t2 - 4 * t) / 2, 3 * t - 2, S(3)},
                              {(-3 * t2 * t + 3 * t2 + 3 * t + 1) / 6, (-3 * t2 + 2 * t + 1) / 2, 1 - 3 * t, S(-3)},
                              {t2 * t / 6, t2 / 2, t, S(1)}};
      const S scale[4] = {S(1), 1 / spacing[a], 1 / (spacing[a] * spacing[a]),
                          1 / (spacing[a] * spacing[a] * spacing[a])};
      for (int k = 0; k < 4; ++k)
        for (int m = 0; m < 4; ++m) basis[a][k][m] = values[k][m] * scale[m];
    }
    if (A == 1) basis[1][0][0] = 1;  // one point of weight 1 along the missing axis
    const int64_t nz = A == 2 ? c.sizes[2][1] : 1;
    auto point = [&](int k, int l) { return index[0][k] * nz + (A == 2 ? index[1][l] : 0); };
    // The spline differentiated m times along x and n along z, spline[m][n] (m + n <= 3): the sums along z first.
    S along[4][4] = {};  // [k][n]
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < K1; ++l) {
        const S value = heights[point(k, l)];
        for (int n = 0; n < (A == 2 ? 4 : 1); ++n) along[k][n] += basis[1][l][n] * value;
      }
    S spline[4][4] = {};
    for (int m = 0; m < 4; ++m)
      for (int n = 0; m + n < 4; ++n)
        for (int k = 0; k < 4; ++k) spline[m][n] += basis[0][k][m] * along[k][n];
    // h, its gradient g, Hessian H and third derivatives T (T[a](b, c)): the spline at the orders along x and z that the
    // axes given count (axis 0 is x, axis 1 is z).
    auto order = [&](std::initializer_list<int> axes) {
      int o[2] = {0, 0};
      for (int x : axes) ++o[x];
      return std::array<int, 2>{o[0], o[1]};
    };
    auto at_order = [&](std::initializer_list<int> axes) {
      const auto o = order(axes);
      return spline[o[0]][o[1]];
    };
    const S h = spline[0][0];
    VA g;
    MA H;
    std::array<MA, A> T;
    for (int a = 0; a < A; ++a) {
      g(a) = at_order({a});
      for (int b = 0; b < A; ++b) {
        H(a, b) = at_order({a, b});
        for (int d3 = 0; d3 < A; ++d3) T[a](b, d3) = at_order({a, b, d3});
      }
    }
    const S L = std::sqrt(1 + g.squaredNorm());
    const S u = q(1) - h;
    const VA La = H * g / L;  // dL/dx
    auto horizontal = [](int a) { return a == 0 ? 0 : 2; };
    out.phi = u / L;
    out.n = Vec<S, D>::Zero();
    out.n(1) = 1 / L;
    for (int a = 0; a < A; ++a) out.n(horizontal(a)) = -g(a) / L - u * La(a) / (L * L);
    // d2 phi: phi_ab = -H_ab / L + (g_a La_b + g_b La_a) / L^2 - u L_ab / L^2 + 2 u La_a La_b / L^3, with
    // L_ab = (T_ab . g + (H H)_ab - La_a La_b) / L; phi_ay = -La_a / L^2; phi_yy = 0.
    out.curved = true;
    out.hess = Mat<S, D>::Zero();
    const MA HH = H * H;
    for (int a = 0; a < A; ++a) {
      out.hess(horizontal(a), 1) = out.hess(1, horizontal(a)) = -La(a) / (L * L);
      for (int b = 0; b < A; ++b) {
        S tg = 0;
        for (int d3 = 0; d3 < A; ++d3) tg += T[a](b, d3) * g(d3);
        const S Lab = (tg + HH(a, b) - La(a) * La(b)) / L;
        out.hess(horizontal(a), horizontal(b)) = -H(a, b) / L + (g(a) * La(b) + g(b) * La(a)) / (L * L) -
                                                 u * Lab / (L * L) + 2 * u * La(a) * La(b) / (L * L * L);
      }
    }
    if (!entries) return;
    // A parameter that moves h, g and H by dh, dg, dH moves phi and n by
    //   dphi = (-dh - phi dL) / L, dL = g . dg / L,
    //   dn_a = -dg_a / L + g_a dL / L^2 + dh La_a / L^2 - u dLa_a / L^2 + 2 u La_a dL / L^3, dn_y = -dL / L^2,
    // with dLa = (dH g + H dg) / L - La dL / L.
    auto add = [&](int param, int64_t index_, S dh, const VA& dg, const MA& dH) {
      const S dL = g.dot(dg) / L;
      const VA dLa = (dH * g + H * dg) / L - La * dL / L;
      Vec<S, D> dn = Vec<S, D>::Zero();
      dn(1) = -dL / (L * L);
      for (int a = 0; a < A; ++a)
        dn(horizontal(a)) = -dg(a) / L + g(a) * dL / (L * L) + dh * La(a) / (L * L) - u * dLa(a) / (L * L) +
                            2 * u * La(a) * dL / (L * L * L);
      out.add(param, index_, (-dh - out.phi * dL) / L, dn);
    };
    auto weight = [&](int k, int l, std::initializer_list<int> axes) {  // a control point's, differentiated
      const auto o = order(axes);
      return basis[0][k][o[0]] * basis[1][l][o[1]];
    };
    for (int k = 0; k < 4; ++k) {  // the heights at the control points (a repeated edge point once per use)
      for (int l = 0; l < K1; ++l) {
        VA dg;
        MA dH;
        for (int a = 0; a < A; ++a) {
          dg(a) = weight(k, l, {a});
          for (int b = 0; b < A; ++b) dH(a, b) = weight(k, l, {a, b});
        }
        add(2, point(k, l), weight(k, l, {}), dg, dH);
      }
    }
    for (int a = 0; a < A; ++a) {
      // The origin shifts the terrain: (dh, dg, dH) = -(g_a, H_a., T_a..). The spacing stretches it about the
      // origin, the coordinate c_a = (x_a - origin_a) / spacing_a held: h moves by -c_a g_a, and each derivative
      // along a also by its 1 / spacing_a.
      add(0, a, -g(a), -H.col(a), -T[a]);
      VA dg = -coord[a] * H.col(a);
      dg(a) -= g(a) / spacing[a];
      MA dH = -coord[a] * T[a];
      dH.row(a) -= H.row(a) / spacing[a];
      dH.col(a) -= H.col(a) / spacing[a];
      add(1, a, -coord[a] * g(a), dg, dH);
    }
  }
};

// A ball (a disc in 2D): phi = |q - center| - radius, n = (q - center) / |q - center|, with the Hessian
// (I - n n^T) / |q - center|. At the centre itself (no normal) n is +y.
struct Sphere {
  static constexpr const char* name = "sphere";
  static constexpr std::array<const char*, 2> params = {"center", "radius"};
  static Shape shape(size_t j, int64_t d) { return j == 0 ? Shape{d} : Shape{}; }

  template <typename S, int D>
  static void at(const ColliderParams<S>& c, const Vec<S, D>& q, bool entries, Surface<S, D>& out) {
    Eigen::Map<const Vec<S, D>> center(c.geometry[0]);
    const Vec<S, D> r = q - center;
    const S dist = r.norm();
    out.curved = true;
    if (dist > 0) {
      out.n = r / dist;
      out.hess = (Mat<S, D>::Identity() - out.n * out.n.transpose()) / dist;
    } else {
      out.n = Vec<S, D>::Unit(1);
      out.hess = Mat<S, D>::Zero();
    }
    out.phi = dist - c.geometry[1][0];
    if (!entries) return;
    for (int a = 0; a < D; ++a) out.add(0, a, -out.n(a), -out.hess.col(a));
    out.add(1, 0, S(-1), Vec<S, D>::Zero());
  }
};

// A capsule (a stadium in 2D): the points within radius of the segment from start to end, phi = |q - p| - radius
// with p = start + t (end - start) the segment's nearest point (t = (q - start) . w / |w|^2 clamped to [0, 1],
// w = end - start) and n = (q - p) / |q - p|. Its Hessian is (I - n n^T) / |q - p| on the end caps (a sphere's)
// and (I - n n^T - u u^T) / |q - p| along the side (u = w / |w|, normal to n there). A segment of length 0 is a
// sphere; on the segment itself (no normal) n is +y.
struct Capsule {
  static constexpr const char* name = "capsule";
  static constexpr std::array<const char*, 3> params = {"start", "end", "radius"};
  static Shape shape(size_t j, int64_t d) { return j < 2 ? Shape{d} : Shape{}; }

  template <typename S, int D>
  static void at(const ColliderParams<S>& c, const Vec<S, D>& q, bool entries, Surface<S, D>& out) {
    Eigen::Map<const Vec<S, D>> a(c.geometry[0]), b(c.geometry[1]);
    const Vec<S, D> w = b - a, qa = q - a;
    const S ww = w.squaredNorm();
    S t = ww > 0 ? qa.dot(w) / ww : S(0);
    const bool side = t > 0 && t < 1;
    if (!side) t = t <= 0 ? S(0) : S(1);
    const Vec<S, D> r = qa - t * w;
    const S dist = r.norm();
    out.curved = true;
    if (dist > 0) {
      out.n = r / dist;
      const Mat<S, D> across = Mat<S, D>::Identity() - out.n * out.n.transpose();
      out.hess = side ? Mat<S, D>((across - w * w.transpose() / ww) / dist) : Mat<S, D>(across / dist);
    } else {
      out.n = Vec<S, D>::Unit(1);
      out.hess = Mat<S, D>::Zero();
    }
    out.phi = dist - c.geometry[2][0];
    if (!entries) return;
    // p moves with start by (1 - t) I + w dt/dstart and with end by t I + w dt/dend (dt = 0 on the caps);
    // phi = |q - p| - radius: dphi = -n . dp = -weight n_k (w is normal to n along the side), and
    // dn = -(I - n n^T) dp / |q - p| = -(weight (I - n n^T) e_k + w dt) / |q - p|.
    const Mat<S, D> across =
        dist > 0 ? Mat<S, D>(Mat<S, D>::Identity() - out.n * out.n.transpose()) : Mat<S, D>::Zero();
    const S inv = dist > 0 ? 1 / dist : S(0);
    for (int end = 0; end < 2; ++end) {
      const S weight = end ? t : 1 - t;
      for (int k = 0; k < D; ++k) {
        // dt/dstart_k = (2 t w_k - w_k - qa_k) / ww, dt/dend_k = (qa_k - 2 t w_k) / ww, on the side only
        const S dt = !side ? S(0) : end ? (qa(k) - 2 * t * w(k)) / ww : (2 * t * w(k) - w(k) - qa(k)) / ww;
        out.add(end, k, -weight * out.n(k), -(weight * across.col(k) + w * dt) * inv);
      }
    }
    out.add(2, 0, S(-1), Vec<S, D>::Zero());
  }
};

// The registered kinds: Collider::kind indexes this list; diffsoft.colliders has a class per entry, in order.
using ColliderKinds = KindList<Plane, HeightField, Sphere, Capsule, SmoothHeightField>;

}  // namespace diffsoft::kernels
