// The p = 1 SpheretNorm step (the metric projection) as two fused CPU kernels, forward and
// closed-form backward (docs/science.md §2.3-2.4; the formulas are those of
// workloads/geometry/sphere_fused.py, _SphereStepP1). One kernel each way instead of the ~40
// element-wise ops of the eager form: at small widths the step is all per-op overhead.
// Rows (tokens) are independent, so the result does not depend on the thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>

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

int64_t grain(int64_t d) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(d, 1)); }

// h, u: (..., d), contiguous, one floating dtype; a: one element of that dtype, CPU.
void check(const at::Tensor& h, const at::Tensor& u, const at::Tensor& a) {
  TORCH_CHECK(h.dim() >= 1 && h.sizes() == u.sizes(), "p1_step: h, u must be (..., d) alike");
  TORCH_CHECK(h.device().is_cpu() && u.device().is_cpu() && a.device().is_cpu(),
              "p1_step: CPU tensors only");
  TORCH_CHECK(h.scalar_type() == u.scalar_type() && h.scalar_type() == a.scalar_type(),
              "p1_step: h, u, a must share one dtype");
  TORCH_CHECK(a.numel() == 1, "p1_step: a must have one element");
}

std::vector<int64_t> beta_shape(const at::Tensor& h) {
  auto s = h.sizes().vec();
  s.back() = 1;
  return s;
}

// (out like h, b = beta^2 (..., 1), per-row scalars (rows, 4) = [H, m, q, c]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> p1_fwd(const at::Tensor& h, const at::Tensor& u,
                                                       const at::Tensor& a) {
  const int64_t d = h.size(-1), n = d ? h.numel() / d : 0;
  auto out = at::empty_like(h);
  auto b = at::empty(beta_shape(h), h.options());
  auto sc = at::empty({n, 4}, h.options());
  AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "p1_fwd", [&] {
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
        const scalar_t c = scalar_t(1) / std::sqrt(bb + scalar_t(1));
        scalar_t* __restrict__ orow = op + r * d;
        for (int64_t i = 0; i < d; ++i) orow[i] = (hr[i] + (ur[i] - m * hr[i]) * av) * c;
        bp[r] = bb;
        scalar_t* s = sp + 4 * r;
        s[0] = hh, s[1] = m, s[2] = q, s[3] = c;
      }
    });
  });
  return {out, b, sc};
}

// (dL/dh, dL/du, dL/da); g like h, gb (rows) values or undefined.
std::tuple<at::Tensor, at::Tensor, at::Tensor> p1_bwd(const at::Tensor& g, const at::Tensor& gb,
                                                       const at::Tensor& h, const at::Tensor& u,
                                                       const at::Tensor& a, const at::Tensor& sc) {
  const int64_t d = h.size(-1), n = d ? h.numel() / d : 0;
  auto gh_out = at::empty_like(h);
  auto gu_out = at::empty_like(h);
  auto ga_rows = at::empty({n}, h.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "p1_bwd", [&] {
    const scalar_t av = a.item<scalar_t>();
    const scalar_t *hp = h.const_data_ptr<scalar_t>(), *up = u.const_data_ptr<scalar_t>();
    const scalar_t *gp = g.const_data_ptr<scalar_t>(), *sp = sc.const_data_ptr<scalar_t>();
    const scalar_t* gbp = gb.defined() ? gb.const_data_ptr<scalar_t>() : nullptr;
    scalar_t *dh = gh_out.mutable_data_ptr<scalar_t>(), *du = gu_out.mutable_data_ptr<scalar_t>();
    double* gap = ga_rows.mutable_data_ptr<double>();
    at::parallel_for(0, n, grain(d), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const scalar_t *__restrict__ hr = hp + r * d, *__restrict__ ur = up + r * d;
        const scalar_t *__restrict__ gr = gp + r * d, *s = sp + 4 * r;
        const scalar_t hh = s[0], m = s[1], q = s[2], c = s[3];
        scalar_t gh, gz;
        gdots(gr, hr, ur, m, d, gh, gz);
        const scalar_t ca = c * av;
        // G = C'(b) <g, h + a z> (+ dL/db), C' = -c^3/2
        scalar_t big_g = (gh + gz * av) * (scalar_t(-0.5) * c * c * c);
        if (gbp) big_g += gbp[r];
        const scalar_t e = big_g * (scalar_t(2) * av * av) / hh;  // 2 a^2 G / H
        const scalar_t k = ca * gh / hh;                         // c a <g,h> / H
        const scalar_t ch = c - m * ca, cz = -(k + m * e), chh = k * m - q * e;
        scalar_t *__restrict__ dhr = dh + r * d, *__restrict__ dur = du + r * d;
        for (int64_t i = 0; i < d; ++i) {
          const scalar_t z = ur[i] - m * hr[i];
          dur[i] = ca * gr[i] + e * z - k * hr[i];  // c a g + e z - k h
          dhr[i] = ch * gr[i] + cz * z + chh * hr[i];  // (c - m c a) g - (m e + k) z + (k m - q e) h
        }
        gap[r] = double(c * gz + scalar_t(2) * av * q * big_g);
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
class P1Step : public torch::autograd::Function<P1Step> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& u,
                               const at::Tensor& a) {
    auto hc = h.contiguous(), uc = u.contiguous();
    auto [out, b, sc] = p1_fwd(hc, uc, a);
    ctx->save_for_backward({hc, uc, a, sc});
    ctx->set_materialize_grads(false);  // dL/db is usually undefined (beta^2 is only logged)
    return {out, b};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // The kernel's gradients carry no graph: refuse create_graph rather than give a silently
    // wrong second derivative (the Python step is once_differentiable for the same reason).
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "p1_step: no double backward (the closed-form backward is first-order only)");
    auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &u = saved[1], &a = saved[2], &sc = saved[3];
    at::Tensor g = grads[0].defined() ? grads[0].to(h.scalar_type()).contiguous()
                                      : at::zeros_like(h);
    at::Tensor gb = grads[1].defined() ? grads[1].to(h.scalar_type()).contiguous() : at::Tensor();
    auto [gh, gu, ga] = p1_bwd(g, gb, h, u, a, sc);
    return {ctx->needs_input_grad(0) ? gh : at::Tensor(),
            ctx->needs_input_grad(1) ? gu : at::Tensor(),
            ctx->needs_input_grad(2) ? ga : at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> p1_step(const at::Tensor& h, const at::Tensor& u,
                                           const at::Tensor& a) {
  check(h, u, a);
  auto r = P1Step::apply(h, u, a);
  return {r[0], r[1]};
}

}  // namespace

TORCH_LIBRARY(geosweep_sphere, m) {
  m.def("p1_step(Tensor h, Tensor u, Tensor a) -> (Tensor, Tensor)");
}

// CompositeImplicitAutograd: P1Step is the autograd node itself, under no_grad and
// inference_mode too.
TORCH_LIBRARY_IMPL(geosweep_sphere, CompositeImplicitAutograd, m) {
  m.impl("p1_step", &p1_step);
}
