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

The loop (``fixed_point``: regimes, Anderson mixing, the best pass) and ``eig_at`` are shared
with tall DGram's preconditioned fixed point (dual_fixed_point_dgram.py).

The caller checks W^T W = I (``GramProblem.m_is_eye``); every residual here is the Gram-space
one of the given W and multiplier (||Y Q + Q Y^T||_F / n with Y = G1 + 2 M L, M = W^T W), and
the caller measures the returned direction's true residual against the raw W.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from workloads.geometry.dual_newton import JUMP, GramProblem

__all__ = ["stiefel_fixed_point", "fixed_point", "eig_at", "HISTORY", "STALL_PASSES"]

HISTORY = 4  # Anderson mixing: the last HISTORY differences (measured: 3-6 alike, 0 is slow)
STALL_PASSES = 4  # an unsmoothed matrix must halve its residual every this many passes


def _sym(M: torch.Tensor) -> torch.Tensor:
    return 0.5 * (M + M.mT)


def _frame(pb: GramProblem) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Z0, C2)``, made once per call, so that a pass forms W^T X and X^T X with two n x n
    products for any M = W^T W: with Z = M^{-1} W^T X = Z0 + 2 L, Z0 = M^{-1} G1,
    Y = W^T X = M Z and N = X^T X = Z^T Y + C2, C2 = C - G1^T M^{-1} G1 (the part of G
    outside W's span). Exact, not M = I rounded: the fixed point runs on M within
    ``M_EYE_TOL`` of I, and every residual here is the given W's."""
    Z0 = torch.linalg.solve(pb.M, pb.G1)
    return Z0, _sym(pb.C - pb.G1.mT @ Z0)


def eig_at(pb: GramProblem, L: torch.Tensor, frame: tuple[torch.Tensor, torch.Tensor],
           mu2: torch.Tensor, regular: float | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Y, V, q, mu2)`` at multiplier L: Y = W^T X, X^T X = V diag(e) V^T (one eigh, two
    products through ``_frame``), q = (e + mu2)^{-1/2}; with ``regular``, mu2 is first set to
    0 where X's smallest singular value is at least ``regular`` (and kept where it is not)."""
    Z0, C2 = frame
    Z = Z0 + 2.0 * L
    Y = pb.M @ Z  # W^T X
    # X^T X; eigh reads the lower triangle only, so its round-off asymmetry needs no _sym
    e, V = torch.linalg.eigh(Z.mT @ Y + C2)
    e = e.clamp_min(0.0)
    if regular is not None:
        mu2 = torch.where(e[..., 0] >= regular * regular, 0.0, mu2)
    q = (e + mu2[..., None]).clamp_min(torch.finfo(e.dtype).tiny).rsqrt()
    return Y, V, q, mu2


def _state(pb: GramProblem, L: torch.Tensor, frame: tuple[torch.Tensor, torch.Tensor],
           mu2: torch.Tensor, regular: float | None = None) -> dict[str, torch.Tensor]:
    """At multiplier L and smoothing mu2 (batch): the residual, Y = W^T X and ``Yv`` (for the
    map's next S, ``_map``, made only when a matrix goes on), Q's eigenvectors ``V`` and
    values ``q`` (Q is formed once, for the answer: ``_q_of``) and ``mu2`` (``eig_at``).

    Six n x n products and one eigh (the eigh is ~15 products' time at n = 64 on CPU, so the
    products are trimmed, not the eigh): Y and N (``_frame``), then in V's basis
    Yv = V^T Y V, where W^T A = Y Q is Yv diag(q) (the residual's norm is basis-free) and
    V^T K V = skew(Yv) with K = skew(Y), and F = V (skew(Yv) o Phi) V^T."""
    Y, V, q, mu2 = eig_at(pb, L, frame, mu2, regular)
    Yv = V.mT @ Y @ V
    WAv = Yv * q.unsqueeze(-2)  # V^T (W^T A) V
    res = torch.linalg.matrix_norm(WAv + WAv.mT) / pb.n
    return {"L": L, "V": V, "q": q, "res": res, "Yv": Yv, "Y": Y, "mu2": mu2}


def _map(st: dict[str, torch.Tensor]) -> torch.Tensor:
    """The map's next S, F = V (skew(Yv) o Phi) V^T, at a ``_state``: symmetric but for
    round-off, which the Anderson step's own _sym removes."""
    V, q, Yv = st["V"], st["q"], st["Yv"]
    qi, qj = q.unsqueeze(-1), q.unsqueeze(-2)
    return V @ ((0.5 * (Yv - Yv.mT)) * ((qi - qj) / (qi + qj))) @ V.mT


def _q_of(V: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Q = V diag(q) V^T."""
    return (V * q.unsqueeze(-2)) @ V.mT


def _anderson(S: torch.Tensor, g: torch.Tensor, hist: tuple[torch.Tensor, torch.Tensor] | None
              ) -> torch.Tensor:
    """The next iterate from the current one S (a multiplier), its step g (the plain
    iteration's S + g) and the kept pairs ``hist``, the earlier S's and g's flattened and
    stacked (..., k, n*n) (type II Anderson mixing, full step, per matrix of the batch)."""
    if hist is None:
        return S + g
    s, r = S.flatten(-2).unsqueeze(-2), g.flatten(-2).unsqueeze(-2)  # (..., 1, n*n)
    dX, dG = s - hist[0], r - hist[1]  # (..., k, n*n)
    gram = dG @ dG.mT  # (..., k, k)
    # a relative ridge; a matrix whose differences all vanish (it stopped moving) gets
    # gamma = 0 instead of a singular solve
    ridge = 1e-10 * gram.diagonal(dim1=-2, dim2=-1).mean(-1, keepdim=True)
    ridge = torch.where(ridge > 0, ridge, 1.0)
    gram = gram + torch.diag_embed(ridge.expand(gram.shape[:-1]))
    gamma = torch.linalg.solve(gram, dG @ r.mT)  # (..., k, 1)
    step = (gamma.mT @ (dX + dG)).view(S.shape)
    out = _sym(S + g - step)
    # a singular mix (gamma not finite) falls back to the plain step
    return torch.where(torch.isfinite(gamma).all(-2, keepdim=True), out, S + g)


def _remember(hist: tuple[torch.Tensor, torch.Tensor] | None, S: torch.Tensor, g: torch.Tensor,
              keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``hist`` with the pair (S, g) appended, the oldest dropped beyond ``keep``."""
    s, r = S.flatten(-2).unsqueeze(-2), g.flatten(-2).unsqueeze(-2)
    if hist is None:
        return s, r
    return (torch.cat([hist[0][..., 1 - keep:, :], s], -2),
            torch.cat([hist[1][..., 1 - keep:, :], r], -2))


def _pick(take: torch.Tensor, new: dict[str, torch.Tensor], old: dict[str, torch.Tensor]
          ) -> dict[str, torch.Tensor]:
    """Per matrix, ``new``'s entries where ``take`` (batch) holds, else ``old``'s."""
    return {k: torch.where(take.reshape(take.shape + (1,) * (v.ndim - take.ndim)), new[k], v)
            for k, v in old.items()}


def _stiefel_pass(pb: GramProblem, L: torch.Tensor, frame: tuple[torch.Tensor, torch.Tensor],
                  mu2: torch.Tensor, regular: float | None, cache: dict) -> dict[str, torch.Tensor]:
    """``_state`` and its step in L: S = sym(Y) moves by 2 dL (M = I to ``M_EYE_TOL``), so
    the map's step in L is half of F - S."""
    st = _state(pb, L, frame, mu2, regular)
    st["step"] = lambda: 0.5 * (_map(st) - _sym(st["Y"]))
    return st


def stiefel_fixed_point(pb: GramProblem, L: torch.Tensor, steps: int, tol: torch.Tensor,
                        mu: float) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Fixed-point passes from multiplier L (..., n, n) for a batch of tall Stiefel problems
    (``pb.M`` = I): ``fixed_point`` with the map F above and ``HISTORY`` pairs mixed."""
    return fixed_point(pb, L, steps, tol, mu, _stiefel_pass, HISTORY)


PassFn = Callable[[GramProblem, torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor,
                   "float | None", dict], dict]


def fixed_point(pb: GramProblem, L: torch.Tensor, steps: int, tol: torch.Tensor, mu: float,
                one_pass: PassFn, keep: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Passes of ``one_pass`` from multiplier L (..., n, n), mixed by Anderson over ``keep``
    pairs, ``steps`` passes at most, until every residual is below ``tol``. ``one_pass`` gives
    the state at L: ``res``, ``step`` (a callable: the step in L, asked only when a matrix
    goes on), Q's ``V`` and ``q``, ``mu2``; it may keep what it reuses across passes in its
    ``cache`` dict, which is emptied when a matrix changes regime.

    A matrix starts unsmoothed where X's smallest singular value at L is at least ``JUMP`` mu
    (real gradients' optima have one near 0 where it is not, and there the unsmoothed passes
    stall, measured on captured gpt-debug batches), else at smoothing ``mu``; an unsmoothed
    matrix whose residual did not halve over ``STALL_PASSES`` passes (checked every
    STALL_PASSES, from the second check) goes on at ``mu`` from its best pass. Returns per
    matrix the best pass's ``L``, ``Q``, ``res`` and ``mu2`` (the smoothing it was taken at),
    and the passes each matrix used (one eigh of X^T X each)."""
    batch = L.shape[:-2]
    tol = torch.as_tensor(tol, dtype=pb.dtype, device=L.device).expand(batch)
    frame = _frame(pb)
    zero = torch.zeros(batch, dtype=pb.dtype, device=L.device)
    smooth = torch.full_like(zero, mu * mu)
    passes = torch.zeros(batch, dtype=torch.long, device=L.device)
    active = torch.ones(batch, dtype=torch.bool, device=L.device)
    best = {"L": L, "V": torch.zeros_like(L), "q": torch.zeros_like(L[..., 0]),
            "res": torch.full_like(zero, torch.inf), "mu2": zero}
    mu2 = smooth
    hist = None  # Anderson's (L, step) pairs
    cache: dict = {}
    since = torch.zeros_like(passes)  # passes in the current regime
    mark = torch.full_like(zero, torch.inf)  # the residual at the last check
    for k in range(steps):
        # the first pass decides each matrix's regime
        st = one_pass(pb, L, frame, mu2, JUMP * mu if k == 0 else None, cache)
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
            hist = None  # the smoothed problem is another one: no mixing across the switch
            cache.clear()
            continue
        g = st["step"]()
        L_next = _anderson(L, g, hist)
        hist = _remember(hist, L, g, keep)
        L = torch.where(active[..., None, None], L_next, L)
    return {"L": best["L"], "Q": _q_of(best["V"], best["q"]), "res": best["res"],
            "mu2": best["mu2"]}, passes
