"""Residual-stream families (docs/science.md §2.5-2.6): how a block's branches meet the stream.

A family is one small ``nn.Module`` with ``enter(x0) -> h``, ``sublayer(k, h, branch) -> h``
(k = 0 .. 2L-1; even = attention, odd = MLP) and ``exit(h) -> h`` (the final norm), registered
by name in ``RESIDUALS``. Its own parameters live in its ``Params`` dataclass (torch-free, in
``workloads/residual_params.py``) and are given as
``{"family": name, **params}``; ``family_params`` validates them. Tensors are (B, T, d).
``stream.stats()`` always gives the family's scalars (step sizes, radius, DyT alphas); set
``stream.record_stats = True`` to also keep per-sublayer summaries of the following forwards
(||h||, beta, theta, norm error). Nothing is recorded, and nothing synchronises, otherwise.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workloads.config import ConfigError
from workloads.geometry.sphere import sphere_step, theta
from workloads.geometry.sphere_fused import sphere_step_fused
from workloads.geometry.sphere_native import scale_norm
from workloads.residual_params import (  # noqa: F401  (re-exported: the families' parameters)
    FAMILY_PARAMS,
    GeoNormParams,
    KeelParams,
    PeriLNParams,
    PostLNParams,
    PreDyTParams,
    PreLNParams,
    SpheretParams,
    family_params,
)

__all__ = [
    "RESIDUALS", "family_params", "make_stream", "ResidualStream",
    "PreLNParams", "PostLNParams", "PeriLNParams", "PreDyTParams", "KeelParams",
    "GeoNormParams", "SpheretParams", "LayerNorm", "RMSNorm", "DyT",
]

Branch = Callable[[Tensor], Tensor]

# --- norms (gain init 1; bias 0 when enabled) ---------------------------------------------


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm: optional bias, eps 1e-5."""

    def __init__(self, d: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class DyT(nn.Module):
    """DyT(x) = weight * tanh(alpha x) + bias, scalar alpha (jiachenzhu/DyT dynamic_tanh.py)."""

    def __init__(self, d: int, alpha0: float):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha0)))
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * torch.tanh(self.alpha * x) + self.bias


def _up(x: Tensor) -> Tensor:
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _norm(kind: str, d: int, bias: bool) -> nn.Module:
    return LayerNorm(d, bias) if kind == "layernorm" else RMSNorm(d)


# --- streams ------------------------------------------------------------------------------


class ResidualStream(nn.Module, abc.ABC):
    """Base: identity entry, ``ln_f`` exit; records mean ||h|| per sublayer when asked."""

    Params: ClassVar[type] = PreLNParams

    def __init__(self, params: Any, d: int, n_layer: int, norm: str, bias: bool):
        super().__init__()
        self.params, self.d, self.n_layer = params, d, n_layer
        self.ln_f = _norm(norm, d, bias)
        self.record_stats = False
        self._rec: dict[str, Tensor] = {}

    def enter(self, x0: Tensor) -> Tensor:
        return x0

    @abc.abstractmethod
    def sublayer(self, k: int, h: Tensor, branch: Branch) -> Tensor:
        """Apply sublayer ``k`` (even: attention, odd: MLP) to the stream ``h``."""

    def exit(self, h: Tensor) -> Tensor:
        return self.ln_f(h)

    def stats(self) -> dict[str, float]:
        return {k: float(v) for k, v in self._rec.items()}

    def _record(self, k: int, h: Tensor) -> Tensor:
        if self.record_stats:
            self._rec[f"h_norm/{k}"] = _up(h.detach()).norm(dim=-1).mean()
        return h


class PreLN(ResidualStream):
    """h <- h + F(LN(h)) (nanoGPT)."""

    Params = PreLNParams

    def __init__(self, params, d, n_layer, norm, bias):
        super().__init__(params, d, n_layer, norm, bias)
        self.ln = nn.ModuleList(_norm(norm, d, bias) for _ in range(2 * n_layer))

    def sublayer(self, k, h, branch):
        return self._record(k, h + branch(self.ln[k](h)))


class PostLN(ResidualStream):
    """h <- LN(h + F(h)); ln_f kept for uniformity."""

    Params = PostLNParams

    def __init__(self, params, d, n_layer, norm, bias):
        super().__init__(params, d, n_layer, norm, bias)
        self.ln = nn.ModuleList(_norm(norm, d, bias) for _ in range(2 * n_layer))

    def sublayer(self, k, h, branch):
        return self._record(k, self.ln[k](h + branch(h)))


class PeriLN(ResidualStream):
    """h <- h + LN_out(F(LN_in(h))); optionally h0 = LN(x0)."""

    Params = PeriLNParams

    def __init__(self, params, d, n_layer, norm, bias):
        super().__init__(params, d, n_layer, norm, bias)
        self.ln_in = nn.ModuleList(_norm(norm, d, bias) for _ in range(2 * n_layer))
        self.ln_out = nn.ModuleList(_norm(norm, d, bias) for _ in range(2 * n_layer))
        self.ln_emb = _norm(norm, d, bias) if params.embed_ln else None

    def enter(self, x0):
        return x0 if self.ln_emb is None else self.ln_emb(x0)

    def sublayer(self, k, h, branch):
        return self._record(k, h + self.ln_out[k](branch(self.ln_in[k](h))))


