"""The Newton solver of the Manifold Muon dual, in Gram space; docs/science.md §3.2-3.3.

f(Lambda) = tr (X^T X + mu^2 I)^{1/2}, X = G + 2 W Lambda, over symmetric Lambda = P(Lambda),
for the raw W (DGram's column norms are part of its tangent condition: no rescaled frame).
Every quantity is n x n: with G1 = W^T G, C = G^T G, M = W^T W (three Gram products of the
tall inputs, made once per call),

    Y = W^T X = G1 + 2 M L,   N = X^T X = C + 2 (G1^T L + L G1) + 4 L M L,

and one eigh N = V diag(e) V^T gives s = sqrt(e + mu^2), Q = (N + mu^2)^{-1/2},
f = sum(s) and the gradient H = P(Y Q + Q Y^T) (the tangent violation of A = X Q).

The working dtype is the caller's (``GramProblem(..., dtype)``): fp64 for the ``exact`` mode,
fp32 for ``fast``. An eigenvalue below n eps e_max is round-off of the Gram and counts as 0,
so fp32 resolves singular values of X down to ~sqrt(n eps) sigma_max (3e-3 at n = 64), fp64
to ~1e-7 (docs/science.md §3.2: why fp32 directions differ from fp64 ones on real gradients).

A pass is one eigh. Its Newton direction solves hess(D) = -H by preconditioned CG, run in V's
basis, where the Hessian (Daleckii-Krein) and the frozen-Q preconditioner are entrywise maps:
dN = 2 (D Y + Y^T D), dQ = K o dN with K_ij = -1 / (s_i s_j (s_i + s_j)),
hess(D) = P(dWA + dWA^T), dWA = 2 M D Q + Y dQ, so an iteration is 3 n x n products (plus 4
for a projector that is not the identity) and needs no eigh. CG runs in fp32: the direction
only has to be good to a few digits (inexact Newton keeps a superlinear rate), while f, H and
the residual, which decide acceptance and stopping, stay in the working dtype. An Armijo
backtrack on f keeps every pass a descent.

Smoothing (mu > 0) is a continuation device: ``newton_solve`` walks mu down a ladder to the
mode's floor (fp64's resolution, then an unsmoothed polish, for ``exact``; fp32's resolution
for ``fast``), or straight to mu = 0 once smoothing no longer changes the answer, and returns
per matrix the best pass of the rung it ended on. Whatever rung that is, the caller measures
the residual of the A it returns against the raw W.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["GramProblem", "newton_solve", "off", "identity", "eig_gram", "eig_sqrt",
           "resolution"]

Projector = Callable[[torch.Tensor], torch.Tensor]
# the CG forcing term's range per CG dtype (see _newton_direction)
ETA_MIN, ETA_MAX = {torch.float32: 1e-3, torch.float64: 1e-8}, 0.1
LADDER_RATIO = math.sqrt(10.0)  # mu shrinks by this per rung (see newton_solve)
STAGE_TOL = 1e-3  # a smoothing rung's largest stopping residual above the floor (newton_solve)
JUMP = 10.0  # sigma_min(X) >= JUMP mu on every matrix: smoothing is idle, go to mu = 0
STALL = 8  # passes without 10% progress on a rung's worst open residual: the walk stops there
M_EYE_TOL = 1e-4  # ||W^T W - I||_F below this: CG takes M = I (see _newton_direction)


def identity(M: torch.Tensor) -> torch.Tensor:
    """The Stiefel projector: every symmetric multiplier is allowed."""
    return M


def off(M: torch.Tensor) -> torch.Tensor:
    """Off(M) = M - Diag(M), the DGram projector (docs/science.md §3.3)."""
    return M - torch.diag_embed(M.diagonal(dim1=-2, dim2=-1))


def _sym(M: torch.Tensor) -> torch.Tensor:
    return 0.5 * (M + M.mT)


def _inv(s: torch.Tensor) -> torch.Tensor:
    return torch.where(s > 0, 1.0 / s.clamp_min(torch.finfo(s.dtype).tiny), 0.0)


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(dim=(-2, -1), keepdim=True)


def resolution(n: int, dtype: torch.dtype) -> float:
    """sqrt(n eps): the smallest sigma / sigma_max of X that a Gram N = X^T X in ``dtype``
    still tells from round-off (its eigenvalues are known to ~n eps e_max)."""
    return math.sqrt(n * torch.finfo(dtype).eps)


def eig_gram(N: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues e (..., n), ascending, and eigenvectors V of a Gram N = X^T X: e = s^2 for
    X's singular values s. Eigenvalues below ``n eps e_max`` (round-off of a rank-deficient
    Gram, eps of N's dtype) count as 0."""
    e, V = torch.linalg.eigh(_sym(N))
    e = e.clamp_min(0.0)
    floor = e[..., -1:] * (e.shape[-1] * torch.finfo(N.dtype).eps)
    return torch.where(e > floor, e, 0.0), V


