"""The Newton solver of the Manifold Muon dual, in Gram space; docs/science.md §3.2-3.3.

f(Lambda) = tr (X^T X + mu^2 I)^{1/2}, X = G + 2 W Lambda, over symmetric Lambda = P(Lambda).
Every quantity is n x n: with G1 = W^T G, C = G^T G, M = W^T W (three Gram products of the
tall inputs, made once per call),

    Y = W^T X = G1 + 2 M L,   N = X^T X = C + 2 (G1^T L + L G1) + 4 L M L,

and one fp64 eigh N = V diag(e) V^T gives s = sqrt(e + mu^2), Q = (N + mu^2)^{-1/2},
f = sum(s) and the gradient H = P(Y Q + Q Y^T) (the tangent violation of A = X Q).

A pass is one eigh. Its Newton direction solves hess(D) = -H by preconditioned CG, run in V's
basis, where the Hessian (Daleckii-Krein) and the frozen-Q preconditioner are entrywise maps:
dN = 2 (D Y + Y^T D), dQ = K o dN with K_ij = -1 / (s_i s_j (s_i + s_j)),
hess(D) = P(dWA + dWA^T), dWA = 2 M D Q + Y dQ, so an iteration is 3 n x n products (plus 4
for a projector that is not the identity) and needs no eigh. CG runs in fp32: the direction
only has to be good to a few digits (inexact Newton keeps a superlinear rate), while f, H and
the residual, which decide acceptance and stopping, stay fp64. An Armijo backtrack on f keeps
every pass a descent.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["GramProblem", "mu_ladder", "newton_solve", "off", "identity"]

Projector = Callable[[torch.Tensor], torch.Tensor]
_F64, _F32 = torch.float64, torch.float32
ETA_MIN, ETA_MAX = 1e-3, 0.1  # the CG forcing term's range (see _newton_direction)
LADDER_RATIO = math.sqrt(10.0)  # mu shrinks by this per rung (see mu_ladder)
STAGE_TOL = 1e-3  # a smoothing rung's stopping residual before the last one (see mu_ladder)
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


def eig_sqrt(N: torch.Tensor, mu2: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Singular values s (..., n) and right singular vectors V of X from N = X^T X; with
    ``mu2 > 0`` the smoothed sqrt(s^2 + mu^2). Eigenvalues below ``n eps e_max`` (round-off of
    a rank-deficient Gram) count as 0."""
    e, V = torch.linalg.eigh(_sym(N))
    e = e.clamp_min(0.0)
    floor = e[..., -1:] * (e.shape[-1] * 1e-15)
    return (torch.where(e > floor, e, 0.0) + mu2).sqrt(), V


def _basis_projector(P: Projector, V: torch.Tensor) -> Projector:
    """P seen in V's basis: Z -> V^T P(V Z V^T) V, with shortcuts for the two known ones."""
    if P is identity:
        return identity
    if P is off:
        # V^T Diag(V Z V^T) V with diag(V Z V^T)_i = sum_j (V Z)_ij V_ij: 2 products, not 4
        return lambda Z: Z - (V.mT * ((V @ Z) * V).sum(-1).unsqueeze(-2)) @ V
    return lambda Z: V.mT @ P(V @ Z @ V.mT) @ V


