// The collider kinds: each one's geometry as a signed distance phi (negative inside the collider) whose gradient
// n is the unit outward normal, with its Hessian and its derivatives with respect to the geometry's parameters
// where the kind's surface is evaluated. contact.h's term, written once over these, gives every kind contact
// and friction with closed-form derivatives. A new kind: a struct like these, added to ColliderKinds, and its
// reference in diffsoft.colliders (whose order of kinds and parameter names the import checks against these).
#pragma once

#include <cmath>

#include "diffsoft/physics/kernels.h"

namespace diffsoft::kernels {

// A collider's surface at a point q: phi, n = d phi/dq (unit), hess = d2 phi/dq2 (only when curved; 0 on the
// planar pieces of planes and height fields), and, when asked for, the derivatives of phi and n with respect to
// the entries of the geometry's parameters that they depend on here (param: the geometry parameter's position,
// index: the entry's flat index in one problem's value).
constexpr int kMaxSurfaceEntries = 8;
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
using ColliderKinds = KindList<Plane, HeightField, Sphere, Capsule>;

}  // namespace diffsoft::kernels
