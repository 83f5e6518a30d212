// The SpheretNorm step h_new = C(b) h + S(b) a z, z = P_h(u), b = beta^2 = a^2 ||z||^2/||h||^2
// (docs/science.md §2.3-2.4), for any p, as two fused CPU kernels, forward and closed-form
// backward: the formulas of workloads/geometry/sphere_fused.py (_SphereStep, and for the
// per-row coefficients sphere.py's sphere_coefficients and sphere_fused.py's
// coefficient_derivatives, branch for branch). One kernel each way instead of ~40 element-wise
// ops: at small widths the eager step is all per-op overhead. Everything p changes is a
// per-row scalar (C, S and their b-derivatives), computed in double.
// Rows (tokens) are independent, so the result does not depend on the thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "scale_norm.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// <x, y> and <w, y> in one pass over a row. Eight independent accumulators each: lets the
// compiler vectorise a reduction it may not reorder.
template <typename T>
inline void dot2(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ y,
                 int64_t d, T& xy, T& wy) {
  T a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int j = 0; j < 8; ++j) {
      a[j] += x[i + j] * y[i + j];
      b[j] += w[i + j] * y[i + j];
    }
  T ra = 0, rb = 0;
  for (; i < d; ++i) {
    ra += x[i] * y[i];
    rb += w[i] * y[i];
  }
  xy = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])) + ra;
  wy = ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7])) + rb;
}

// <g, h> and <g, z> with z = u - m h, in one pass, without storing z.
template <typename T>
inline void gdots(const T* __restrict__ g, const T* __restrict__ h, const T* __restrict__ u, T m,
                  int64_t d, T& gh, T& gz) {
  T a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int j = 0; j < 8; ++j) {
      a[j] += g[i + j] * h[i + j];
      b[j] += (u[i + j] - m * h[i + j]) * g[i + j];
    }
  T ra = 0, rb = 0;
  for (; i < d; ++i) {
    ra += g[i] * h[i];
    rb += (u[i] - m * h[i]) * g[i];
  }
  gh = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])) + ra;
  gz = ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7])) + rb;
}

template <typename T>
inline T zz_of(const T* __restrict__ u, const T* __restrict__ h, T m, int64_t d) {
  T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int j = 0; j < 8; ++j) {
      T z = u[i + j] - m * h[i + j];
      acc[j] += z * z;
    }
  T rest = 0;
  for (; i < d; ++i) {
    T z = u[i] - m * h[i];
    rest += z * z;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + rest;
}

// (C, S, dC/db, dS/db) at b = beta^2 >= 0.
struct Coef {
  double c, s, dc, ds;
};

constexpr double kTau = 1e-6;  // sphere.py's TAU: the Taylor branch below tau
constexpr int kMaxRationalP = 8;  // sphere.py's _MAX_RATIONAL_P

inline double horner(const double* coef, int n, double x) {
  double out = coef[n - 1];
  for (int i = n - 2; i >= 0; --i) out = out * x + coef[i];
  return out;
}

inline double binom(int n, int k) {
  double r = 1;
  for (int i = 1; i <= k; ++i) r = r * (n - k + i) / i;
  return r;
}

// Integer p: e^{i theta} = ((1 + i t)/|1 + i t|)^p, t^2 = b/p^2; polynomials in t^2.
inline Coef rational(double b, int n, double w) {
  const double p = n, t2 = b / (p * p);
  double re[kMaxRationalP], im[kMaxRationalP], dim[kMaxRationalP];
  const int nre = n / 2 + 1, nim = (n - 1) / 2 + 1;
  for (int j = 0; j < nre; ++j) re[j] = binom(n, 2 * j) * (j % 2 ? -1 : 1);
  for (int j = 0; j < nim; ++j) im[j] = binom(n, 2 * j + 1) * (j % 2 ? -1 : 1) / p;
  for (int j = 1; j < nim; ++j) dim[j - 1] = j * im[j];
  const double inv = std::pow(1.0 + t2, -0.5 * p);
  const double poly = horner(im, nim, t2);
  const double dpoly = nim > 1 ? horner(dim, nim - 1, t2) : 0.0;
  const double s = poly * inv;
  return {horner(re, nre, t2) * inv, s, -0.5 * s * w,
          std::pow(w, 0.5 * p) * (dpoly - 0.5 * p * poly * w) / (p * p)};
}