class GramProblem:
    """The n x n data of one batch of direction problems (fp64), from tall G, W (..., m, n)
    in any float dtype: the three Gram products run in that dtype, the rest in fp64."""

    def __init__(self, G: torch.Tensor, W: torch.Tensor, P: Projector, mu: float = 0.0) -> None:
        self.P, self.mu2, self.n = P, mu * mu, W.shape[-1]
        self.M = _sym(W.mT @ W).to(_F64)
        self.G1 = (W.mT @ G).to(_F64)
        self.C = _sym(G.mT @ G).to(_F64)

    @classmethod
    def from_grams(cls, C: torch.Tensor, G1: torch.Tensor, M: torch.Tensor, P: Projector,
                   mu: float = 0.0) -> GramProblem:
        """The problem from its three fp64 Grams (G^T G, W^T G, W^T W): no tall products."""
        pb = cls.__new__(cls)
        pb.P, pb.mu2, pb.n = P, mu * mu, M.shape[-1]
        pb.C, pb.G1, pb.M = C, G1, M
        return pb

    def m_is_eye(self) -> bool:
        """Whether every M = W^T W is I to ~fp32 round-off (one host sync, then cached)."""
        if not hasattr(self, "_m_is_eye"):
            eye = torch.eye(self.n, dtype=self.M.dtype, device=self.M.device)
            self._m_is_eye = float(torch.linalg.matrix_norm(self.M - eye).max()) < M_EYE_TOL
        return self._m_is_eye

    def state(self, L: torch.Tensor) -> dict[str, torch.Tensor]:
        """f, H and what the Newton direction needs at multiplier L (..., n, n): one eigh."""
        ML = self.M @ L
        Y = self.G1 + 2.0 * ML  # W^T X
        LG = self.G1.mT @ L
        N = self.C + 2.0 * (LG + LG.mT) + 4.0 * L @ ML  # X^T X
        s, V = eig_sqrt(N, self.mu2)
        Q = (V * _inv(s).unsqueeze(-2)) @ V.mT  # (X^T X + mu^2)^{-1/2}
        WA = Y @ Q  # W^T A
        H = self.P(WA + WA.mT)
        res = torch.linalg.matrix_norm(H) / self.n
        return {"L": L, "Y": Y, "s": s, "V": V, "Q": Q, "H": H, "f": s.sum(-1), "res": res}


def _newton_direction(pb: GramProblem, st: dict, cg_iters: int) -> torch.Tensor:
    """Preconditioned CG on hess(D) = -H in V's basis, fp32, a fixed number of iterations
    (batched, no host syncs); returns D in the original basis, fp64."""
    V = st["V"].to(_F32)
    s = st["s"].to(_F32)
    Vt = V.mT
    Yb = Vt @ st["Y"].to(_F32) @ V
    # M in the basis; on the manifold (M = I to fp32 round-off, the optimizer's case) it is
    # left out: CG only needs a few digits (f, H and the residual stay exact), and that saves
    # 2 + (one per CG iteration) n x n products a pass
    MDs = None if pb.m_is_eye() else Vt @ pb.M.to(_F32) @ V
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

    tiny = torch.finfo(_F32).tiny
    R = -(Vt @ st["H"].to(_F32) @ V)
    D = torch.zeros_like(R)
    Z = Pb(pre * R)
    Pd, rz = Z, _dot(R, Z)
    # Inexact Newton: solve to a relative residual eta = clamp(10 res, 1e-3, 0.1), a forcing
    # term that shrinks with the residual (Eisenstat-Walker; quadratic-like rate near the
    # solution), and never below 1e-3, where fp32 CG still holds (it loses conjugacy past
    # ~1e-5). A solved matrix stops moving; all solved, CG stops.
    eta = (10.0 * st["res"].to(_F32)).clamp(ETA_MIN, ETA_MAX)[..., None, None]
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
    D = pb.P(_sym(Vd @ D.to(_F64) @ Vd.mT))
    # CG on a PSD system from 0 gives a descent direction; if round-off broke that, take the
    # preconditioned gradient (in the original basis)
    bad = _dot(D, st["H"]) >= 0
    if bool(bad.any()):
        G0 = Vd @ (pre.to(_F64) * -(Vd.mT @ st["H"] @ Vd)) @ Vd.mT
        D = torch.where(bad, pb.P(_sym(G0)), D)
    return D