def eig_sqrt(N: torch.Tensor, mu2: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``eig_gram``'s singular values s = sqrt(e) (with ``mu2 > 0`` the smoothed
    sqrt(s^2 + mu^2)) and V."""
    e, V = eig_gram(N)
    return (e + mu2).sqrt(), V


def _basis_projector(P: Projector, V: torch.Tensor) -> Projector:
    """P seen in V's basis: Z -> V^T P(V Z V^T) V, with shortcuts for the two known ones."""
    if P is identity:
        return identity
    if P is off:
        # V^T Diag(V Z V^T) V with diag(V Z V^T)_i = sum_j (V Z)_ij V_ij: 2 products, not 4
        return lambda Z: Z - (V.mT * ((V @ Z) * V).sum(-1).unsqueeze(-2)) @ V
    return lambda Z: V.mT @ P(V @ Z @ V.mT) @ V


class GramProblem:
    """The n x n data of one batch of direction problems, from tall G, W (..., m, n): the three
    Gram products run in the inputs' dtype, the rest in ``dtype`` (fp32 or fp64)."""

    def __init__(self, G: torch.Tensor, W: torch.Tensor, P: Projector,
                 dtype: torch.dtype = torch.float64, mu: float = 0.0,
                 cg_dtype: torch.dtype | None = None) -> None:
        self.P, self.mu2, self.n, self.dtype = P, mu * mu, W.shape[-1], dtype
        self.cg_dtype = dtype if cg_dtype is None else cg_dtype  # see _newton_direction
        self.M = _sym(W.mT @ W).to(dtype)
        self.G1 = (W.mT @ G).to(dtype)
        self.C = _sym(G.mT @ G).to(dtype)

    @classmethod
    def from_grams(cls, C: torch.Tensor, G1: torch.Tensor, M: torch.Tensor, P: Projector,
                   mu: float = 0.0) -> GramProblem:
        """The problem from its three Grams (G^T G, W^T G, W^T W), in their dtype."""
        pb = cls.__new__(cls)
        pb.P, pb.mu2, pb.n, pb.dtype = P, mu * mu, M.shape[-1], M.dtype
        pb.cg_dtype = M.dtype
        pb.C, pb.G1, pb.M = C, G1, M
        return pb

    def subset(self, idx: torch.Tensor) -> GramProblem:
        """The problems ``idx`` (1-d indices into a 1-d batch) of this one, at its current mu."""
        sub = GramProblem.__new__(GramProblem)
        sub.P, sub.mu2, sub.n, sub.dtype, sub.cg_dtype = (self.P, self.mu2, self.n, self.dtype,
                                                          self.cg_dtype)
        sub.M, sub.G1, sub.C = self.M[idx], self.G1[idx], self.C[idx]
        if hasattr(self, "_m_is_eye"):  # a subset of I's is I's
            sub._m_is_eye = self._m_is_eye
        return sub

    def m_is_eye(self) -> bool:
        """Whether every M = W^T W is I to ~fp32 round-off (one host sync, then cached)."""
        if not hasattr(self, "_m_is_eye"):
            eye = torch.eye(self.n, dtype=self.M.dtype, device=self.M.device)
            self._m_is_eye = float(torch.linalg.matrix_norm(self.M - eye).max()) < M_EYE_TOL
        return self._m_is_eye

    def state(self, L: torch.Tensor) -> dict[str, torch.Tensor]:
        """f, H and what the Newton direction needs at multiplier L (..., n, n): one eigh
        (none when the same L was just asked at another mu: its eigh is kept)."""
        ML = self.M @ L
        Y = self.G1 + 2.0 * ML  # W^T X
        if getattr(self, "_eig_of", None) is L:
            e, V = self._eig
        else:
            LG = self.G1.mT @ L
            N = self.C + 2.0 * (LG + LG.mT) + 4.0 * L @ ML  # X^T X
            e, V = eig_gram(N)
            self._eig_of, self._eig = L, (e, V)
        s = (e + self.mu2).sqrt()
        Q = (V * _inv(s).unsqueeze(-2)) @ V.mT  # (X^T X + mu^2)^{-1/2}
        WA = Y @ Q  # W^T A
        H = self.P(WA + WA.mT)
        res = torch.linalg.matrix_norm(H) / self.n
        return {"L": L, "Y": Y, "s": s, "V": V, "Q": Q, "H": H, "f": s.sum(-1), "res": res}


