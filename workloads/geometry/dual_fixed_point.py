"""Tall Stiefel's direction as the fixed point of its optimality condition; docs/science.md §3.2.3.

For W with orthonormal columns (W^T W = I) the dual of the direction problem is
f(L) = tr (Y^T Y + C2 + mu^2 I)^{1/2} over symmetric L, with Y = W^T X = G1 + 2 L, G1 = W^T G,
C2 = G^T G - G1^T G1 (the part of G outside W's span, which L cannot touch). Write
Y = K + S with K = skew(G1) fixed and S = sym(G1) + 2 L free, and Q = (Y^T Y + C2 + mu^2)^{-1/2}.
The optimum makes W^T A = Y Q skew (the tangency), i.e. S Q + Q S = Q K - K Q: for a fixed Q a
Lyapunov equation, solved in Q's eigenbasis (Q = V diag(q) V^T, K~ = V^T K V) in closed form,

    S = V (K~ o Phi) V^T,   Phi_ij = (q_i - q_j) / (q_i + q_j),

so the optimum is a fixed point of S -> F(S) (one eigh of the n x n Gram and six n x n
products a pass, no linear solve). Plain iteration converges linearly; Anderson mixing over the
last few passes (a small least-squares problem per matrix) makes it converge in ~8-12 passes
from a cold start on real training gradients where the Newton solver (dual_newton.py) takes
13-15 passes of one eigh, a CG solve and a line search each [measured, docs/science.md §3.2.3].

Smoothing (mu > 0) is used only where the unsmoothed iteration does not converge: on a
regular problem the fixed point is the exact, unsmoothed optimum; a matrix whose X has a
near-zero singular value at the optimum (near rank-deficient gradients) stalls there, and is
then solved again from its best pass at ``mu`` (the ``fast`` mode's floor), where it converges.

The caller checks W^T W = I (``GramProblem.m_is_eye``); every residual here is the Gram-space
one of the given W and multiplier (||Y Q + Q Y^T||_F / n with Y = G1 + 2 M L, M = W^T W), and
the caller measures the returned direction's true residual against the raw W.
"""

from __future__ import annotations

import torch

from workloads.geometry.dual_newton import JUMP, GramProblem

__all__ = ["stiefel_fixed_point", "HISTORY", "STALL_PASSES"]

HISTORY = 4  # Anderson mixing: the last HISTORY differences (measured: 3-6 alike, 0 is slow)
STALL_PASSES = 4  # an unsmoothed matrix must halve its residual every this many passes


def _sym(M: torch.Tensor) -> torch.Tensor:
    return 0.5 * (M + M.mT)


def _state(pb: GramProblem, L: torch.Tensor, K: torch.Tensor, mu2: torch.Tensor,
           regular: float | None = None) -> dict[str, torch.Tensor]:
    """At multiplier L and smoothing mu2 (batch): Q, the residual, the map's next S (``F``)
    and ``mu2``. With ``regular``, mu2 is first set to 0 where X's smallest singular value is
    at least ``regular`` (and kept where it is not)."""
    ML = pb.M @ L
    Y = pb.G1 + 2.0 * ML  # W^T X
    LG = pb.G1.mT @ L
    N = _sym(pb.C + 2.0 * (LG + LG.mT) + 4.0 * L @ ML)  # X^T X
    e, V = torch.linalg.eigh(N)
    e = e.clamp_min(0.0)
    if regular is not None:
        mu2 = torch.where(e[..., 0] >= regular * regular, 0.0, mu2)
    q = (e + mu2[..., None]).clamp_min(torch.finfo(e.dtype).tiny).rsqrt()
    Q = (V * q.unsqueeze(-2)) @ V.mT
    WA = Y @ Q
    res = torch.linalg.matrix_norm(WA + WA.mT) / pb.n
    qi, qj = q.unsqueeze(-1), q.unsqueeze(-2)
    F = _sym(V @ ((V.mT @ K @ V) * ((qi - qj) / (qi + qj))) @ V.mT)
    return {"L": L, "Q": Q, "res": res, "F": F, "mu2": mu2}


