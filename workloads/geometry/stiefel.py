"""The Stiefel manifold St(m, n) = {W : W^T W = I_n} for Manifold Muon; docs/science.md §3.2.

Tall form throughout (m >= n): callers transpose wide matrices first. Modula's words:
``project`` (nearest point), ``dualize`` (steepest unit-spectral-norm tangent direction),
``retract`` (back onto the manifold after a step).

Sign convention is the code's: ``A = +msign(G + 2 W Lambda)`` and the step is ``W - eta A``.
The dual ascent lives here in its Gram-space form (any self-adjoint projector ``P`` on
symmetric n x n matrices, docs/science.md §3.3); Stiefel is ``P = identity``, DGram passes ``Off``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from workloads.geometry.dual import dual_ascent
from workloads.geometry.msign import msign

__all__ = [
    "gram_dualize",
    "stiefel_project",
    "stiefel_dualize",
    "stiefel_retract",
    "stiefel_tangent_project",
    "stiefel_violation",
    "RETRACTIONS",
]

MsignFn = Callable[[torch.Tensor], torch.Tensor]
RETRACTIONS = ("msign", "svd")


def _check_tall(W: torch.Tensor, G: torch.Tensor | None = None) -> None:
    if W.ndim < 2 or W.shape[-2] < W.shape[-1]:
        raise ValueError(f"expected a tall (..., m, n) matrix with m >= n, got {tuple(W.shape)}")
    if G is not None and G.shape != W.shape:
        raise ValueError(f"gradient shape {tuple(G.shape)} != weight shape {tuple(W.shape)}")


def _sym(M: torch.Tensor) -> torch.Tensor:
    return 0.5 * (M + M.mT)


def gram_dualize(
    G: torch.Tensor,
    W: torch.Tensor,
    project: Callable[[torch.Tensor], torch.Tensor],
    steps: int = 20,
    lr: float = 0.1,
    tol: float = 1e-6,
    msign_fn: MsignFn = msign,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's dual ascent (absolute step ``lr``) for max <G, A> s.t. ||A||_2 <= 1,
    P(W^T A + A^T W) = 0; returns ``(A, residual)``. ``workloads.geometry.dual.dual_ascent``
    has the scale-invariant methods and the pass counts."""
    r = dual_ascent(G, W, project, "absolute", steps, lr, tol, msign_fn)
    return r.A, r.residual


def stiefel_dualize(
    G: torch.Tensor,
    W: torch.Tensor,
    steps: int = 20,
    lr: float = 0.1,
    tol: float = 1e-6,
    msign_fn: MsignFn = msign,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Stiefel Manifold Muon direction (P = identity); see ``gram_dualize``."""
    return gram_dualize(G, W, lambda M: M, steps=steps, lr=lr, tol=tol, msign_fn=msign_fn)


def stiefel_project(W: torch.Tensor, method: str = "svd") -> torch.Tensor:
    """The nearest point on St(m, n) in Frobenius norm: the polar factor of W (..., m, n)."""
    return stiefel_retract(W, method=method)


def stiefel_retract(W: torch.Tensor, method: str = "msign") -> torch.Tensor:
    """Retraction msign(W') after a step (both reference codes), or the exact SVD polar factor.

    ``msign`` is Polar Express: bf16 on CUDA (constraint holds to ~1e-2), fp32 on CPU.
    """
    if method not in RETRACTIONS:
        raise ValueError(f"stiefel retraction {method!r} is not one of {', '.join(RETRACTIONS)}")
    return msign(W, method="polar_express" if method == "msign" else "svd")


def stiefel_tangent_project(W: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of Z onto T_W St = {A : W^T A + A^T W = 0}: Z - W sym(W^T Z)."""
    return Z - W @ _sym(W.mT @ Z)


def stiefel_violation(W: torch.Tensor) -> torch.Tensor:
    """||W^T W - I||_F / sqrt(n) for tall W (..., m, n); docs/science.md §3.5."""
    n = W.shape[-1]
    eye = torch.eye(n, dtype=W.dtype, device=W.device)
    return torch.linalg.matrix_norm(W.mT @ W - eye) / math.sqrt(n)