inline Coef coefficients(double b, double p) {
  if (p == 1) {  // C = S = (1 + b)^(-1/2)
    const double s = 1.0 / std::sqrt(1.0 + b), d = -0.5 * s * s * s;
    return {s, s, d, d};
  }
  if (p == 2) {  // S = 1/(1 + b/4), C = 2 S - 1
    const double q = 0.25 * b, s = 1.0 / (1.0 + q), ds = -0.25 * s * s;
    return {(1.0 - q) * s, s, 2.0 * ds, ds};
  }
  const bool inf = std::isinf(p);
  const double w = inf ? 1.0 : 1.0 / (1.0 + b / (p * p));  // dtheta/dbeta
  if (!inf && p == std::floor(p) && p <= kMaxRationalP) return rational(b, int(p), w);
  const double ip2 = inf ? 0.0 : 1.0 / (p * p);
  if (b < kTau * std::min(1.0, p * p)) {  // Taylor to O(b^3), and its derivative
    const double k2 = 1.0 / 6.0 + ip2 / 3.0, k4 = 1.0 / 120.0 + ip2 / 6.0 + ip2 * ip2 / 5.0;
    const double s = 1.0 - k2 * b + k4 * b * b;
    return {1.0 - 0.5 * b + (1.0 / 24.0 + ip2 / 3.0) * b * b, s, -0.5 * s * w,
            -k2 + 2.0 * k4 * b};
  }
  const double beta = std::sqrt(b), th = inf ? beta : p * std::atan(beta / p);
  const double c = std::cos(th), s = std::sin(th) / beta;
  return {c, s, -0.5 * s * w, (c * w - s) / (2.0 * b)};
}

int64_t grain(int64_t d) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(d, 1)); }

// h, u: (..., d), one floating dtype; a: one element of that dtype, CPU; p > 0 or inf.
void check(const at::Tensor& h, const at::Tensor& u, const at::Tensor& a, double p) {
  TORCH_CHECK(h.dim() >= 1 && h.sizes() == u.sizes(), "sphere step: h, u must be (..., d) alike");
  TORCH_CHECK(h.device().is_cpu() && u.device().is_cpu() && a.device().is_cpu(),
              "sphere step: CPU tensors only");
  TORCH_CHECK(h.scalar_type() == u.scalar_type() && h.scalar_type() == a.scalar_type(),
              "sphere step: h, u, a must share one dtype");
  TORCH_CHECK(a.numel() == 1, "sphere step: a must have one element");
  TORCH_CHECK(p > 0, "sphere step: p must be > 0 or inf");  // NaN fails too
}

std::vector<int64_t> beta_shape(const at::Tensor& h) {
  auto s = h.sizes().vec();
  s.back() = 1;
  return s;
}

constexpr int kRow = 8;  // per-row scalars saved for the backward: H, m, q, C, S, C', S'

// (out like h, b = beta^2 (..., 1), per-row scalars (rows, kRow)).
std::tuple<at::Tensor, at::Tensor, at::Tensor> step_fwd(const at::Tensor& h, const at::Tensor& u,
                                                         const at::Tensor& a, double p) {
  const int64_t d = h.size(-1), n = d ? h.numel() / d : 0;
  auto out = at::empty_like(h);
  auto b = at::empty(beta_shape(h), h.options());
  auto sc = at::empty({n, kRow}, h.options());
  AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "step_fwd", [&] {
    const scalar_t av = a.item<scalar_t>();
    const scalar_t *hp = h.const_data_ptr<scalar_t>(), *up = u.const_data_ptr<scalar_t>();
    scalar_t *op = out.mutable_data_ptr<scalar_t>(), *bp = b.mutable_data_ptr<scalar_t>();
    scalar_t* sp = sc.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, grain(d), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const scalar_t *__restrict__ hr = hp + r * d, *__restrict__ ur = up + r * d;
        scalar_t hh, uh;
        dot2(hr, ur, hr, d, hh, uh);
        const scalar_t m = uh / hh;
        const scalar_t q = zz_of(ur, hr, m, d) / hh;
        const scalar_t bb = q * (av * av);
        const Coef k = coefficients(double(bb), p);
        const scalar_t c = scalar_t(k.c), sa = scalar_t(k.s) * av;
        scalar_t* __restrict__ orow = op + r * d;
        for (int64_t i = 0; i < d; ++i) orow[i] = c * hr[i] + sa * (ur[i] - m * hr[i]);
        bp[r] = bb;
        scalar_t* s = sp + kRow * r;
        s[0] = hh, s[1] = m, s[2] = q, s[3] = c, s[4] = scalar_t(k.s);
        s[5] = scalar_t(k.dc), s[6] = scalar_t(k.ds), s[7] = 0;
      }
    });
  });
  return {out, b, sc};
}

