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

from workloads.geometry.dual_paper import paper_ascent
from workloads.geometry.gram_sqrt import inv_sqrt_near
from workloads.geometry.msign import msign

__all__ = [
    "gram_dualize",
    "stiefel_project",
    "stiefel_dualize",
    "stiefel_retract",
    "stiefel_tangent_project",
    "stiefel_violation",
    "polar_near",
    "RETRACTIONS",
]

MsignFn = Callable[[torch.Tensor], torch.Tensor]
RETRACTIONS = ("msign", "svd", "gram")


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
    """The paper's dual ascent (``dual_paper``: absolute step ``lr``, a fresh start) for
    max <G, A> s.t. ||A||_2 <= 1, P(W^T A + A^T W) = 0; returns ``(A, residual)``.
    ``workloads.geometry.dual.solve_direction`` has every mode and the pass counts."""
    _check_tall(W, G)
    A, res, _, _ = paper_ascent(G, W, project, msign_fn, steps, lr, tol)
    return A, res


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
    """Back onto St(m, n) after a step: the polar factor of W (..., m, n), three ways.

    - ``msign``: Polar Express, as both reference codes (bf16 on CUDA: constraint ~1e-2);
    - ``svd``: the exact SVD polar factor;
    - ``gram``: the exact polar factor W (W^T W)^{-1/2} from the small Gram (``polar_near``):
      a few fp32 n x n products when W is near the manifold, as after a step, else one fp64
      eigh. On CPU it costs two tall products against Polar Express's 36.
    """
    if method not in RETRACTIONS:
        raise ValueError(f"stiefel retraction {method!r} is not one of {', '.join(RETRACTIONS)}")
    if method == "gram":
        return polar_near(W)
    return msign(W, method="polar_express" if method == "msign" else "svd")


def polar_near(W: torch.Tensor, tol: float = 0.0) -> torch.Tensor:
    """Polar factor of W (..., m, n), any orientation, as W (W^T W)^{-1/2} with the small
    Gram's inverse square root from ``gram_sqrt.inv_sqrt_near`` (a binomial series or coupled
    Newton-Schulz: a step of size eta from the manifold has ||N - I|| ~ eta^2 plus the previous
    retraction's error), to ``tol`` (default: the dtype's round-off). Farther away (or with
    non-finite entries) the SVD: an fp32 Gram would square an arbitrary matrix's condition
    number.
    """
    wide = W.shape[-2] < W.shape[-1]
    X = W.mT if wide else W
    n = X.shape[-1]
    eye = torch.eye(n, dtype=X.dtype, device=X.device)
    N = X.mT @ X
    err = float(torch.linalg.matrix_norm(N - eye).max())  # >= ||N - I||_2; one host sync
    if not err < 0.5:
        return msign(W, method="svd")
    Z = inv_sqrt_near(N, tol)
    P = X @ Z
    return P.mT if wide else P


def stiefel_tangent_project(W: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of Z onto T_W St = {A : W^T A + A^T W = 0}: Z - W sym(W^T Z)."""
    return Z - W @ _sym(W.mT @ Z)


def stiefel_violation(W: torch.Tensor) -> torch.Tensor:
    """||W^T W - I||_F / sqrt(n) for tall W (..., m, n); docs/science.md §3.5."""
    n = W.shape[-1]
    eye = torch.eye(n, dtype=W.dtype, device=W.device)
    return torch.linalg.matrix_norm(W.mT @ W - eye) / math.sqrt(n)