def _newton_direction(pb: GramProblem, st: dict, cg_iters: int,
                      rhs: torch.Tensor | None = None) -> torch.Tensor:
    """Preconditioned CG on hess(D) = -H (or = -``rhs``) in V's basis, at most ``cg_iters``
    iterations (batched), in ``pb.cg_dtype``: fp32 for ``fast`` (the direction only needs a
    few digits; half the cost of fp64 products, which were ~40% of a fast step), fp64 for
    ``exact`` (near a (near-)zero singular value of X the Hessian's condition is ~1/mu, past
    what fp32 CG resolves); returns D in the original basis, in the working dtype."""
    cd = pb.cg_dtype
    V = st["V"].to(cd)
    s = st["s"].to(cd)
    Vt = V.mT
    Yb = Vt @ st["Y"].to(cd) @ V
    # M in the basis; on the manifold (M = I to fp32 round-off, Stiefel's case) it is left
    # out: CG only needs a few digits (f, H and the residual stay exact), and that saves
    # 2 + (one per CG iteration) n x n products a pass
    MDs = None if pb.m_is_eye() else Vt @ pb.M.to(cd) @ V
    inv_s = _inv(s).unsqueeze(-2)
    si, sj = s.unsqueeze(-1), s.unsqueeze(-2)
    K = -_inv(si * sj * (si + sj))
    # frozen-Q curvature D -> 2 (D Q + Q D) inverted: s_i s_j / 2 (s_i + s_j), floored so a
    # zero singular value does not zero a whole row of the preconditioner
    sf = s.clamp_min(s[..., -1:] * 1e-6)
    pre = sf.unsqueeze(-1) * sf.unsqueeze(-2) / (2.0 * (sf.unsqueeze(-1) + sf.unsqueeze(-2)))
    Pb = _basis_projector(pb.P, V)

    def hess(D: torch.Tensor) -> torch.Tensor:
        DY = D @ Yb
        dQ = K * (2.0 * (DY + DY.mT))
        dWA = 2.0 * (D if MDs is None else MDs @ D) * inv_s + Yb @ dQ
        return Pb(dWA + dWA.mT)

    tiny = torch.finfo(cd).tiny
    R = -(Vt @ (st["H"] if rhs is None else rhs).to(cd) @ V)
    D = torch.zeros_like(R)
    Z = Pb(pre * R)
    Pd, rz = Z, _dot(R, Z)
    # Inexact Newton: solve to a relative residual eta = clamp(10 res, eta_min, 0.1), a
    # forcing term that shrinks with the residual (Eisenstat-Walker; quadratic-like rate near
    # the solution), and never below 1e-3 in fp32, where fp32 CG still holds (it loses
    # conjugacy past ~1e-5), or 1e-8 in fp64. A solved matrix stops moving; all solved, CG
    # stops.
    eta_min = ETA_MIN[cd]
    eta = (10.0 * st["res"].to(cd)).clamp(eta_min, ETA_MAX)[..., None, None]
    stop = rz * eta * eta
    for _ in range(cg_iters):
        if not bool((rz > stop).any()):
            break
        Hp = hess(Pd)
        curv = _dot(Pd, Hp)
        ok = (curv > tiny) & (rz > stop) & (rz > tiny)
        a = torch.where(ok, rz / curv.clamp_min(tiny), 0.0)
        D = D + a * Pd
        R = R - a * Hp
        Z = Pb(pre * R)
        rz_new = _dot(R, Z)
        Pd = Z + torch.where(ok, rz_new / rz.clamp_min(tiny), 0.0) * Pd
        rz = rz_new
    Vd = st["V"]
    D = pb.P(_sym(Vd @ D.to(pb.dtype) @ Vd.mT))
    # CG on a PSD system from 0 gives a descent direction; if round-off broke that, take the
    # preconditioned gradient (in the original basis)
    bad = _dot(D, st["H"]) >= 0
    if rhs is None and bool(bad.any()):
        G0 = Vd @ (pre.to(pb.dtype) * -(Vd.mT @ st["H"] @ Vd)) @ Vd.mT
        D = torch.where(bad, pb.P(_sym(G0)), D)
    return D


