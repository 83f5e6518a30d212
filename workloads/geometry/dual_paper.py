"""Paper B's dual ascent for the Manifold Muon direction, batched; docs/science.md §3.2-3.3.

The loop of Paper B's ``manifold_muon`` (and the Thinking Machines code it follows), on the raw
G and W, for a batch (..., m, n) of tall matrices:

    Lambda_0 = -1/4 P(W^T G + G^T W)                      (every step starts here: no warm start)
    for k < K:  A = msign(G + 2 W P(sym Lambda)),  H = P(W^T A + A^T W)
                stop once ||H||_F / n < tol
                Lambda <- Lambda - alpha (1 - k / K) H

The paper breaks out of the loop per matrix; batched, a matrix below ``tol`` keeps that pass's
A and Lambda while the others go on (the same answer, per matrix, as the paper's loop), and the
loop asks the device whether all are done only every ``check_every`` passes, so a GPU runs
``check_every`` passes between host syncs. msign is the caller's (Polar Express: bf16 on CUDA,
as both reference codes, fp32 on CPU).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["paper_ascent"]

Projector = Callable[[torch.Tensor], torch.Tensor]


def _sym(M: torch.Tensor) -> torch.Tensor:
    return 0.5 * (M + M.mT)


def paper_ascent(G: torch.Tensor, W: torch.Tensor, P: Projector,
                 msign_fn: Callable[[torch.Tensor], torch.Tensor], steps: int = 20,
                 alpha: float = 0.1, tol: float = 1e-6, check_every: int = 4,
                 L0: torch.Tensor | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(A, residual, passes, Lambda)`` for tall G, W (..., m, n); ``residual`` (...) is
    ||P(W^T A + A^T W)||_F / n of the returned A against the given W, ``passes`` the msign
    evaluations each matrix used. ``L0`` replaces the paper's start (the ``paper_warm``
    variant: the previous step's multiplier); None is the paper."""
    n = W.shape[-1]
    L = -0.25 * P(W.mT @ G + G.mT @ W) if L0 is None else P(_sym(L0.to(G.dtype)))
    batch = W.shape[:-2]
    passes = torch.zeros(batch, dtype=torch.long, device=W.device)
    done = torch.zeros(batch, dtype=torch.bool, device=W.device)
    A = res = None
    for k in range(steps):
        A_k = msign_fn(G + 2.0 * W @ P(_sym(L)))
        H = P(W.mT @ A_k + A_k.mT @ W)
        res_k = torch.linalg.matrix_norm(H) / n
        keep = done[..., None, None]
        A = A_k if A is None else torch.where(keep, A, A_k)
        res = res_k if res is None else torch.where(done, res, res_k)
        passes += (~done).long()
        done = done | (res_k < tol)
        L = torch.where(done[..., None, None], L, L - alpha * (1.0 - k / steps) * H)
        if (k + 1) % check_every == 0 and k + 1 < steps and bool(done.all()):
            break
    return A, res, passes, L
