"""The p-SpheretNorm retraction on the sphere ||h|| = r (docs/science.md §2.3-2.4).

Every norm-preserving retraction in span{h, xi} is a rotation by an angle theta = phi(beta),
beta = ||xi|| / r. p-SpheretNorm uses theta_p(beta) = p * arctan(beta / p):
p = 1 is the metric projection, p = 2 the Cayley map, p -> inf the exponential map (GeoNorm).

    h_new = cos(theta) h + sin(theta) r xi/||xi||  =  C(beta^2) h + S(beta^2) xi,
    C = cos(theta_p),  S = sin(theta_p) / beta.

C and S are even and analytic in beta, so they are written as functions of beta^2 and we never
divide by ||xi||: u parallel to h, or u = 0, gives h_new = h with finite gradients.
All work is per token on the last dimension, in fp32 (fp64 stays fp64), even under autocast.
"""

from __future__ import annotations

import contextlib
import math
from math import comb

import torch
from torch import Tensor

__all__ = ["TAU", "sphere_coefficients", "tangent", "retract", "sphere_step", "theta",
           "fp32_region"]

TAU = 1e-6  # below this (in (beta/p)^2 units for p < 1) the Taylor branch is used
_MAX_RATIONAL_P = 8  # integer p up to this use the trig-free rational formula


def _check_p(p: float) -> None:
    if not (isinstance(p, (int, float)) and p > 0):  # NaN fails p > 0
        raise ValueError(f"p: must be a number > 0 or math.inf, got {p!r}")


def _tau(p: float) -> float:
    # The Taylor series is in beta^2 (1/6 + 1/(3 p^2)) etc., i.e. valid for (beta/p)^2 small,
    # which beta^2 < TAU only guarantees for p >= 1.
    return TAU * min(1.0, p * p)


def _taylor(beta2: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """cos(theta_p), sin(theta_p)/beta to O(beta^6) (docs/science.md §2.3, + beta^4 of S)."""
    ip2 = 0.0 if math.isinf(p) else 1.0 / (p * p)
    b4 = beta2 * beta2
    c = 1.0 - 0.5 * beta2 + (1.0 / 24.0 + ip2 / 3.0) * b4
    s = 1.0 - (1.0 / 6.0 + ip2 / 3.0) * beta2 + (1.0 / 120.0 + ip2 / 6.0 + ip2 * ip2 / 5.0) * b4
    return c, s


def _trig(beta2: Tensor, p: float) -> tuple[Tensor, Tensor]:
    b = beta2.sqrt()
    th = b if math.isinf(p) else p * torch.atan(b / p)
    return torch.cos(th), torch.sin(th) / b


def _rational(beta2: Tensor, p: int) -> tuple[Tensor, Tensor]:
    """Integer p: e^{i theta} = ((1 + i t) / |1 + i t|)^p with t = beta / p; polynomials in t^2."""
    t2 = beta2 / (p * p)
    re = [comb(p, 2 * j) * (-1) ** j for j in range(p // 2 + 1)]
    im = [comb(p, 2 * j + 1) * (-1) ** j / p for j in range((p - 1) // 2 + 1)]

    def horner(coef: list[float]) -> Tensor:
        out = torch.full_like(t2, float(coef[-1]))
        for a in reversed(coef[:-1]):
            out = out * t2 + a
        return out

    inv = (1.0 + t2).pow(-0.5 * p)
    return horner(re) * inv, horner(im) * inv


def sphere_coefficients(beta2: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """(C, S) = (cos theta_p, sin theta_p / beta) as functions of beta^2 >= 0; same shape."""
    _check_p(p)
    if p == 1:
        s = torch.rsqrt(1.0 + beta2)
        return s, s
    if p == 2:
        q = 0.25 * beta2
        s = 1.0 / (1.0 + q)
        return (1.0 - q) * s, s
    if not math.isinf(p) and float(p).is_integer() and p <= _MAX_RATIONAL_P:
        return _rational(beta2, int(p))
    # Double where: each branch only ever sees inputs on its own side of tau, so the branch
    # that is not selected cannot produce inf/NaN values or gradients.
    tau = _tau(p)
    small = beta2 < tau
    c_exact, s_exact = _trig(beta2.clamp_min(tau), p)
    c_taylor, s_taylor = _taylor(beta2.clamp_max(tau), p)
    return torch.where(small, c_taylor, c_exact), torch.where(small, s_taylor, s_exact)


def theta(beta2: Tensor, p: float) -> Tensor:
    """The rotation angle theta_p(beta) (for logging)."""
    _check_p(p)
    b = beta2.clamp_min(0).sqrt()
    return b if math.isinf(p) else p * torch.atan(b / p)


def _autocast_available(dev: str) -> bool:
    check = getattr(torch.amp, "is_autocast_available", None)  # torch >= 2.4
    return bool(check and check(dev))


def fp32_region(x: Tensor) -> contextlib.AbstractContextManager:
    """Autocast off on x's device (a bf16 retraction drifts ~0.4% in norm per layer)."""
    dev = x.device.type
    if dev in ("cpu", "cuda") or _autocast_available(dev):
        return torch.autocast(device_type=dev, enabled=False)
    return contextlib.nullcontext()  # e.g. meta tensors (shape/FLOP counting)


def _up(x: Tensor) -> Tensor:
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _sq(x: Tensor) -> Tensor:
    return (x * x).sum(-1, keepdim=True)


def tangent(u: Tensor, h: Tensor) -> Tensor:
    """Gram-Schmidt: z = u - (<u,h>/||h||^2) h per token (last dim). (..., d) -> (..., d)."""
    c = (u * h).sum(-1, keepdim=True) / _sq(h)
    return u - c * h


def retract(h: Tensor, xi: Tensor, p: float) -> Tensor:
    """h_new = C h + S xi on the sphere of radius ||h|| (xi tangent at h); fp32 inside."""
    with fp32_region(h):
        h32, xi32 = _up(h), _up(xi)
        beta2 = _sq(xi32) / _sq(h32)  # (..., 1)
        c, s = sphere_coefficients(beta2, p)
        out = c * h32 + s * xi32
    return out.to(h.dtype)


def sphere_step(h: Tensor, u: Tensor, alpha: Tensor | float, p: float) -> tuple[Tensor, Tensor]:
    """One SpheretNorm sublayer: retract(h, alpha * tangent(u, h), p), fused.

    Returns (h_new in h's dtype, beta^2 of shape (..., 1) in the compute dtype, fp32 or fp64).
    """
    with fp32_region(h):
        h32, u32 = _up(h), _up(u)
        hh = _sq(h32)  # (..., 1)
        z = torch.addcmul(u32, (u32 * h32).sum(-1, keepdim=True) / hh, h32, value=-1.0)
        beta2 = (alpha * alpha) * _sq(z) / hh
        c, s = sphere_coefficients(beta2, p)
        out = torch.addcmul(c * h32, s * alpha, z)
    return out.to(h.dtype), beta2