def _take(st: dict, idx: torch.Tensor) -> dict:
    """The entries ``idx`` of a state's 1-d batch."""
    return {k: v[idx] for k, v in st.items()}


def _put(st: dict, idx: torch.Tensor, sub: dict) -> dict:
    """``st`` with the entries ``idx`` of its batch replaced by ``sub``'s (same keys)."""
    return {k: st[k].index_copy(0, idx, sub[k]) for k in sub}


def _subset(mask: torch.Tensor) -> torch.Tensor | None:
    """The indices where ``mask`` (a 1-d batch) holds, or None when it holds everywhere (or
    the batch is not 1-d): the work then runs on the whole batch, with no gather."""
    if mask.ndim != 1 or bool(mask.all()):
        return None
    return mask.nonzero().squeeze(-1)


def _newton_pass(pb: GramProblem, st: dict, active: torch.Tensor, cg_iters: int) -> dict:
    """One Newton step with a per-matrix Armijo backtrack on f; inactive matrices stay put
    (their state is kept as it is: the pass runs on the active ones only, so a matrix that
    met its tolerance costs no eigh and no CG while the others go on; one gather a pass).

    Every trial step costs an eigh, as a pass does. Far from the optimum (real training
    gradients are near rank-deficient, so X = G + 2 W Lambda has singular values ~mu there
    and the full Newton step overshoots) plain halving backtracked about once per pass. So
    each matrix starts at twice its previous pass's accepted step (capped at 1; 1 on a rung's
    first pass) and backtracks to the minimiser of the quadratic through f(0), f'(0) and f(t),
    safeguarded to [t/10, t/2] (docs/science.md §3.2); a backtrack re-evaluates only the
    matrices whose step was refused.
    """
    idx = _subset(active)
    if idx is not None:
        if "t" not in st:  # a rung's first pass: the kept matrices' step entry, for _put
            st = {**st, "t": torch.ones_like(st["f"])}
        return _put(st, idx, _pass(pb.subset(idx), _take(st, idx), None, cg_iters))
    return _pass(pb, st, active, cg_iters)


