// SpheretNorm's entry, ScaleNorm h = g x / (||x|| + eps) per row (docs/science.md §2.4), as one
// CPU kernel each way and one C++ autograd node. Included by sphere_step.cpp, which registers
// it (one translation unit: the torch headers are compiled once, half the build time). In
// eager form it is four ops forward and about twelve backward, ~3% of a gpt-debug step.
// Gradients are those of autograd on the eager form, including its zero-norm convention
// (d||x||/dx = 0 at x = 0). Rows are independent and dL/dg is summed in row order, so the
// result does not depend on the thread count.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>

namespace geosweep_sn {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <typename T>
inline T dot8(const T* __restrict__ x, const T* __restrict__ y, int64_t d) {
  T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j] * y[i + j];
  T rest = 0;
  for (; i < d; ++i) rest += x[i] * y[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + rest;
}

int64_t rows_grain(int64_t d) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(d, 1)); }

// (out like x, ||x|| per row).
std::tuple<at::Tensor, at::Tensor> sn_fwd(const at::Tensor& x, const at::Tensor& g, double eps) {
  const int64_t d = x.size(-1), n = d ? x.numel() / d : 0;
  auto out = at::empty_like(x);
  auto norms = at::empty({n}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "scale_norm_fwd", [&] {
    const scalar_t gv = *g.const_data_ptr<scalar_t>(), ev = scalar_t(eps);
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t *op = out.mutable_data_ptr<scalar_t>(), *np = norms.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, rows_grain(d), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const scalar_t* __restrict__ xr = xp + r * d;
        const scalar_t nr = std::sqrt(dot8(xr, xr, d)), s = gv / (nr + ev);
        scalar_t* __restrict__ orow = op + r * d;
        for (int64_t i = 0; i < d; ++i) orow[i] = xr[i] * s;
        np[r] = nr;
      }
    });
  });
  return {out, norms};
}

// (dL/dx, dL/dg): with s = g/(n + eps) and D = <go, x>,
// dL/dx = s go - g D / ((n + eps)^2 n) x   (the second term 0 where n = 0),
// dL/dg = sum over rows of D / (n + eps).
std::tuple<at::Tensor, at::Tensor> sn_bwd(const at::Tensor& go, const at::Tensor& x,
                                          const at::Tensor& g, const at::Tensor& norms,
                                          double eps) {
  const int64_t d = x.size(-1), n = d ? x.numel() / d : 0;
  auto gx = at::empty_like(x);
  auto gg_rows = at::empty({n}, x.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "scale_norm_bwd", [&] {
    const scalar_t gv = *g.const_data_ptr<scalar_t>(), ev = scalar_t(eps);
    const scalar_t *xp = x.const_data_ptr<scalar_t>(), *gop = go.const_data_ptr<scalar_t>();
    const scalar_t* np = norms.const_data_ptr<scalar_t>();
    scalar_t* gxp = gx.mutable_data_ptr<scalar_t>();
    double* ggp = gg_rows.mutable_data_ptr<double>();
    at::parallel_for(0, n, rows_grain(d), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const scalar_t *__restrict__ xr = xp + r * d, *__restrict__ gr = gop + r * d;
        const scalar_t nr = np[r], den = nr + ev, s = gv / den;
        const scalar_t dd = dot8(gr, xr, d);
        const scalar_t cx = nr > 0 ? -gv * dd / (den * den * nr) : scalar_t(0);
        scalar_t* __restrict__ out = gxp + r * d;
        for (int64_t i = 0; i < d; ++i) out[i] = s * gr[i] + cx * xr[i];
        ggp[r] = double(dd / den);
      }
    });
  });
  const double* ggp = gg_rows.const_data_ptr<double>();
  double total = 0;
  for (int64_t r = 0; r < n; ++r) total += ggp[r];
  return {gx, at::full(g.sizes(), total, g.options())};
}

class NativeScaleNorm : public torch::autograd::Function<NativeScaleNorm> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& g,
                            double eps) {
    auto xc = x.contiguous();
    auto [out, norms] = sn_fwd(xc, g, eps);
    ctx->save_for_backward({xc, g, norms});
    ctx->saved_data["eps"] = eps;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "scale_norm: no double backward (the closed-form backward is first-order only)");
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &g = saved[1], &norms = saved[2];
    auto [gx, gg] = sn_bwd(grads[0].to(x.scalar_type()).contiguous(), x, g, norms,
                           ctx->saved_data["eps"].toDouble());
    return {ctx->needs_input_grad(0) ? gx : at::Tensor(),
            ctx->needs_input_grad(1) ? gg : at::Tensor(), at::Tensor()};
  }
};

at::Tensor scale_norm(const at::Tensor& x, const at::Tensor& g, double eps) {
  TORCH_CHECK(x.dim() >= 1 && x.device().is_cpu() && g.device().is_cpu() && g.numel() == 1 &&
                  x.scalar_type() == g.scalar_type(),
              "scale_norm: x (..., d) and a one-element g, CPU, one dtype");
  return NativeScaleNorm::apply(x, g, eps);
}

}  // namespace geosweep_sn
