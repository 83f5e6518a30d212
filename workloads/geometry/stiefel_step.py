"""One Manifold Muon step on St(m, n) in Gram space: direction and retraction with two tall
products after the three Gram products; docs/science.md §3.2.

With A = G Q + W R (the dual's Gram-space answer, ``dual.newton_gram``), the stepped matrix is
W1 = W - eta A = G a + W b with a = -eta Q, b = I - eta R, and its Gram is n x n algebra on
what the dual already has (M = W^T W, W^T A = (W^T X) Q, A^T A = Q X^T X Q from its eigh):

    W1^T W1 = M - eta (W^T A + A^T W) + eta^2 A^T A,

so the retraction's polar factor W1 (W1^T W1)^{-1/2} = G (a Z) + W (b Z), Z = (W1^T W1)^{-1/2}
(``gram_sqrt.inv_sqrt_near``), costs two tall products instead of the four of forming A, W1,
W1^T W1 and W1 Z (measured on gpt-tiny's CPU step; see benchmarks/optimizer_step.py). The
displacement ||W2 - W1||_F / ||W1||_F = sqrt(tr((Z - I) N1 (Z - I)) / tr N1) is n x n too.
"""

from __future__ import annotations

import torch

from workloads.geometry.dual import newton_gram, usable_warm_start
from workloads.geometry.dual_newton import identity
from workloads.geometry.gram_sqrt import NEAR, inv_sqrt_near
from workloads.geometry.stiefel import polar_near

__all__ = ["stiefel_gram_step"]

_F64 = torch.float64


def stiefel_gram_step(
    W: torch.Tensor, G: torch.Tensor, lr: float, steps: int, tol: float, cg_iters: int,
    smooth: float, L0: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """W' = polar(W - lr A) for tall W, G (..., m, n) with A the newton dual's direction.

    Returns ``(W', residual, passes, displacement, L)`` as ``manifold_muon_step`` and
    ``DualResult`` define them; the tall products run in W's dtype, the rest in fp64.
    ``L0`` warm-starts the multiplier where ``dual_ascent`` would use it.
    """
    dtype = W.dtype
    G = G / torch.linalg.matrix_norm(G).clamp_min(1e-30)[..., None, None]  # A(G) = A(c G)
    sol = newton_gram(G.to(_F64), W.to(_F64), identity, steps, tol, cg_iters, smooth,
                      usable_warm_start(L0, W))
    eye = torch.eye(W.shape[-1], dtype=_F64, device=W.device)
    a, b = -lr * sol.QG, eye - lr * sol.RW
    # W1^T W1 = M - lr (W^T A + A^T W) + lr^2 A^T A: no lr^2 ||Q||^2 cancellation
    N1 = sol.M - lr * (sol.WA + sol.WA.mT) + (lr * lr) * sol.AtA
    N1 = 0.5 * (N1 + N1.mT)
    if not float(torch.linalg.matrix_norm(N1 - eye).max()) < NEAR:
        # Far from the manifold (a large step): the Gram would square W1's condition number,
        # so form W1 and take polar_near's SVD branch, as the unfused path does.
        W1 = G @ a.to(dtype) + W @ b.to(dtype)
        W2 = polar_near(W1)
        disp = torch.linalg.matrix_norm(W2 - W1) / torch.linalg.matrix_norm(W1)
        return W2, sol.res.to(dtype), sol.passes, disp, sol.L
    # the same accuracy as polar_near's on the tall matrix: to the working dtype's round-off
    Z = inv_sqrt_near(N1, 4 * torch.finfo(dtype).eps)
    # Round-off of the product G (a Z) is ~ eps lr ||Q||_2 / sqrt(m) per entry, W (b Z)'s is
    # ~ eps sqrt(n / m): in W's dtype while the G term is no worse (tall gpt-tiny matrices,
    # cond(X) ~ 5), in fp64 otherwise (square ones, cond(X) ~ 5e3: 50x worse in fp32) so the
    # result is as accurate as forming A in fp64 and retracting W - lr A.
    if float(lr * sol.qg_norm.max()) <= W.shape[-1] ** 0.5:
        W2 = G @ (a @ Z).to(dtype) + W @ (b @ Z).to(dtype)
    else:
        W2 = (G.to(_F64) @ (a @ Z) + W.to(_F64) @ (b @ Z)).to(dtype)
    ZI = Z - eye
    disp = ((ZI @ N1 @ ZI).diagonal(dim1=-2, dim2=-1).sum(-1).clamp_min(0.0)
            / N1.diagonal(dim1=-2, dim2=-1).sum(-1)).sqrt()
    return W2, sol.res.to(dtype), sol.passes, disp.to(dtype), sol.L
