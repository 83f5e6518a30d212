"""Muon and Manifold Muon for the hidden matrices; docs/science.md §3.1-3.4.

One optimizer class; every param group carries a ``constraint``:

- ``none``: Muon, W <- (1 - eta wd) W - eta s msign(G~) (Paper B's UNCONSTRAINED arm; s = 1, or
  sqrt(max(1, m/n)) with ``shape_scale`` as in Keller Jordan's Muon);
- a constrained ``MANIFOLDS`` entry (``stiefel``, ``dgram``): Manifold Muon in tall form (wide
  matrices transposed), A from the manifold's dual ascent, W' = W - eta A, then its retraction;
  no weight decay.

Same-shape matrices of a group are stacked and updated as one batch (..., m, n): the math is the
per-matrix math, with ~1/B the kernel launches. The pure functions do the math; the class loops.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Any

import torch

from workloads.geometry.dual import DEFAULT_DUAL, DualOptions
from workloads.geometry.manifolds import get_manifold
from workloads.geometry.msign import msign

__all__ = ["Muon", "muon_direction", "muon_update", "manifold_muon_step"]


def muon_direction(
    buf: torch.Tensor, g: torch.Tensor, momentum: float, nesterov: bool, form: str
) -> torch.Tensor:
    """Update the momentum ``buf`` in place from gradient ``g``; return the direction G~.

    ``sum`` (Paper B): B <- mu B + g, G~ = g + mu B.
    ``ema`` (Keller Jordan): M <- mu M + (1 - mu) g, G~ = (1 - mu) g + mu M.
    Without Nesterov, G~ is the buffer itself.
    """
    if form == "sum":
        buf.mul_(momentum).add_(g)
        return g + momentum * buf if nesterov else buf.clone()
    if form == "ema":
        buf.lerp_(g, 1.0 - momentum)
        return g.lerp(buf, momentum) if nesterov else buf.clone()
    raise ValueError(f"momentum form {form!r} is not one of sum, ema")


def muon_update(d: torch.Tensor, msign_method: str, shape_scale: bool) -> torch.Tensor:
    """The unconstrained Muon update msign(G~) (..., m, n), optionally times sqrt(max(1, m/n))."""
    u = msign(d, method=msign_method)
    if shape_scale:
        u = u * math.sqrt(max(1.0, d.shape[-2] / d.shape[-1]))
    return u


def manifold_muon_step(
    W: torch.Tensor,
    G: torch.Tensor,
    lr: float,
    constraint: str,
    dual: DualOptions = DEFAULT_DUAL,
    dgram_retraction: str = "paper_svd_sorted",
    warm: dict | None = None,
    exact_retraction: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Manifold Muon step for W, G (..., m, n), any orientation (wide ones go tall inside).

    Returns ``(W_new, dual_residual, dual_passes, displacement)``, the last three of shape
    (...): the true residual ||P(W^T A + A^T W)||_F / n of the direction applied (against
    this W), the passes the solver took, and ||R(W') - W'||_F / ||W'||_F. ``warm``, when given,
    carries the dual multiplier between steps: its ``"lambda"`` (..., n, n) and ``"mu"`` (...)
    warm-start the solve (where ``dual``'s mode does) and are replaced by the new ones (``mu``:
    the smoothing of the direction taken, ``DualResult.mu``).
    ``exact_retraction``: the exact SVD polar factor (Muon's ``msign: svd``).
    """
    manifold = get_manifold(constraint)
    if not manifold.constrained:
        raise ValueError(f"constraint {constraint!r} has no manifold step (plain Muon)")
    transposed = W.shape[-2] < W.shape[-1]
    if transposed:
        W, G = W.mT, G.mT
    W2, residual, passes, displacement, L, mu = manifold.step(
        W, G, lr, dual, None if warm is None else warm.get("lambda"),
        exact=exact_retraction, retraction=dgram_retraction,
        mu0=None if warm is None else warm.get("mu"))
    if warm is not None:
        warm["lambda"], warm["mu"] = L, mu
    return (W2.mT if transposed else W2), residual, passes, displacement