def mu_ladder(mu: float, start: float) -> list[float]:
    """The smoothing continuation mu_k = mu 10^k, k = K..0, from ~``start`` down to ``mu``.

    At mu = 1e-3 the smoothed f has curvature ~1/mu across a (near-)zero singular value of X,
    which the optimum of a square DGram problem has: Newton's region of quadratic convergence
    shrinks to ~mu: from a cold start full steps overshoot (f 7 -> 21), Armijo halves them
    (one eigh each) and 20 passes end at residual 1e-5..1e-2 (gpt-tiny's 128 x 128 attention
    projections: ~3.5 s per 4 matrices, once NaN). Each rung is solved to ``STAGE_TOL`` from
    the previous rung's multiplier, inside the next one's Newton region: the same 20 passes
    then end at 1e-5 in ~1.3 s. A ratio of sqrt(10) per rung measured fewest passes (10 and 2
    took more); a warm start from the previous step's multiplier at the final mu did worse.
    """
    if mu <= 0.0 or start <= mu:
        return [mu]
    k = math.ceil(math.log(start / mu) / math.log(LADDER_RATIO) - 1e-9)
    return [mu * LADDER_RATIO**j for j in range(k, 0, -1)] + [mu]


def _newton_pass(pb: GramProblem, st: dict, active: torch.Tensor, cg_iters: int) -> dict:
    """One Newton step with a per-matrix Armijo backtrack on f; inactive matrices stay put.

    Every trial step costs an eigh, as a pass does. Far from the optimum (real training
    gradients are near rank-deficient, so X = G + 2 W Lambda has singular values ~mu there
    and the full Newton step overshoots) the plain halving backtracked about once per pass:
    462 eighs for 248 passes on gpt-debug's tall matrices (docs/science.md §3.2). So each
    matrix starts at twice its previous pass's accepted step (capped at 1; 1 on a rung's first
    pass) and backtracks to the minimiser of the quadratic through f(0), f'(0) and f(t),
    safeguarded to [t/10, t/2]: 295 eighs for 213 passes there, the same residuals.
    """
    D = _newton_direction(pb, st, cg_iters)
    D = torch.where(active[..., None, None], D, 0.0)
    slope = _dot(st["H"], D).squeeze(-1).squeeze(-1)  # <= 0
    t = (2.0 * st["t"]).clamp(max=1.0) if "t" in st else torch.ones_like(st["f"])
    L = st["L"]
    new = pb.state(L + t[..., None, None] * D)
    for _ in range(30):
        ok = new["f"] <= st["f"] + 1e-4 * t * slope + 1e-14 * st["f"].abs()
        if bool(ok.all()):
            break
        curv = (new["f"] - st["f"] - t * slope).clamp_min(torch.finfo(t.dtype).tiny)
        t_q = (-slope * t * t / (2.0 * curv)).clamp(min=0.1 * t, max=0.5 * t)
        t = torch.where(ok, t, t_q)
        new = pb.state(L + t[..., None, None] * D)
    new["t"] = t
    return new


def newton_solve(pb: GramProblem, L: torch.Tensor, steps: int, tol: float, cg_iters: int,
                 mus: list[float] | None = None) -> tuple[dict, torch.Tensor]:
    """Newton passes from L until every residual < tol or ``steps`` passes; returns the final
    state and the per-matrix pass counts (a matrix stops counting once below tol).

    ``mus`` (default: ``pb``'s own mu) is a smoothing ladder ending at ``pb``'s mu
    (``mu_ladder``); the rungs before the last stop at ``STAGE_TOL`` and each keeps at least
    one pass for the rungs after it. ``pb.mu2`` is left at the last rung's value.
    """
    mus = [math.sqrt(pb.mu2)] if mus is None else mus
    passes = torch.zeros(L.shape[:-2], dtype=torch.long, device=L.device)
    used = 0
    for i, mu in enumerate(mus):
        last = i == len(mus) - 1
        stage_tol = tol if last else max(tol, STAGE_TOL)
        budget = steps - used - (len(mus) - 1 - i)  # passes left for this rung
        pb.mu2 = mu * mu
        st = pb.state(L)
        used += 1
        passes += 1
        for _ in range(max(0, budget - 1)):
            active = st["res"] >= stage_tol
            if not bool(active.any()):
                break
            passes += active.long()
            used += 1
            st = _newton_pass(pb, st, active, cg_iters)
        L = st["L"]
    return st, passes