def _pass(pb: GramProblem, st: dict, active: torch.Tensor | None, cg_iters: int) -> dict:
    """``_newton_pass`` on the batch as given (``active`` None: every matrix)."""
    D = _newton_direction(pb, st, cg_iters)
    if active is not None:
        D = torch.where(active[..., None, None], D, 0.0)  # a batch that is not 1-d: masked
    slope = _dot(st["H"], D).squeeze(-1).squeeze(-1)  # <= 0
    t = (2.0 * st["t"]).clamp(max=1.0) if "t" in st else torch.ones_like(st["f"])
    L = st["L"]
    new = pb.state(L + t[..., None, None] * D)
    rel = 10.0 * torch.finfo(pb.dtype).eps  # f's own round-off: a tie is not an ascent
    # In fp32 f carries ~n eps e_max / mu of round-off from the eigh's small eigenvalues, above
    # the decrease a Newton step near the optimum makes (measured on real gradients at the fast
    # floor: Armijo refused every step, 0 progress in 9 passes): there a step that cuts the
    # residual by 10% without raising f beyond that round-off is taken too.
    noisy = pb.dtype == torch.float32
    for _ in range(30):
        ok = new["f"] <= st["f"] + 1e-4 * t * slope + rel * st["f"].abs()
        if noisy:
            ok = ok | ((new["res"] <= 0.9 * st["res"]) & (new["f"] <= st["f"] * (1 + 1e-4)))
        if bool(ok.all()):
            break
        curv = (new["f"] - st["f"] - t * slope).clamp_min(torch.finfo(t.dtype).tiny)
        t_q = (-slope * t * t / (2.0 * curv)).clamp(min=0.1 * t, max=0.5 * t)
        t = torch.where(ok, t, t_q)
        Lt = L + t[..., None, None] * D
        redo = _subset(~ok)
        new = pb.state(Lt) if redo is None else _put(
            new, redo, pb.subset(redo).state(Lt[redo]))
    new["t"] = t
    return new


_KEPT = ("L", "Q", "Y", "H", "res", "mu2")  # what a solution carries out of the solver


def _pick(take: torch.Tensor, a: dict, b: dict) -> dict:
    """Per matrix, ``a``'s entries where ``take`` (...) holds, else ``b``'s."""
    out = {}
    for k in _KEPT:
        w = take.reshape(take.shape + (1,) * (a[k].ndim - take.ndim))
        out[k] = torch.where(w, a[k], b[k])
    return out


def _predict(pb: GramProblem, st: dict, mu: float, mu_next: float, cg_iters: int
             ) -> torch.Tensor:
    """The multiplier at ``mu_next`` to first order (the path's tangent): solve
    hess(D) = -dH/dmu (mu_next - mu) at the state ``st`` of rung ``mu``, with
    dH/dmu = P(Y dQ + dQ Y^T), dQ = V diag(-mu / s^3) V^T (s the smoothed singular values).
    A near-null singular value of X tracks mu along the path; without the predictor each new
    rung starts O(1) away from its optimum in that direction (docs/science.md §3.3)."""
    V, sm = st["V"], st["s"]
    dQ = (V * (-mu / sm.clamp_min(torch.finfo(sm.dtype).tiny) ** 3).unsqueeze(-2)) @ V.mT
    YdQ = st["Y"] @ dQ
    dH = pb.P(YdQ + YdQ.mT) * (mu_next - mu)
    return st["L"] + _newton_direction(pb, st, cg_iters, rhs=dH)


def _smin(st: dict) -> torch.Tensor:
    """The smallest unsmoothed singular value of X at a state (s = sqrt(e + mu^2))."""
    return (st["s"][..., 0] ** 2 - st["mu2"]).clamp_min(0.0).sqrt()  # s ascending (eigh)


