"""``MANIFOLDS``: one object per weight constraint of Manifold Muon; docs/science.md §3.2-3.4.

Modula-style: a constraint is an object with ``project`` (nearest point), ``dualize`` (the
steepest unit-spectral-norm direction that stays tangent: the dual ascent), ``retract`` (back
onto the manifold after a step), ``tangent_project`` and ``violation``. All take tall
(..., m, n) matrices, m >= n. A new constraint is one class plus one registry line; choice lists
(``optim.manifold.assignment`` values) are the registry's keys.
"""

from __future__ import annotations

import torch

from workloads.geometry.dgram import (
    DGRAM_RETRACTIONS,
    dgram_retract,
    dgram_tangent_project,
    dgram_violation,
    off,
)
from workloads.geometry.dual import (
    DEFAULT_DUAL,
    DualOptions,
    DualResult,
    Projector,
    identity,
    solve_direction,
)
from workloads.geometry.msign import msign
from workloads.geometry.stiefel import (
    stiefel_retract,
    stiefel_tangent_project,
    stiefel_violation,
)

# (W', residual, passes, displacement, multiplier, mu): see Manifold.step
StepResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None",
                   torch.Tensor]

__all__ = ["DualOptions", "Manifold", "MANIFOLDS", "get_manifold"]  # DualOptions: re-export


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

    def retract(self, W: torch.Tensor, exact: bool = False, retraction: str | None = None,
                mode: str = "fast") -> torch.Tensor:
        return W

    def tangent_project(self, W: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
        return Z

    def violation(self, W: torch.Tensor) -> torch.Tensor:
        return torch.zeros(W.shape[:-2], dtype=W.dtype, device=W.device)

    def dualize(self, G: torch.Tensor, W: torch.Tensor, opts: DualOptions = DEFAULT_DUAL,
                L0: torch.Tensor | None = None, mu0: torch.Tensor | None = None) -> DualResult:
        """The direction A with its true ``residual`` (||P(W^T A + A^T W)||_F / n against this
        W) and ``passes``, in ``opts.mode``; plain msign here. ``L0`` warm-starts the
        multiplier (a previous ``DualResult.L``) where the mode does."""
        if self.projector is None:
            zeros = torch.zeros(G.shape[:-2], dtype=G.dtype, device=G.device)
            return DualResult(msign(G, method=opts.msign_method), zeros, zeros.long(), None,
                              zeros)
        return solve_direction(G, W, self.projector, opts, L0, mu0=mu0)

    def step(self, W: torch.Tensor, G: torch.Tensor, lr: float, opts: DualOptions = DEFAULT_DUAL,
             L0: torch.Tensor | None = None, exact: bool = False, retraction: str | None = None,
             mu0: torch.Tensor | None = None) -> StepResult:
        """W' = retract(W - lr A) for tall W, G: ``(W', residual, passes, displacement, L,
        mu)`` (``DualResult``'s fields), displacement = ||W' - W1||_F / ||W1||_F with
        W1 = W - lr A (docs/science.md §3.5). The step runs in A's dtype (fp64 in the exact
        mode: the direction whose residual is reported is the one applied), W' in W's."""
        dual = self.dualize(G, W, opts, L0, mu0)
        W1 = W.to(dual.A.dtype) - lr * dual.A
        W2 = self.retract(W1, exact=exact, retraction=retraction, mode=opts.mode)
        displacement = torch.linalg.matrix_norm(W2 - W1) / torch.linalg.matrix_norm(W1)
        return W2.to(W.dtype), dual.residual, dual.passes, displacement.to(W.dtype), dual.L, \
            dual.mu


class Stiefel(Manifold):
    """St(m, n) = {W^T W = I}; Gram projector identity; retraction msign (or exact SVD)."""

    name = "stiefel"
    constrained = True
    projector = staticmethod(identity)
    retractions = ("msign",)

    def project(self, W: torch.Tensor) -> torch.Tensor:
        return stiefel_retract(W, "svd")

    def retract(self, W: torch.Tensor, exact: bool = False, retraction: str | None = None,
                mode: str = "fast") -> torch.Tensor:
        # Paper B retracts with Polar Express msign; the other modes with the exact polar
        # factor on CPU (the Gram route) and Polar Express on CUDA
        kind = "svd" if exact else ("msign" if mode == "paper" else _fast_msign(W))
        return stiefel_retract(W, kind)

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

    def retract(self, W: torch.Tensor, exact: bool = False, retraction: str | None = None,
                mode: str = "fast") -> torch.Tensor:
        # paper_svd_sorted is Paper B's SVD in every mode; colnorm_polar's msign as Stiefel's
        fast = "polar_express" if mode == "paper" or _fast_msign(W) == "msign" else "gram"
        return dgram_retract(W, retraction or DGRAM_RETRACTIONS[0], "svd" if exact else fast)

    def tangent_project(self, W: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
        return dgram_tangent_project(W, Z)

    def violation(self, W: torch.Tensor) -> torch.Tensor:
        return dgram_violation(W)


MANIFOLDS: dict[str, Manifold] = {m.name: m for m in (Manifold(), Stiefel(), DGram())}


def get_manifold(name: str) -> Manifold:
    """The registered constraint ``name``; ValueError (one line) listing the valid ones."""
    if name not in MANIFOLDS:
        raise ValueError(f"constraint {name!r} is not one of {', '.join(MANIFOLDS)}")
    return MANIFOLDS[name]
