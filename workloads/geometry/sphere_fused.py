"""The SpheretNorm sublayer step as one autograd node with a closed-form backward.

``sphere_step_fused`` computes exactly what ``sphere.sphere_step`` (the reference, kept for
tests) computes, h_new = C(b) h + S(b) a z with z = P_h(u) and b = beta^2 = a^2 ||z||^2/||h||^2
(docs/science.md §2.3-2.4), but autograd records one node instead of ~20, and the backward is
six full-width passes plus two dot products instead of the reference's chain of small kernels.
That chain dominated the eager step at small widths (issue 16 §4).

Backward, per token, with g = dL/dh_new, H = ||h||^2, m = <u,h>/H, q = ||z||^2/H, b = a^2 q:

    G  = C'(b) <g,h> + S'(b) a <g,z> (+ dL/db)      total derivative along b
    e  = 2 a^2 G / H,   k = S a <g,h> / H           (k = <v,h>/H since z is orthogonal to h)
    dL/du = S a g + e z - k h                        (= P_h(v), v = dL/dz = S a g + e z)
    dL/dh = (C - m S a) g - (m e + k) z + (k m - q e) h
    dL/da = sum over tokens of  S <g,z> + 2 a q G

C' = dC/db and S' = dS/db come from ``coefficient_derivatives``: with w = dtheta/dbeta =
1/(1 + b/p^2), C' = -S w / 2 exactly, and S' = (C w - S)/(2b), which is evaluated without the
removable 1/b: in closed form for p = 1, 2, as a polynomial derivative for other integer p, and
through the Taylor branch below tau for real p and p = inf (the same tau as the forward).
"""

from __future__ import annotations

import contextlib
import math
from math import comb

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from workloads.geometry import sphere_native
from workloads.geometry.sphere import (
    _MAX_RATIONAL_P,
    _check_p,
    _tau,
    _up,
    fp32_region,
    sphere_coefficients,
    sphere_step,
)

__all__ = ["coefficient_derivatives", "sphere_step_fused", "sphere_step_eager"]


def _dot(x: Tensor, y: Tensor) -> Tensor:
    return (x * y).sum(-1, keepdim=True)