def newton_solve(pb: GramProblem, L: torch.Tensor, steps: int, tol: torch.Tensor | float,
                 cg_iters: int,
                 start: float = 0.0, floor: float = 0.0, polish: bool = True,
                 ) -> tuple[dict, torch.Tensor]:
    """Newton passes from L until every residual < tol or ``steps`` passes in all; returns,
    per matrix, the best pass's state (``L``, ``Q``, ``Y``, ``H``, ``res`` and ``mu2``, the rung
    it was on) and the per-matrix pass counts (a matrix stops counting once below tol).

    The smoothing ladder: rungs mu = ``start``, start / sqrt(10), ... down to ``floor``, each
    from the previous rung's multiplier (at a small mu, f has curvature ~1/mu across a
    near-zero singular value of X, which real near rank-deficient gradients and square DGram
    give the optimum, so Newton's region of quadratic convergence shrinks to ~mu: each rung,
    solved to min(``STAGE_TOL``, mu / 10), starts the next one inside it; docs/science.md
    §3.2-3.3; a ratio
    of sqrt(10) measured fewest passes). Where smoothing does not matter at a rung's start
    (every X's smallest singular value >= ``JUMP`` mu) the walk goes straight to mu = 0. The
    floor rung is solved to ``tol``; then with ``polish`` an unsmoothed rung follows (kept per
    matrix only where its residual ended no worse: an optimum with a zero singular value of X
    is reached by no unsmoothed pass), without it the floor rung is the answer. A rung goes on
    until it meets its tolerance; when ``steps`` run out first, or the rung stalls (``STALL``
    passes without progress: a rung below what the dtype or the path can follow), the walk
    ends there and the rung before is kept where it ended better. Between rungs a tangent
    predictor (``_predict``) moves the multiplier along the path. ``start`` 0: unsmoothed.
    The state's ``mu2`` says which smoothing the answer has (0: the unsmoothed optimum).
    """
    passes = torch.zeros(L.shape[:-2], dtype=torch.long, device=L.device)
    tol = torch.as_tensor(tol, dtype=pb.dtype, device=L.device).expand(L.shape[:-2])
    mu, used, prev = start, 0, None
    while True:
        pb.mu2 = mu * mu
        st = pb.state(L)
        if mu > 0.0 and bool((_smin({**st, "mu2": pb.mu2}) >= JUMP * mu).all()):
            mu, pb.mu2 = 0.0, 0.0  # smoothing idle here: solve unsmoothed (same eigh)
            st = pb.state(L)
        at_floor = 0.0 < mu <= floor * (1.0 + 1e-9)
        final = mu == 0.0 or (at_floor and not polish)
        # a rung is followed to ~mu / 10 (at most STAGE_TOL), so the next one starts close
        # enough to its own optimum (path following); the floor and final rungs to tol
        stage_tol = tol if final or at_floor else torch.clamp(tol, min=min(STAGE_TOL, 0.1 * mu))
        mu2 = torch.full(L.shape[:-2], pb.mu2, dtype=pb.dtype, device=L.device)
        st["mu2"] = mu2
        best = st
        used += 1
        passes += 1
        stalled, mark, since = False, best["res"].max(), 0
        while used < steps:
            active = st["res"] >= stage_tol
            if not bool(active.any()):
                break
            passes += active.long()
            used += 1
            st = {**_newton_pass(pb, st, active, cg_iters), "mu2": mu2}
            best = _pick(st["res"] <= best["res"], st, best)
            worst = best["res"][best["res"] >= stage_tol]
            if worst.numel() and float(worst.max()) > 0.9 * float(mark):
                since += 1  # no 10% progress on the worst open matrix (one sync, as above)
                if since >= STALL:
                    stalled = True
                    break
            else:
                mark, since = (worst.max() if worst.numel() else mark), 0
        if final or used >= steps or stalled:
            break  # the last rung, no passes left, or a rung the walk cannot follow
        prev, L = best, best["L"]
        nxt = 0.0 if at_floor else max(mu / LADDER_RATIO, floor)
        if nxt > 0.0:
            # predictor: start the next rung from the path's tangent where that is closer
            pb.mu2 = nxt * nxt
            Lp = _predict(pb, {**st, "mu2": mu * mu}, mu, nxt, cg_iters)
            plain, pred = pb.state(L)["res"], pb.state(Lp)["res"]
            L = torch.where((pred < plain)[..., None, None], Lp, L)
        mu = nxt
    if prev is not None:  # an unfinished (or unsmoothed) last rung does not undo the one before
        best = _pick((best["res"] <= prev["res"]) | (best["res"] < tol), best, prev)
    return best, passes
