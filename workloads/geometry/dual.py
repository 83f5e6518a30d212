"""The Manifold Muon direction problem and its dual ascent, in Gram space; docs/science.md §3.2-3.3.

Primal (tall W, m >= n; ``P`` a self-adjoint projector on symmetric n x n matrices):

    max <G, A>  s.t.  ||A||_2 <= 1,  P(W^T A + A^T W) = 0.

Dual: minimise f(Lambda) = ||G + 2 W Lambda||_* over symmetric Lambda = P(Lambda); its gradient
is H = P(W^T A + A^T W) with A = msign(G + 2 W Lambda), the tangent-space violation. The
residual ``||H||_F / n`` is the stopping test and what gets logged.

Three methods (``DUAL_METHODS``):

- ``absolute``: the paper's ascent, Lambda <- Lambda - alpha (1 - k/K) H on the raw G (Paper B,
  TML code). alpha is absolute while Lambda* scales with G, so whether it converges depends on
  the gradient's scale (measured: the residual stalls at 0.1-0.2 on gpt-tiny gradients).
- ``relative``: the same step with G scaled to unit Frobenius norm first. The direction
  msign(G + 2 W Lambda) is invariant to scaling G and Lambda together, so this only makes alpha
  relative; it is still a subgradient method (linear rate ~ 1 - alpha sigma_min) and reaches
  ~1e-4, not 1e-6, in 20 passes.
- ``newton`` (default): f is smooth where G + 2 W Lambda has full column rank, and every
  quantity it needs is n x n: with X = G + 2 W Lambda, X^T X = G^T G + 2(G1^T L + L G1)
  + 4 L M L (G1 = W^T G, M = W^T W) and msign(X) = X (X^T X)^{-1/2}. One fp64 eigh of X^T X per
  pass gives f, H and exact Hessian-vector products (Daleckii-Krein), so each pass is a Newton
  step (a few CG iterations, preconditioned by the frozen-(X^T X) Lyapunov map) with an Armijo
  backtrack on f. Quadratic convergence: tol 1e-6 in a handful of passes, where a plain
  gradient step cannot get there in 20 (its rate is set by sigma_min / sigma_max of X, which is
  ~1e-2 for low-rank gradients). msign here is exact (to fp64), which a tol of 1e-6 needs: the
  fp32 Polar Express error alone is ~1e-3.

Every method works on a batch (..., m, n); ``passes`` counts msign/eigh evaluations of the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from workloads.geometry.msign import msign

__all__ = ["DUAL_METHODS", "DualResult", "dual_ascent", "gram_msign", "identity"]

Projector = Callable[[torch.Tensor], torch.Tensor]
MsignFn = Callable[[torch.Tensor], torch.Tensor]
DUAL_METHODS = ("newton", "relative", "absolute")
_F64 = torch.float64


def identity(M: torch.Tensor) -> torch.Tensor:
    """The Stiefel projector: every symmetric multiplier is allowed."""
    return M


def _sym(M: torch.Tensor) -> torch.Tensor:
    return 0.5 * (M + M.mT)


@dataclass
class DualResult:
    """``A`` (..., m, n) the direction; ``residual`` (...) ||H||_F / n of that A; ``passes`` (...)
    the passes each matrix used (it stops counting once its residual is below tol); ``L``
    (..., n, n) the final multiplier, in the units of the solve (G scaled to ||G||_F = 1 unless
    ``absolute``), to warm-start the next optimizer step."""

    A: torch.Tensor
    residual: torch.Tensor
    passes: torch.Tensor
    L: torch.Tensor | None = None


def gram_msign(X: torch.Tensor) -> torch.Tensor:
    """Exact msign of tall X (..., m, n) from one eigh of the n x n Gram X^T X, in fp64.

    Cheaper than an SVD or 12 Polar Express steps when n is small; singular values below
    ``n eps sigma_max`` (squared: the Gram squares the condition number) map to 0.
    """
    Xd = X.to(_F64)
    s, V = _eigs(Xd.mT @ Xd)
    return (Xd @ _apply(V, _inv(s))).to(X.dtype)


def _eigs(N: torch.Tensor, mu2: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Singular values s (..., n) and right singular vectors V of X from N = X^T X; with
    ``mu2 > 0`` the smoothed sqrt(s^2 + mu^2)."""
    e, V = torch.linalg.eigh(_sym(N))
    e = e.clamp_min(0.0)
    floor = e[..., -1:] * (e.shape[-1] * 1e-15)
    return (torch.where(e > floor, e, 0.0) + mu2).sqrt(), V


def _inv(s: torch.Tensor) -> torch.Tensor:
    return torch.where(s > 0, 1.0 / s.clamp_min(torch.finfo(s.dtype).tiny), 0.0)