class Muon(torch.optim.Optimizer):
    """Muon / Manifold Muon over 2-d matrices; each group has ``constraint`` and ``names``.

    ``self.state[p]`` keeps ``momentum_buffer`` and, for manifold groups, the last
    ``dual_residual``, ``dual_passes``, ``dual_mu`` and ``retraction_displacement`` (0-d; no host
    sync per step) and ``dual_lambda``, the multiplier that warm-starts the next step's dual
    (the momentum direction and W change little per step). ``dual_stats()`` reads them back.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        momentum_form: str = "sum",
        msign: str = "polar_express",
        weight_decay: float = 0.0,
        shape_scale: bool = False,
        dgram_retraction: str = "paper_svd_sorted",
        dual: DualOptions = DEFAULT_DUAL,
    ) -> None:
        # the solver's options as plain group entries (a state_dict must load with
        # weights_only=True, which refuses a dataclass)
        defaults = dict(
            lr=lr, momentum=momentum, nesterov=nesterov, momentum_form=momentum_form,
            msign=msign, weight_decay=weight_decay, shape_scale=shape_scale,
            dgram_retraction=dgram_retraction, constraint="none", names=None,
            **{f"dual_{k}": v for k, v in dataclasses.asdict(dual).items()},
        )
        super().__init__(params, defaults)
        for group in self.param_groups:
            get_manifold(group["constraint"])  # one-line ValueError naming the valid ones
            if group["names"] is None:
                group["names"] = [f"param{i}" for i in range(len(group["params"]))]
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon manages 2-d matrices only, got shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step_group(group)
        return loss

    def _step_group(self, group: dict) -> None:
        # --- momentum, per matrix; then bucket same-shape matrices into one batch --------
        buckets: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = defaultdict(list)
        constrained = get_manifold(group["constraint"]).constrained
        for p in group["params"]:
            if p.grad is None:
                continue
            g = p.grad.float()
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(g)
            d = muon_direction(state["momentum_buffer"], g, group["momentum"],
                               group["nesterov"], group["momentum_form"])
            buckets[self._bucket(p, constrained)].append((p, d))
        lr, constraint = group["lr"], group["constraint"]
        for items in buckets.values():
            ps = [p for p, _ in items]
            # --- unconstrained Muon ----------------------------------------------------------
            if not constrained:
                D = torch.stack([d for _, d in items])  # (B, m, n)
                U = muon_update(D, group["msign"], group["shape_scale"])
                for i, p in enumerate(ps):
                    if group["weight_decay"]:
                        p.mul_(1.0 - lr * group["weight_decay"])
                    p.add_(U[i].to(p.dtype), alpha=-lr)
                continue
            # --- Manifold Muon: one tall batch (wide matrices transposed, so an MLP's c_fc and
            # c_proj share a bucket: one eigh call per pass for both) ------------------------
            wide = [p.shape[-2] < p.shape[-1] for p in ps]
            W = torch.stack([(p.mT if w else p).float() for p, w in zip(ps, wide)])
            D = torch.stack([d.mT if w else d for (_, d), w in zip(items, wide)])
            lams = [self.state[p].get("dual_lambda") for p in ps]
            mus = [self.state[p].get("dual_mu") for p in ps]
            warm = {}
            if all(x is not None for x in lams):
                warm["lambda"] = torch.stack(lams)
                if all(x is not None for x in mus):
                    warm["mu"] = torch.stack(mus)
            W_new, residual, passes, displacement = manifold_muon_step(
                W, D, lr, constraint, self._dual(group), group["dgram_retraction"], warm,
                exact_retraction=group["msign"] == "svd",
            )
            for i, p in enumerate(ps):
                p.copy_((W_new[i].mT if wide[i] else W_new[i]).to(p.dtype))
                if warm.get("lambda") is not None:
                    # in p.dtype: load_state_dict casts float state to it, so a reload resumes
                    # bit-identically
                    self.state[p]["dual_lambda"] = warm["lambda"][i].to(p.dtype)
                self.state[p]["dual_residual"] = residual[i].detach().to(p.dtype)
                self.state[p]["dual_passes"] = passes[i].detach()
                self.state[p]["dual_mu"] = warm["mu"][i].detach().to(p.dtype)
                self.state[p]["retraction_displacement"] = displacement[i].detach()

    @staticmethod
    def _dual(group: dict) -> DualOptions:
        """The group's solver options (its ``dual_*`` entries)."""
        return DualOptions(**{f.name: group[f"dual_{f.name}"]
                              for f in dataclasses.fields(DualOptions)})

    @staticmethod
    def _bucket(p: torch.Tensor, constrained: bool) -> tuple:
        """Same key, one batch. Manifold Muon works on the tall form, so its key is the
        orientation-free shape; plain Muon keeps the shape as is."""
        shape = tuple(p.shape)
        return (tuple(sorted(shape, reverse=True)) if constrained else shape), p.device

    def dual_stats(self) -> list[tuple[str, float, int]]:
        """``(name, dual residual, passes)`` of each manifold matrix's last step (one sync)."""
        names, vals = [], []
        for group in self.param_groups:
            for name, p in zip(group["names"], group["params"]):
                st = self.state.get(p, {})
                if "dual_residual" in st:
                    names.append(name)
                    vals.append(torch.stack([st["dual_residual"].double(),
                                             st["dual_passes"].double()]))
        if not vals:
            return []
        rows = torch.stack(vals).cpu().tolist()
        return [(n, r, int(k)) for n, (r, k) in zip(names, rows)]