// (dL/dh, dL/du, dL/da); g like h, gb (rows) values or undefined.
std::tuple<at::Tensor, at::Tensor, at::Tensor> step_bwd(const at::Tensor& g, const at::Tensor& gb,
                                                         const at::Tensor& h, const at::Tensor& u,
                                                         const at::Tensor& a, const at::Tensor& sc) {
  const int64_t d = h.size(-1), n = d ? h.numel() / d : 0;
  auto gh_out = at::empty_like(h);
  auto gu_out = at::empty_like(h);
  auto ga_rows = at::empty({n}, h.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "step_bwd", [&] {
    const scalar_t av = a.item<scalar_t>();
    const scalar_t *hp = h.const_data_ptr<scalar_t>(), *up = u.const_data_ptr<scalar_t>();
    const scalar_t *gp = g.const_data_ptr<scalar_t>(), *sp = sc.const_data_ptr<scalar_t>();
    const scalar_t* gbp = gb.defined() ? gb.const_data_ptr<scalar_t>() : nullptr;
    scalar_t *dh = gh_out.mutable_data_ptr<scalar_t>(), *du = gu_out.mutable_data_ptr<scalar_t>();
    double* gap = ga_rows.mutable_data_ptr<double>();
    at::parallel_for(0, n, grain(d), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const scalar_t *__restrict__ hr = hp + r * d, *__restrict__ ur = up + r * d;
        const scalar_t *__restrict__ gr = gp + r * d, *s = sp + kRow * r;
        const scalar_t hh = s[0], m = s[1], q = s[2], c = s[3], sv = s[4], dc = s[5], ds = s[6];
        scalar_t gh, gz;
        gdots(gr, hr, ur, m, d, gh, gz);
        const scalar_t sa = sv * av;
        // G = C' <g,h> + S' a <g,z> (+ dL/db): the total derivative along b
        scalar_t big_g = dc * gh + ds * av * gz;
        if (gbp) big_g += gbp[r];
        const scalar_t e = big_g * (scalar_t(2) * av * av) / hh;  // 2 a^2 G / H
        const scalar_t k = sa * gh / hh;                         // S a <g,h> / H
        const scalar_t ch = c - m * sa, cz = -(k + m * e), chh = k * m - q * e;
        scalar_t *__restrict__ dhr = dh + r * d, *__restrict__ dur = du + r * d;
        for (int64_t i = 0; i < d; ++i) {
          const scalar_t z = ur[i] - m * hr[i];
          dur[i] = sa * gr[i] + e * z - k * hr[i];  // S a g + e z - k h
          dhr[i] = ch * gr[i] + cz * z + chh * hr[i];  // (C - m S a) g - (m e + k) z + (k m - q e) h
        }
        gap[r] = double(sv * gz + scalar_t(2) * av * q * big_g);
      }
    });
  });
  // Summed in row order after the parallel part: the same result for any thread count.
  const double* gap = ga_rows.const_data_ptr<double>();
  double total = 0;
  for (int64_t r = 0; r < n; ++r) total += gap[r];
  return {gh_out, gu_out, at::full(a.sizes(), total, a.options())};
}

// One autograd node, all in C++: a Python autograd.Function costs more per call than the
// kernels themselves at small widths.
class NativeSphereStep : public torch::autograd::Function<NativeSphereStep> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& u,
                               const at::Tensor& a, double p) {
    auto hc = h.contiguous(), uc = u.contiguous();
    auto [out, b, sc] = step_fwd(hc, uc, a, p);
    ctx->save_for_backward({hc, uc, a, sc});
    ctx->set_materialize_grads(false);  // dL/db is usually undefined (beta^2 is only logged)
    return {out, b};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // The kernel's gradients carry no graph: refuse create_graph rather than give a silently
    // wrong second derivative (the Python step is once_differentiable for the same reason).
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "sphere step: no double backward (the closed-form backward is first-order only)");
    auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &u = saved[1], &a = saved[2], &sc = saved[3];
    at::Tensor g = grads[0].defined() ? grads[0].to(h.scalar_type()).contiguous()
                                      : at::zeros_like(h);
    at::Tensor gb = grads[1].defined() ? grads[1].to(h.scalar_type()).contiguous() : at::Tensor();
    auto [gh, gu, ga] = step_bwd(g, gb, h, u, a, sc);
    return {ctx->needs_input_grad(0) ? gh : at::Tensor(),
            ctx->needs_input_grad(1) ? gu : at::Tensor(),
            ctx->needs_input_grad(2) ? ga : at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> step(const at::Tensor& h, const at::Tensor& u,
                                        const at::Tensor& a, double p) {
  check(h, u, a, p);
  auto r = NativeSphereStep::apply(h, u, a, p);
  return {r[0], r[1]};
}

}  // namespace

TORCH_LIBRARY(geosweep_sphere, m) {
  m.def("step(Tensor h, Tensor u, Tensor a, float p) -> (Tensor, Tensor)");
  m.def("scale_norm(Tensor x, Tensor g, float eps) -> Tensor");
}

// CompositeImplicitAutograd: NativeSphereStep (NativeScaleNorm) is the autograd node itself,
// under no_grad and inference_mode too.
TORCH_LIBRARY_IMPL(geosweep_sphere, CompositeImplicitAutograd, m) {
  m.impl("step", &step);
  m.impl("scale_norm", &geosweep_sn::scale_norm);
}