def _apply(V: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """V diag(d) V^T."""
    return (V * d.unsqueeze(-2)) @ V.mT


def _in_basis(V: torch.Tensor, M: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """V (K o (V^T M V)) V^T: an entrywise map in the eigenbasis."""
    return V @ (K * (V.mT @ M @ V)) @ V.mT


class _Problem:
    """The n x n data of one batch of direction problems, in fp64."""

    def __init__(self, G: torch.Tensor, W: torch.Tensor, P: Projector, mu: float = 0.0) -> None:
        self.G, self.W, self.P, self.mu2 = G, W, P, mu * mu
        self.M, self.G1, self.C = W.mT @ W, W.mT @ G, G.mT @ G
        self.n = W.shape[-1]

    def state(self, L: torch.Tensor) -> dict[str, torch.Tensor]:
        """f, H and what the Hessian needs at multiplier L (..., n, n)."""
        Y = self.G1 + 2.0 * self.M @ L  # W^T X
        LG = self.G1.mT @ L
        N = self.C + 2.0 * (LG + LG.mT) + 4.0 * L @ self.M @ L  # X^T X
        s, V = _eigs(N, self.mu2)
        Q = _apply(V, _inv(s))  # (X^T X)^{-1/2}
        WA = Y @ Q  # W^T A
        H = self.P(WA + WA.mT)
        return {"L": L, "Y": Y, "s": s, "V": V, "Q": Q, "H": H, "f": s.sum(-1)}

    def hvp(self, st: dict, D: torch.Tensor) -> torch.Tensor:
        """Hessian of f times symmetric D = P(D): dH for dL = D (Daleckii-Krein for N^{-1/2})."""
        s, V, Y, Q = st["s"], st["V"], st["Y"], st["Q"]
        dN = 2.0 * (D @ Y + Y.mT @ D)
        ss = s.unsqueeze(-1) * s.unsqueeze(-2)
        K = -_inv(ss * (s.unsqueeze(-1) + s.unsqueeze(-2)))  # divided differences of e^{-1/2}
        dQ = _in_basis(V, dN, K)
        dWA = 2.0 * self.M @ D @ Q + Y @ dQ
        return self.P(dWA + dWA.mT)

    def precondition(self, st: dict, R: torch.Tensor) -> torch.Tensor:
        """Inverse of the frozen-Q curvature D -> 2(DQ + QD): entries s_i s_j / 2(s_i + s_j)."""
        s = st["s"].clamp_min(st["s"][..., -1:] * 1e-6)
        ss = s.unsqueeze(-1) * s.unsqueeze(-2)
        return self.P(_in_basis(st["V"], R, ss / (2.0 * (s.unsqueeze(-1) + s.unsqueeze(-2)))))

    def direction(self, st: dict) -> torch.Tensor:
        X = self.G + 2.0 * self.W @ st["L"]
        return X @ st["Q"]


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(dim=(-2, -1), keepdim=True)


def _newton_direction(pb: _Problem, st: dict, cg_iters: int) -> torch.Tensor:
    """Preconditioned CG on hess(D) = -H, batched, a fixed number of iterations (no syncs)."""
    tiny = torch.finfo(_F64).tiny
    D = torch.zeros_like(st["H"])
    R = -st["H"]
    Z = pb.precondition(st, R)
    Pd = Z
    rz = _dot(R, Z)
    for _ in range(cg_iters):
        Hp = pb.hvp(st, Pd)
        curv = _dot(Pd, Hp)
        ok = (curv > tiny) & (rz > tiny)
        a = torch.where(ok, rz / curv.clamp_min(tiny), 0.0)
        D = D + a * Pd
        R = R - a * Hp
        Z = pb.precondition(st, R)
        rz_new = _dot(R, Z)
        Pd = Z + torch.where(ok, rz_new / rz.clamp_min(tiny), 0.0) * Pd
        rz = rz_new
    # CG on a PSD system starting at 0 gives a descent direction; fall back to the
    # preconditioned gradient if round-off broke that.
    bad = _dot(D, st["H"]) >= 0
    return torch.where(bad, pb.precondition(st, -st["H"]), D)


def _newton(pb: _Problem, L: torch.Tensor, steps: int, tol: float, cg_iters: int):
    st = pb.state(L)
    passes = torch.ones(L.shape[:-2], dtype=torch.long, device=L.device)
    for _ in range(steps - 1):
        res = torch.linalg.matrix_norm(st["H"]) / pb.n
        if bool((res < tol).all()):
            break
        passes += (res >= tol).long()
        D = _newton_direction(pb, st, cg_iters)
        slope = _dot(st["H"], D).squeeze(-1).squeeze(-1)  # < 0
        t = torch.ones_like(st["f"])
        new = pb.state(L + D)
        for _ in range(30):  # Armijo backtracking, per matrix
            ok = new["f"] <= st["f"] + 1e-4 * t * slope + 1e-14 * st["f"].abs()
            if bool(ok.all()):
                break
            t = torch.where(ok, t, 0.5 * t)
            new = pb.state(L + t[..., None, None] * D)
        L = new["L"]
        st = new
    res = torch.linalg.matrix_norm(st["H"]) / pb.n
    return pb.direction(st), res, passes, st["L"]


def _gradient(G, W, P, L, steps, lr, tol, msign_fn):
    """The paper's loop (Paper B / TML): A = msign(G + 2 W P(sym L)), L <- L - lr (1 - k/K) H."""
    n = W.shape[-1]
    passes = torch.zeros(W.shape[:-2], dtype=torch.long, device=W.device)
    done = torch.zeros(W.shape[:-2], dtype=torch.bool, device=W.device)
    for k in range(steps):
        A = msign_fn(G + 2.0 * W @ P(_sym(L)))
        H = P(W.mT @ A + A.mT @ W)
        residual = torch.linalg.matrix_norm(H) / n
        passes += (~done).long()
        done = done | (residual < tol)
        if tol > 0 and bool(done.all()):
            break
        L = L - lr * (1.0 - k / steps) * H
    return A, residual, passes, L


def dual_ascent(
    G: torch.Tensor,
    W: torch.Tensor,
    P: Projector = identity,
    method: str = "newton",
    steps: int = 20,
    lr: float = 0.1,
    tol: float = 1e-6,
    msign_fn: MsignFn = msign,
    cg_iters: int = 8,
    smooth: float = 0.0,
    L0: torch.Tensor | None = None,
) -> DualResult:
    """The direction A (..., m, n) for tall G, W (..., m, n); see the module docstring.

    ``steps`` caps the passes (msign / eigh evaluations, Armijo retries not counted); ``tol``
    stops once every residual is below it (one host sync per pass); ``lr`` and ``msign_fn``
    are the gradient methods' step size and msign (``newton`` uses its exact fp64 one).
    ``L0`` (..., n, n) warm-starts the multiplier (e.g. the previous optimizer step's
    ``DualResult.L``); default: -P(W^T G + G^T W) / 4, exact for square Stiefel W. The
    momentum direction and W move little per step, so a warm start is often below ``tol``
    after its first pass (which is then the only one).
    """
    if W.ndim < 2 or W.shape[-2] < W.shape[-1]:
        raise ValueError(f"expected a tall (..., m, n) matrix with m >= n, got {tuple(W.shape)}")
    if G.shape != W.shape:
        raise ValueError(f"gradient shape {tuple(G.shape)} != weight shape {tuple(W.shape)}")
    if steps < 1:
        raise ValueError(f"dual ascent needs steps >= 1, got {steps}")
    if method not in DUAL_METHODS:
        raise ValueError(f"dual method {method!r} is not one of {', '.join(DUAL_METHODS)}")
    if method != "absolute":
        # Scale invariance: A(G) = A(c G) for c > 0, so solve at ||G||_F = 1.
        G = G / torch.linalg.matrix_norm(G).clamp_min(1e-30)[..., None, None]
    if L0 is not None and (L0.shape != W.shape[:-2] + (W.shape[-1], W.shape[-1])
                           or W.shape[-2] == W.shape[-1]):
        # A shape change (new bucket) starts cold; so does square W, where the cold start is
        # (near) exact and a warm one was measured to stall (20 passes at 1e-5 on gpt-tiny's
        # attention projections: the square problem's X is degenerate, paired singular values).
        L0 = None
    # Exact in one pass for square Stiefel W: W Lambda_0 cancels the non-tangent part of G.
    if method != "newton":
        L0 = -0.25 * P(W.mT @ G + G.mT @ W) if L0 is None else P(_sym(L0.to(G.dtype)))
        A, res, passes, L = _gradient(G, W, P, L0, steps, lr, tol, msign_fn)
        return DualResult(A, res, passes, L)
    Gd, Wd = G.to(_F64), W.to(_F64)
    L0 = -0.25 * P(Wd.mT @ Gd + Gd.mT @ Wd) if L0 is None else P(_sym(L0.to(_F64)))
    A, res, passes, L = _newton(_Problem(Gd, Wd, P, smooth), L0, steps, tol, cg_iters)
    return DualResult(A.to(G.dtype), res.to(G.dtype), passes, L)