class PreDyT(ResidualStream):
    """Pre-LN with every norm, ln_f included, replaced by DyT; embedding times a scalar sqrt(d)."""

    Params = PreDyTParams

    def __init__(self, params, d, n_layer, norm, bias):
        super().__init__(params, d, n_layer, norm, bias)
        a = (params.alpha_attn, params.alpha_ffn)
        self.dyt = nn.ModuleList(DyT(d, a[k % 2]) for k in range(2 * n_layer))
        self.ln_f = DyT(d, params.alpha_final)
        self.embed_scale = nn.Parameter(torch.tensor(math.sqrt(d))) if params.embed_scale else None

    def enter(self, x0):
        return x0 if self.embed_scale is None else self.embed_scale * x0

    def sublayer(self, k, h, branch):
        return self._record(k, h + branch(self.dyt[k](h)))

    def stats(self):
        out = super().stats()
        out.update({f"dyt_alpha/{k}": float(m.alpha.detach()) for k, m in enumerate(self.dyt)})
        return out


class Keel(ResidualStream):
    """h <- RMSNorm_post(alpha h + F(RMSNorm_pre(h))), alpha = L (or 2L); ln_f kept."""

    Params = KeelParams

    def __init__(self, params, d, n_layer, norm, bias):
        super().__init__(params, d, n_layer, norm, bias)
        a = params.alpha
        self.alpha = float({"L": n_layer, "2L": 2 * n_layer}.get(a, a))
        self.pre = nn.ModuleList(RMSNorm(d) for _ in range(2 * n_layer))
        self.post = nn.ModuleList(RMSNorm(d) for _ in range(2 * n_layer))

    def sublayer(self, k, h, branch):
        return self._record(k, self.post[k](self.alpha * h + branch(self.pre[k](h))))