def _anderson(S: torch.Tensor, g: torch.Tensor, hist: list[tuple[torch.Tensor, torch.Tensor]]
              ) -> torch.Tensor:
    """The next S from the current S and residual g = F(S) - S and the kept pairs (type II
    Anderson mixing, full step, per matrix of the batch)."""
    if not hist:
        return S + g
    n = S.shape[-1]
    dX = torch.stack([S - s for s, _ in hist], -1).flatten(-3, -2)  # (..., n*n, k)
    dG = torch.stack([g - r for _, r in hist], -1).flatten(-3, -2)
    gram = dG.mT @ dG  # (..., k, k)
    # a relative ridge; a matrix whose differences all vanish (it stopped moving) gets
    # gamma = 0 instead of a singular solve
    ridge = 1e-10 * gram.diagonal(dim1=-2, dim2=-1).mean(-1, keepdim=True)
    ridge = torch.where(ridge > 0, ridge, 1.0)
    gram = gram + torch.diag_embed(ridge.expand(gram.shape[:-1]))
    gamma = torch.linalg.solve(gram, dG.mT @ g.flatten(-2).unsqueeze(-1))
    step = ((dX + dG) @ gamma).squeeze(-1).unflatten(-1, (n, n))
    out = _sym(S + g - step)
    return torch.where(torch.isfinite(out).all(-1).all(-1)[..., None, None], out, S + g)


def _pick(take: torch.Tensor, new: dict[str, torch.Tensor], old: dict[str, torch.Tensor]
          ) -> dict[str, torch.Tensor]:
    """Per matrix, ``new``'s entries where ``take`` (batch) holds, else ``old``'s."""
    return {k: torch.where(take.reshape(take.shape + (1,) * (v.ndim - take.ndim)), new[k], v)
            for k, v in old.items()}


def stiefel_fixed_point(pb: GramProblem, L: torch.Tensor, steps: int, tol: torch.Tensor,
                        mu: float) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Fixed-point passes from multiplier L (..., n, n) for a batch of tall Stiefel problems
    (``pb.M`` = I), ``steps`` passes at most, until every residual is below ``tol``. A matrix
    starts unsmoothed where X's smallest singular value at L is at least ``JUMP`` mu (real
    gradients' optima have one near 0 where it is not, and there the unsmoothed passes stall,
    measured on captured gpt-debug batches), else at smoothing ``mu``; an unsmoothed matrix
    whose residual did not halve over ``STALL_PASSES`` passes (checked every STALL_PASSES,
    from the second check) goes on at ``mu`` from its best pass. Returns per matrix the best
    pass's ``L``, ``Q``, ``res`` and ``mu2`` (the smoothing it was taken at), and the passes
    each matrix used (one eigh each)."""
    batch = L.shape[:-2]
    tol = torch.as_tensor(tol, dtype=pb.dtype, device=L.device).expand(batch)
    K = 0.5 * (pb.G1 - pb.G1.mT)
    sym_g1 = _sym(pb.G1)
    zero = torch.zeros(batch, dtype=pb.dtype, device=L.device)
    smooth = torch.full_like(zero, mu * mu)
    passes = torch.zeros(batch, dtype=torch.long, device=L.device)
    active = torch.ones(batch, dtype=torch.bool, device=L.device)
    best = {"L": L, "Q": torch.zeros_like(L), "res": torch.full_like(zero, torch.inf),
            "mu2": zero}
    mu2 = smooth
    hist: list[tuple[torch.Tensor, torch.Tensor]] = []  # Anderson's (S, F(S) - S) pairs
    since = torch.zeros_like(passes)  # passes in the current regime
    mark = torch.full_like(zero, torch.inf)  # the residual at the last check
    for k in range(steps):
        # the first pass decides each matrix's regime
        st = _state(pb, L, K, mu2, JUMP * mu if k == 0 else None)
        mu2 = st["mu2"]
        passes = passes + active.long()
        best = _pick(active & (st["res"] < best["res"]), st, best)
        active = active & (st["res"] >= tol)
        if not bool(active.any()):
            break
        # every STALL_PASSES passes an unsmoothed matrix whose residual did not halve since
        # the last check goes on smoothed, from its best pass
        since = since + 1
        check = since % STALL_PASSES == 0
        stalled = active & (mu2 == 0) & check & (st["res"] > 0.5 * mark)
        mark = torch.where(check, st["res"], mark)
        if mu > 0.0 and bool(stalled.any()):
            mu2 = torch.where(stalled, smooth, mu2)
            L = torch.where(stalled[..., None, None], best["L"], L)
            since = torch.where(stalled, 0, since)
            hist = []  # the smoothed problem is another one: no mixing across the switch
            continue
        S = sym_g1 + 2.0 * L
        g = st["F"] - S
        S_next = _anderson(S, g, hist)
        hist = (hist + [(S, g)])[-HISTORY:]
        L = torch.where(active[..., None, None], 0.5 * (S_next - sym_g1), L)
    return best, passes
