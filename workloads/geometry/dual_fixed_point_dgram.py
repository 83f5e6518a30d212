"""Tall DGram's direction by a preconditioned fixed point; docs/science.md §3.2.4.

DGram's multiplier L is symmetric with a zero diagonal and its optimality condition is
H = Off(Y Q + Q Y^T) = 0 (Y = W^T X = G1 + 2 M L, Q = (X^T X + mu^2)^{-1/2}, M = W^T W). With Q
frozen, H is affine in L: H(L + D) = H(L) + 2 Off(M D Q + Q D M). Unlike Stiefel's (M = I, no
Off) this has no closed-form inverse, so a pass takes the step D of an approximate inverse and
Anderson mixing over ``HISTORY`` passes corrects what it misses:

- the column norms: for M = T diagonal (W on DGram, T = its squared column norms),
  T^{-1/2} (T D Q + Q D T) T^{-1/2} = D~ Q^ + Q^ D~ with D~ = T^{1/2} D T^{1/2} and
  Q^ = T^{-1/2} Q T^{-1/2}: a Lyapunov operator again, inverted in Q^'s eigenbasis
  (Q^ = U diag(p) U^T): Lyap^{-1}(R) = U ((U^T R U) / (p_i + p_j)) U^T;
- the Off: the step is Off of that inverse, D = -1/2 T^{-1/2} Off(Lyap^{-1}(T^{-1/2} H T^{-1/2}))
  T^{-1/2}, the frozen-Q step but for the coupling of the (free) diagonal, which mixing
  absorbs. Its fixed points are H = 0 (Off Lyap^{-1} Off is positive definite on zero-diagonal
  symmetric matrices), whatever the approximation.

Q^'s eigh is a preconditioner only: it is refreshed every ``REFRESH`` passes and at a regime
change, not every pass (measured on captured gpt-debug batches with column norms spread 1..3:
the same passes as refreshing every pass, 1.2 eighs a pass instead of 2; a preconditioner
from Q's own eigenbasis with T taken as its mean needed > 40 passes at that spread). Each pass
is one eigh of X^T X and eight n x n products, against a Newton pass's eigh, CG solve
(~7 iterations of ~7 products) and line search (~0.5 eigh). Every residual is the given W's.
"""

from __future__ import annotations

import torch

from workloads.geometry.dual_fixed_point import _q_of, eig_at, fixed_point
from workloads.geometry.dual_newton import GramProblem, off

__all__ = ["dgram_fixed_point", "HISTORY", "REFRESH"]

HISTORY = 8  # Anderson pairs (measured, captured batches: 4 -> 16-34 passes, 8 -> 15-22)
REFRESH = 5  # passes between eighs of the preconditioner Q^ (1, 2, 3, 5 measured alike)


def _dgram_pass(pb: GramProblem, L: torch.Tensor, frame: tuple[torch.Tensor, torch.Tensor],
                mu2: torch.Tensor, regular: float | None, cache: dict) -> dict[str, torch.Tensor]:
    """The state at multiplier L (see ``dual_fixed_point._state``; here the residual needs Q
    itself, Off being no basis-free map) and ``step``, which makes the preconditioned step."""
    Y, V, q, mu2 = eig_at(pb, L, frame, mu2, regular)
    Q = _q_of(V, q)
    YQ = Y @ Q
    H = off(YQ + YQ.mT)
    res = torch.linalg.matrix_norm(H) / pb.n

    def step() -> torch.Tensor:
        # the preconditioned step; asked only when a matrix goes on (a warm start already
        # below tol costs no preconditioner eigh)
        tiny = torch.finfo(q.dtype).tiny
        if "ts" not in cache:  # T^{-1/2}: M is the call's own, fixed across passes
            cache["ts"] = pb.M.diagonal(dim1=-2, dim2=-1).clamp_min(tiny).rsqrt()
        si, sj = cache["ts"].unsqueeze(-1), cache["ts"].unsqueeze(-2)
        count = cache.get("count", 0)
        if count % REFRESH == 0:
            p, U = torch.linalg.eigh(si * Q * sj)
            cache["U"], cache["den"] = U, p.unsqueeze(-1) + p.unsqueeze(-2)
        cache["count"] = count + 1
        U, den = cache["U"], cache["den"]
        Hu = U.mT @ (si * H * sj) @ U
        D = off(U @ (Hu / den.clamp_min(tiny)) @ U.mT)
        return -0.5 * si * D * sj

    return {"L": L, "V": V, "q": q, "res": res, "step": step, "mu2": mu2}


def dgram_fixed_point(pb: GramProblem, L: torch.Tensor, steps: int, tol: torch.Tensor,
                      mu: float) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Fixed-point passes from the zero-diagonal multiplier L (..., n, n) for a batch of tall
    DGram problems (``pb.P`` = Off): ``dual_fixed_point.fixed_point`` with the step above."""
    return fixed_point(pb, L, steps, tol, mu, _dgram_pass, HISTORY)
