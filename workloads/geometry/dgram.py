"""The DGram manifold {W = Q D : Q in St(m, n), D diagonal}; docs/science.md §3.3.

Columns mutually orthogonal, column norms free: Off(W^T W) = 0. Tall form (m >= n).
Tangent space T_W = {A : Off(W^T A + A^T W) = 0}; column rescalings W E are tangent, which is
the freedom that lets singular values grow (by at most eta per step, since ||A||_2 <= 1).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from workloads.choices import DGRAM_RETRACTIONS  # the names; implemented below
from workloads.geometry.dual_newton import off
from workloads.geometry.msign import msign, polar_gram
from workloads.geometry.stiefel import gram_dualize

__all__ = [
    "DGRAM_RETRACTIONS",
    "off",
    "diag_part",
    "dgram_dualize",
    "dgram_retract",
    "dgram_tangent_project",
    "dgram_violation",
]



def diag_part(M: torch.Tensor) -> torch.Tensor:
    """Diag(M): the diagonal of (..., n, n) M as a matrix, off-diagonal zeroed."""
    return torch.diag_embed(M.diagonal(dim1=-2, dim2=-1))


def dgram_dualize(
    G: torch.Tensor,
    W: torch.Tensor,
    steps: int = 20,
    lr: float = 0.1,
    tol: float = 1e-6,
    msign_fn: Callable[[torch.Tensor], torch.Tensor] = msign,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The DGram Manifold Muon direction: ``gram_dualize`` with P = Off. Returns (A, residual)."""
    return gram_dualize(G, W, off, steps=steps, lr=lr, tol=tol, msign_fn=msign_fn)


def dgram_retract(
    W: torch.Tensor, method: str = "paper_svd_sorted", msign_method: str = "polar_express"
) -> torch.Tensor:
    """Back onto DGram; W (..., m, n) tall.

    - ``paper_svd_sorted`` (Paper B): W = U S V^T -> U V^T diag(s_1 >= ... >= s_n). Column j of
      the polar factor gets the j-th largest singular value, so it is NOT idempotent on DGram:
      a point Q D with unsorted D comes back as Q diag(sort_desc |D|) (column norms re-sorted).
      U V^T and S come exactly from one fp64 eigh of the small Gram (``polar_gram``), not a
      tall SVD: the same factors at a fraction of the cost.
    - ``colnorm_polar`` (docs/science.md §3.3, ours): msign(W) diag(||w_1||, ..., ||w_n||);
      idempotent on DGram and first-order; ``msign_method`` picks the msign.
    """
    if method == "paper_svd_sorted":
        P, s = polar_gram(W)
        return P * s.flip(-1).unsqueeze(-2).to(W.dtype)
    if method == "colnorm_polar":
        norms = torch.linalg.vector_norm(W, dim=-2, keepdim=True)  # (..., 1, n)
        return msign(W, method=msign_method) * norms
    raise ValueError(f"dgram retraction {method!r} is not one of {', '.join(DGRAM_RETRACTIONS)}")


def dgram_tangent_project(W: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of Z onto T_W DGram, for W on DGram (docs/science.md §3.3, derived).

    Pi(Z) = Z - W S, S_ij = (W^T Z + Z^T W)_ij / (d_i^2 + d_j^2) off the diagonal, S_ii = 0,
    with d_i^2 = (W^T W)_ii.
    """
    d2 = (W * W).sum(dim=-2)  # (..., n)
    denom = d2.unsqueeze(-1) + d2.unsqueeze(-2)  # (..., n, n)
    S = off(W.mT @ Z + Z.mT @ W) / denom.clamp_min(torch.finfo(W.dtype).tiny)
    return Z - W @ S


def dgram_violation(W: torch.Tensor) -> torch.Tensor:
    """||Off(W^T W)||_F / ||W^T W||_F for tall W (..., m, n); docs/science.md §3.5."""
    gram = W.mT @ W
    return torch.linalg.matrix_norm(off(gram)) / torch.linalg.matrix_norm(gram)
