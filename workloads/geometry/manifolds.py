"""``MANIFOLDS``: one object per weight constraint of Manifold Muon; docs/science.md §3.2-3.4.

Modula-style: a constraint is an object with ``project`` (nearest point), ``dualize`` (the
steepest unit-spectral-norm direction that stays tangent: the dual ascent), ``retract`` (back
onto the manifold after a step), ``tangent_project`` and ``violation``. All take tall
(..., m, n) matrices, m >= n. A new constraint is one class plus one registry line; choice lists
(``optim.manifold.assignment`` values) are the registry's keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workloads.geometry.dgram import (
    DGRAM_RETRACTIONS,
    dgram_retract,
    dgram_tangent_project,
    dgram_violation,
    off,
)
from workloads.geometry.dual import DualResult, MsignFn, Projector, dual_ascent, identity
from workloads.geometry.msign import msign
from workloads.geometry.stiefel import (
    stiefel_retract,
    stiefel_tangent_project,
    stiefel_violation,
)
from workloads.geometry.stiefel_step import stiefel_gram_step

StepResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"]

__all__ = ["DualOptions", "Manifold", "MANIFOLDS", "get_manifold"]


@dataclass(frozen=True)
class DualOptions:
    """The dual ascent's knobs (``optim.manifold.dual_*``); see ``workloads.geometry.dual``."""

    method: str = "newton"
    steps: int = 20
    lr: float = 0.1
    tol: float = 1e-6
    smooth: float = 1e-3
    msign_method: str = "polar_express"
    cg_iters: int = 30


def _fast_msign(W: torch.Tensor) -> str:
    """The retraction's msign: Polar Express on CUDA (bf16, as both reference codes), the exact
    Gram route on CPU, where 12 fp32 Polar Express steps on the tall matrix cost far more and
    leave ~1e-5 (docs/science.md §3.6)."""
    return "msign" if W.is_cuda else "gram"


class Manifold:
    """Base: the unconstrained case (plain Muon): no projector, identity maps."""

    name = "none"
    constrained = False
    projector: Projector | None = None
    retractions: tuple[str, ...] = ()

    def project(self, W: torch.Tensor) -> torch.Tensor:
        return W

    def retract(self, W: torch.Tensor, exact: bool = False, retraction: str | None = None
                ) -> torch.Tensor:
        return W

    def tangent_project(self, W: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
        return Z

    def violation(self, W: torch.Tensor) -> torch.Tensor:
        return torch.zeros(W.shape[:-2], dtype=W.dtype, device=W.device)

    def dual_frame(self, W: torch.Tensor) -> torch.Tensor:
        """The W the dual ascent works with (same tangent space, better scaled)."""
        return W

    def dualize(self, G: torch.Tensor, W: torch.Tensor, opts: DualOptions = DualOptions(),
                L0: torch.Tensor | None = None) -> DualResult:
        """The direction A with ``residual = ||H||_F / n`` and ``passes``; plain msign here.
        ``L0`` warm-starts the multiplier (a previous ``DualResult.L``)."""
        if self.projector is None:
            zeros = torch.zeros(G.shape[:-2], dtype=G.dtype, device=G.device)
            return DualResult(msign(G, method=opts.msign_method), zeros, zeros.long())
        msign_fn: MsignFn = lambda X: msign(X, method=opts.msign_method)  # noqa: E731
        # The paper's absolute variant keeps its raw W (faithful reproduction).
        frame = W if opts.method == "absolute" else self.dual_frame(W)
        return dual_ascent(G, frame, self.projector, opts.method, opts.steps, opts.lr,
                           opts.tol, msign_fn, opts.cg_iters, opts.smooth, L0)

    def step(self, W: torch.Tensor, G: torch.Tensor, lr: float, opts: DualOptions = DualOptions(),
             L0: torch.Tensor | None = None, exact: bool = False, retraction: str | None = None
             ) -> StepResult:
        """W' = retract(W - lr A) for tall W, G: ``(W', residual, passes, displacement, L)``,
        displacement = ||W' - W1||_F / ||W1||_F with W1 = W - lr A (docs/science.md §3.5)."""
        dual = self.dualize(G, W, opts, L0)
        W1 = W - lr * dual.A
        W2 = self.retract(W1, exact=exact, retraction=retraction)
        displacement = torch.linalg.matrix_norm(W2 - W1) / torch.linalg.matrix_norm(W1)
        return W2, dual.residual, dual.passes, displacement, dual.L


class Stiefel(Manifold):
    """St(m, n) = {W^T W = I}; Gram projector identity; retraction msign (or exact SVD)."""

    name = "stiefel"
    constrained = True
    projector = staticmethod(identity)
    retractions = ("msign",)

    def project(self, W: torch.Tensor) -> torch.Tensor:
        return stiefel_retract(W, "svd")

    def retract(self, W: torch.Tensor, exact: bool = False, retraction: str | None = None
                ) -> torch.Tensor:
        return stiefel_retract(W, "svd" if exact else _fast_msign(W))

    def step(self, W: torch.Tensor, G: torch.Tensor, lr: float, opts: DualOptions = DualOptions(),
             L0: torch.Tensor | None = None, exact: bool = False, retraction: str | None = None
             ) -> StepResult:
        # On CPU (where the retraction is the Gram polar factor anyway) the newton dual and the
        # retraction share the Gram products: two tall products less (stiefel_step).
        if opts.method == "newton" and not exact and _fast_msign(W) == "gram":
            return stiefel_gram_step(W, G, lr, opts.steps, opts.tol, opts.cg_iters, opts.smooth,
                                     L0)
        return super().step(W, G, lr, opts, L0, exact, retraction)

    def tangent_project(self, W: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
        return stiefel_tangent_project(W, Z)

    def violation(self, W: torch.Tensor) -> torch.Tensor:
        return stiefel_violation(W)


class DGram(Manifold):
    """{W = Q D}: Off(W^T W) = 0; Gram projector Off; retraction ``paper_svd_sorted`` or
    ``colnorm_polar``."""

    name = "dgram"
    constrained = True
    projector = staticmethod(off)
    retractions = DGRAM_RETRACTIONS

    def project(self, W: torch.Tensor) -> torch.Tensor:
        return dgram_retract(W, "colnorm_polar", "svd")

    def retract(self, W: torch.Tensor, exact: bool = False, retraction: str | None = None
                ) -> torch.Tensor:
        fast = "polar_express" if _fast_msign(W) == "msign" else "gram"
        return dgram_retract(W, retraction or DGRAM_RETRACTIONS[0], "svd" if exact else fast)

    def tangent_project(self, W: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
        return dgram_tangent_project(W, Z)

    def violation(self, W: torch.Tensor) -> torch.Tensor:
        return dgram_violation(W)

    def dual_frame(self, W: torch.Tensor) -> torch.Tensor:
        # Off(D (W~^T A + A^T W~) D) = 0 <=> Off(W~^T A + A^T W~) = 0 for W = W~ D, D diagonal
        # and positive: the unit-column frame has the same tangent space, and its Gram is ~I,
        # so the dual is as well scaled as Stiefel's whatever the column norms (which grow).
        return W / torch.linalg.vector_norm(W, dim=-2, keepdim=True).clamp_min(1e-30)


MANIFOLDS: dict[str, Manifold] = {m.name: m for m in (Manifold(), Stiefel(), DGram())}


def get_manifold(name: str) -> Manifold:
    """The registered constraint ``name``; ValueError (one line) listing the valid ones."""
    if name not in MANIFOLDS:
        raise ValueError(f"constraint {name!r} is not one of {', '.join(MANIFOLDS)}")
    return MANIFOLDS[name]