class SpheretNorm(ResidualStream):
    """ScaleNorm entry h = g x0/(||x0|| + eps), then h <- R^(p)_h(a_k P_h(F(N_k(h)))) per sublayer.

    a_k = lambda_k softplus(m s_k), lambda_k = 1/sqrt(k) for k = 1..2L ("sublayer"),
    1/sqrt(block) ("block") or 1 ("none"); ||h|| = g afterwards. s_k starts where a_k =
    ``alpha_init`` x lambda_k (1.0: the value used so far, a [DESIGN] choice with no source;
    nGPT starts its step at 0.05). m = ``alpha_lr_mult``: under Adam-type optimisers (AdamW,
    the scalars' optimiser beside Muon) the update of s is ~lr whatever the gradient's scale, so
    m s moves m times faster: an lr multiplier for the step sizes alone, without a parameter
    group of their own (under plain SGD it scales the step by m^2).
    """

    Params = SpheretParams
    eps = 1e-6
    # One autograd node with a closed-form backward; sphere.sphere_step is the reference
    # (same values and gradients, ~20 nodes), kept for tests and A/B timing.
    step_fn: ClassVar[Callable[..., tuple[Tensor, Tensor]]] = staticmethod(sphere_step_fused)
    # ScaleNorm at the entry: one node on the compiled kernel when it is active (A/B: swap in
    # sphere_native.scale_norm_eager).
    entry_fn: ClassVar[Callable[[Tensor, Tensor, float], Tensor]] = staticmethod(scale_norm)

    def __init__(self, params, d, n_layer, norm, bias):
        super().__init__(params, d, n_layer, norm, bias)
        self.p = float(getattr(params, "p", math.inf))
        n = 2 * n_layer
        # lambda_k as Python floats: exact in any dtype, and no buffer indexing per sublayer
        blk = [math.ceil(k / 2) for k in range(1, n + 1)]
        self.lam = {"sublayer": [k**-0.5 for k in range(1, n + 1)],
                    "block": [b**-0.5 for b in blk], "none": [1.0] * n}[params.decay]
        self.alpha_lr_mult = float(getattr(params, "alpha_lr_mult", 1.0))
        # softplus^-1(alpha_init) = log(expm1(alpha_init)); log(e - 1) at alpha_init = 1
        s0 = math.log(math.expm1(float(getattr(params, "alpha_init", 1.0))))
        self.s = nn.Parameter(torch.full((n,), s0 / self.alpha_lr_mult))
        self._lam_t: Tensor | None = None  # lam as a tensor in s's dtype/device (see _lam)
        self._a: tuple[Tensor, ...] | None = None  # this forward's a_k (see enter)
        g = torch.tensor(math.sqrt(d))
        if params.radius == "learnable":
            self.g = nn.Parameter(g)
        else:
            self.register_buffer("g", g)
        self.inner = (nn.ModuleList(RMSNorm(d) for _ in range(n))
                      if params.inner_norm == "rmsnorm" else None)

    def _lam(self) -> Tensor:
        # Made from the Python floats in s's own dtype (a buffer cast from fp32 to fp64 would
        # keep fp32's rounding), once per dtype/device rather than once per forward.
        t, s = self._lam_t, self.s
        if t is None or t.dtype != s.dtype or t.device != s.device:
            t = self._lam_t = torch.tensor(self.lam, dtype=s.dtype, device=s.device)
        return t

    def _scaled(self, s: Tensor) -> Tensor:
        # m s_k; no node at all at the default m = 1 (the per-forward cost of issue 16 §4)
        return s if self.alpha_lr_mult == 1.0 else self.alpha_lr_mult * s

    def step_sizes(self) -> Tensor:
        """a_k for k = 0 .. 2L-1, shape (2L,)."""
        return self._lam() * F.softplus(self._scaled(self.s))

    def enter(self, x0):
        # Every a_k of this forward from one softplus: per sublayer, indexing s and taking its
        # softplus cost three autograd nodes, as much as a LayerNorm at small widths (issue 16
        # §4). Not under torch.compile, which fuses the per-sublayer form itself.
        self._a = None if torch.compiler.is_compiling() else self.step_sizes().unbind()
        # One node with the kernel (sphere_native), else one full-width op: the scale is
        # formed per token first.
        return self.entry_fn(x0, self.g, self.eps)

    def exit(self, h):
        self._a = None  # the next forward's sublayers must not see this forward's graph
        return super().exit(h)

    def sublayer(self, k, h, branch):
        u = branch(h if self.inner is None else self.inner[k](h))
        a = (self._a[k] if self._a is not None
             else self.lam[k] * F.softplus(self._scaled(self.s[k])))
        # Under torch.compile the reference goes in: Inductor fuses its ~20 nodes itself, and on
        # CUDA (torch 2.11, H200, bf16 autocast) the compiled custom Function gave different
        # gradients from step 2 on while the compiled reference matched eager to 1e-3.
        step = sphere_step if torch.compiler.is_compiling() else self.step_fn
        h_new, beta2 = step(h, u, a, self.p)
        if self.params.guard or self.record_stats:
            hh = (_up(h) ** 2).sum(-1, keepdim=True)
            ratio = ((_up(h_new) ** 2).sum(-1, keepdim=True) / hh).sqrt()  # ||h_new|| / r
            if self.record_stats:
                self._record_sphere(k, beta2, ratio)
            if self.params.guard:
                h_new = h_new / ratio.to(h_new.dtype)
        return h_new

    def _record_sphere(self, k: int, beta2: Tensor, ratio: Tensor) -> None:
        b2 = beta2.detach().flatten()
        th = theta(b2, self.p)
        rec = self._rec
        rec[f"beta_mean/{k}"] = b2.clamp_min(0).sqrt().mean()
        rec[f"theta_mean/{k}"] = th.mean()
        rec[f"theta_p95/{k}"] = torch.quantile(th, 0.95)
        rec[f"frac_beta_gt_half_pi/{k}"] = (b2 > (math.pi / 2) ** 2).float().mean()
        err = (ratio.detach() - 1).abs().max()
        rec["norm_err"] = torch.maximum(rec.get("norm_err", err), err) if k else err

    def stats(self):
        out = super().stats()
        out["radius"] = float(self.g.detach())
        out.update({f"a/{k}": float(a) for k, a in enumerate(self.step_sizes().detach())})
        # the saturation control (docs/metrics.md): the worst sublayer's normalised step beta
        # and its share of tokens past pi/2, where the p = 1 angle saturates and a sublayer
        # overwrites the stream rather than turning it
        for name in ("beta_mean", "frac_beta_gt_half_pi"):
            per = [v for k, v in out.items() if k.startswith(name + "/")]
            if per:
                out[f"{name}_max"] = max(per)
        return out

    def step_rows(self, step: int) -> list[dict]:
        """The recorded per-sublayer beta summaries as metric rows (module ``stream``, layer k)
        so that a sweep's Parquet keeps beta over training, not only its last value."""
        rows = []
        for key, v in self.stats().items():
            name, _, k = key.partition("/")
            if name in ("beta_mean", "frac_beta_gt_half_pi") and k.isdigit():
                rows.append({"step": step, "metric": f"stream.{name}", "module": "stream",
                             "layer": int(k), "next_layer": -1, "value": float(v)})
        return rows


class GeoNorm(SpheretNorm):
    """SpheretNorm with p = inf (the exponential map); same ScaleNorm and step decay."""

    Params = GeoNormParams


RESIDUALS: dict[str, type[ResidualStream]] = {
    "pre_ln": PreLN,
    "post_ln": PostLN,
    "peri_ln": PeriLN,
    "pre_dyt": PreDyT,
    "keel": Keel,
    "geonorm": GeoNorm,
    "spheret": SpheretNorm,
}


def make_stream(residual: dict, d: int, n_layer: int, norm: str = "layernorm",
                bias: bool = False) -> ResidualStream:
    """Build the family named by ``residual["family"]``; norm is "layernorm" or "rmsnorm"."""
    params = family_params(residual)
    if norm not in ("layernorm", "rmsnorm"):
        raise ConfigError(f"norm: {norm!r} is not one of layernorm, rmsnorm")
    return RESIDUALS[residual["family"]](params, d, n_layer, norm, bias)