def _rational_ds(b: Tensor, p: int) -> Tensor:
    """dS/db for integer p: S = P(t2) (1 + t2)^(-p/2), t2 = b/p^2, P the odd-part polynomial."""
    t2 = b / (p * p)
    im = [comb(p, 2 * j + 1) * (-1) ** j / p for j in range((p - 1) // 2 + 1)]

    def horner(coef: list[float]) -> Tensor:
        out = torch.full_like(t2, float(coef[-1]))
        for a in reversed(coef[:-1]):
            out = out * t2 + a
        return out

    w = 1.0 / (1.0 + t2)
    inv = w.pow(0.5 * p)
    poly = horner(im)
    dpoly = horner([j * c for j, c in enumerate(im)][1:]) if len(im) > 1 else torch.zeros_like(t2)
    return inv * (dpoly - 0.5 * p * poly * w) / (p * p)


def coefficient_derivatives(b: Tensor, c: Tensor, s: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """(dC/db, dS/db) at b = beta^2 >= 0, given (C, S) = sphere_coefficients(b, p)."""
    _check_p(p)
    if p == 1:  # C = S = (1 + b)^(-1/2)
        d = -0.5 * s * s * s
        return d, d
    if p == 2:  # S = 1/(1 + b/4), C = 2 S - 1
        ds = -0.25 * s * s
        return 2.0 * ds, ds
    inf = math.isinf(p)
    w = None if inf else 1.0 / (1.0 + b / (p * p))
    dc = -0.5 * s if inf else -0.5 * s * w
    if not inf and float(p).is_integer() and p <= _MAX_RATIONAL_P:
        return dc, _rational_ds(b, int(p))
    # Real p or inf: S' = (C w - S)/(2b) above tau, the derivative of the Taylor series below
    # (double where, as in the forward, so neither branch sees the other's inputs).
    tau = _tau(p)
    ip2 = 0.0 if inf else 1.0 / (p * p)
    small = b < tau
    bs = b.clamp_min(tau)
    cw = c if inf else c * w
    ds_exact = (cw - s) / (2.0 * bs)
    ds_taylor = -(1.0 / 6.0 + ip2 / 3.0) + 2.0 * (1.0 / 120.0 + ip2 / 6.0 + ip2 * ip2 / 5.0) * b
    return dc, torch.where(small, ds_taylor, ds_exact)


def _region(x: Tensor):
    # Autocast is switched off only when it is on: entering the context costs more than the
    # small-width retraction's kernels (every op below is element-wise or a sum, which autocast
    # would not lower anyway; the explicit fp32 up-cast is what keeps the step in fp32).
    dev = x.device.type
    on = torch.is_autocast_enabled(dev) if dev in ("cpu", "cuda") else True
    return fp32_region(x) if on else contextlib.nullcontext()


class _SphereStep(torch.autograd.Function):
    """General p: out = C(b) h + S(b) a z."""

    @staticmethod
    def forward(ctx, h: Tensor, u: Tensor, a: Tensor, p: float):  # type: ignore[override]
        a_dt = a.dtype
        with _region(h):
            h32, u32 = _up(h), _up(u)
            a = a.to(h32.dtype)
            hh = _dot(h32, h32)
            m = _dot(u32, h32).div_(hh)
            z = torch.addcmul(u32, m, h32, value=-1.0)
            q = _dot(z, z).div_(hh)
            b = q * (a * a)
            c, s = sphere_coefficients(b, p)
            out = torch.addcmul(c * h32, s * a, z)
        ctx.save_for_backward(h32, z, a, hh, m, q, b, c, s)
        ctx.p, ctx.dtypes = p, (h.dtype, u.dtype, a_dt)
        ctx.set_materialize_grads(False)  # dL/db is usually None (beta^2 is only logged)
        return out.to(h.dtype), b

    @staticmethod
    @once_differentiable  # the backward's own graph would miss z, m, ... (forward-only)
    def backward(ctx, g_out: Tensor | None, g_b: Tensor | None):  # type: ignore[override]
        h, z, a, hh, m, q, b, c, s = ctx.saved_tensors
        h_dt, u_dt, a_dt = ctx.dtypes
        with _region(h):
            dc, ds = coefficient_derivatives(b, c, s, ctx.p)
            g = torch.zeros_like(h) if g_out is None else _up(g_out).to(h.dtype)
            gh, gz = _dot(g, h), _dot(g, z)
            sa = s * a
            big_g = torch.addcmul(dc * gh, ds * a, gz)
            if g_b is not None:
                big_g = big_g + g_b.to(h.dtype)
            e = big_g * (2.0 * a * a) / hh
            k = (sa * gh).div_(hh)
            grad_u = grad_h = grad_a = None
            if ctx.needs_input_grad[1]:
                grad_u = torch.addcmul(torch.addcmul(sa * g, e, z), k, h, value=-1.0).to(u_dt)
            if ctx.needs_input_grad[0]:
                t = torch.addcmul(torch.addcmul(c, m, sa, value=-1.0) * g, torch.addcmul(k, m, e),
                                  z, value=-1.0)
                grad_h = torch.addcmul(t, torch.addcmul(k * m, q, e, value=-1.0), h).to(h_dt)
            if ctx.needs_input_grad[2]:
                grad_a = torch.addcmul(s * gz, q * big_g, 2.0 * a).sum().to(a_dt)
        return grad_h, grad_u, grad_a, None


class _SphereStepP1(torch.autograd.Function):
    """p = 1 (the metric projection): the general step with C = S = c = (1 + b)^(-1/2) and
    C' = S' = -c^3/2, so out = c (h + a z) and G = -c^3/2 <g, h + a z>.

    Written for the op count, which is what the step costs at small widths (issue 16 §4):
    full-width results are built in place (one allocation each), the per-token scalars that
    the backward needs are formed once in the forward, and nothing is cast unless it has to be.
    """

    @staticmethod
    def forward(ctx, h: Tensor, u: Tensor, a: Tensor):  # type: ignore[override]
        h32, u32 = _up(h), _up(u)
        a32 = a if a.dtype == h32.dtype else a.to(h32.dtype)
        hh = _dot(h32, h32)
        m = _dot(u32, h32).div_(hh)
        z = torch.addcmul(u32, m, h32, value=-1.0)
        q = _dot(z, z).div_(hh)
        b = q * (a32 * a32)
        c = (b + 1.0).rsqrt_()
        out = torch.addcmul(h32, z, a32).mul_(c)
        ctx.save_for_backward(h32, z, a32, hh, m, q, c)
        ctx.dtypes = (h.dtype, u.dtype, a.dtype)
        ctx.set_materialize_grads(False)
        return (out if out.dtype == h.dtype else out.to(h.dtype)), b

    @staticmethod
    @once_differentiable  # the backward's own graph would miss z, m, ... (forward-only)
    def backward(ctx, g_out: Tensor | None, g_b: Tensor | None):  # type: ignore[override]
        h, z, a, hh, m, q, c = ctx.saved_tensors
        h_dt, u_dt, a_dt = ctx.dtypes
        if g_out is None:
            g = torch.zeros_like(h)
        else:
            g = g_out if g_out.dtype == h.dtype else g_out.to(h.dtype)
        gh, gz = _dot(g, h), _dot(g, z)
        ca = c * a
        # G = C' <g, h + a z> (+ dL/db), C' = -c^3/2
        big_g = torch.addcmul(gh, gz, a).mul_(c.pow(3).mul_(-0.5))
        if g_b is not None:
            big_g += g_b.to(h.dtype)
        e = big_g * ((2.0 * a * a) / hh)  # e = 2 a^2 G / H
        k = (ca * gh).div_(hh)  # k = c a <g,h> / H
        need_h, need_u, need_a = ctx.needs_input_grad
        grad_u = grad_h = grad_a = None
        if need_u:  # c a g + e z - k h
            grad_u = torch.mul(g, ca).addcmul_(e, z).addcmul_(k, h, value=-1.0)
            grad_u = grad_u if grad_u.dtype == u_dt else grad_u.to(u_dt)
        if need_h:  # (c - m c a) g - (m e + k) z + (k m - q e) h
            grad_h = torch.mul(g, torch.addcmul(c, m, ca, value=-1.0))
            grad_h.addcmul_(torch.addcmul(k, m, e), z, value=-1.0)
            grad_h.addcmul_((k * m).addcmul_(q, e, value=-1.0), h)
            grad_h = grad_h if grad_h.dtype == h_dt else grad_h.to(h_dt)
        if need_a:  # sum of c <g,z> + 2 a q G
            grad_a = torch.addcmul(gz.mul_(c), q * big_g, a, value=2.0).sum()
            grad_a = grad_a if grad_a.dtype == a_dt else grad_a.to(a_dt)
        return grad_h, grad_u, grad_a


def _scalar_alpha(h: Tensor, alpha: Tensor | float) -> Tensor | None:
    """alpha as a 0-d tensor, or None when it has several elements (the reference's case)."""
    if not isinstance(alpha, Tensor):
        return torch.tensor(float(alpha), device=h.device)
    if alpha.numel() != 1:
        return None
    return alpha if alpha.dim() == 0 else alpha.reshape(())  # a reshape is one more graph node


def sphere_step_fused(h: Tensor, u: Tensor, alpha: Tensor | float,
                      p: float) -> tuple[Tensor, Tensor]:
    """``sphere.sphere_step`` as one autograd node: (h_new in h's dtype, beta^2 (..., 1)).

    On CPU this is the compiled kernel (``sphere_native``) when it is built (or forced on),
    else the eager Function; the two agree to rounding. alpha is a Python number
    or a one-element tensor (a learnable step size); any other shape falls back to the
    reference, whose autograd handles broadcasting.
    """
    _check_p(p)
    a = _scalar_alpha(h, alpha)
    if a is None:
        return sphere_step(h, u, alpha, p)
    if sphere_native.usable(h, u) and sphere_native.active():  # CPU only: no load on GPU
        return sphere_native.sphere_step_native(h, u, a, float(p))
    return _SphereStepP1.apply(h, u, a) if p == 1 else _SphereStep.apply(h, u, a, float(p))


def sphere_step_eager(h: Tensor, u: Tensor, alpha: Tensor | float,
                      p: float) -> tuple[Tensor, Tensor]:
    """``sphere_step_fused`` that never takes the compiled kernel (tests, A/B timing)."""
    _check_p(p)
    a = _scalar_alpha(h, alpha)
    if a is None:
        return sphere_step(h, u, alpha, p)
    return _SphereStepP1.apply(h, u, a) if p == 1 else _SphereStep.apply(h, u, a, float(p))
