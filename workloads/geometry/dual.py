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
  + 4 L M L (G1 = W^T G, M = W^T W) and msign(X) = X (X^T X)^{-1/2}. The three Gram products
  are made once; a pass is then one fp64 eigh of an n x n matrix, which gives f, H and exact
  Hessian-vector products (Daleckii-Krein), so each pass is a Newton step (fp32 CG in the
  eigenbasis, preconditioned by the frozen-(X^T X) Lyapunov map) with an Armijo backtrack on f
  (``workloads.geometry.dual_newton``). Quadratic convergence: tol 1e-6 in a handful of passes
  (one or two from a warm start), where a plain gradient step cannot get there in 20 (its rate
  is set by sigma_min / sigma_max of X, ~1e-2 for low-rank gradients). msign here is exact (to
  fp64), which a tol of 1e-6 needs: the fp32 Polar Express error alone is ~1e-3. Only the
  final A = G Q + W (2 Lambda Q) touches the tall matrices again.

Every method works on a batch (..., m, n); ``passes`` counts msign/eigh evaluations of the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from workloads.geometry.dual_newton import (
    GramProblem,
    eig_sqrt,
    identity,
    mu_ladder,
    newton_solve,
    off,
)
from workloads.geometry.gram_sqrt import inv_sqrt_near
from workloads.geometry.msign import msign

__all__ = ["DUAL_METHODS", "DualResult", "GramSolution", "dual_ascent", "gram_msign", "identity",
           "newton_gram", "off", "usable_warm_start"]

Projector = Callable[[torch.Tensor], torch.Tensor]
MsignFn = Callable[[torch.Tensor], torch.Tensor]
DUAL_METHODS = ("newton", "relative", "absolute")
_F64 = torch.float64
MU_START = 0.1  # a cold solve's first smoothing rung, ||G||_F = 1 units (dual_newton.mu_ladder)


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
    s, V = eig_sqrt(Xd.mT @ Xd)
    inv = torch.where(s > 0, 1.0 / s.clamp_min(torch.finfo(_F64).tiny), 0.0)
    return (Xd @ ((V * inv.unsqueeze(-2)) @ V.mT)).to(X.dtype)


def usable_warm_start(L0: torch.Tensor | None, W: torch.Tensor) -> torch.Tensor | None:
    """``L0`` if it can warm-start the dual for tall W (..., m, n), else None (cold start)."""
    if L0 is not None and (L0.shape != W.shape[:-2] + (W.shape[-1], W.shape[-1])
                           or W.shape[-2] == W.shape[-1]):
        # A shape change (new bucket) starts cold; so does square W, where the cold start is
        # (near) exact and a warm one was measured to stall (20 passes at 1e-5 on gpt-tiny's
        # attention projections: the square problem's X is degenerate, paired singular values).
        return None
    return L0


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
    cg_iters: int = 30,
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
    dtype = G.dtype
    if method != "absolute":
        # Scale invariance: A(G) = A(c G) for c > 0, so solve at ||G||_F = 1.
        G = G / torch.linalg.matrix_norm(G).clamp_min(1e-30)[..., None, None]
    L0 = usable_warm_start(L0, W)
    # Exact in one pass for square Stiefel W: W Lambda_0 cancels the non-tangent part of G.
    if method != "newton":
        L0 = -0.25 * P(W.mT @ G + G.mT @ W) if L0 is None else P(_sym(L0.to(G.dtype)))
        A, res, passes, L = _gradient(G, W, P, L0, steps, lr, tol, msign_fn)
        return DualResult(A, res, passes, L)
    G, W = G.to(_F64), W.to(_F64)  # fp32 Grams lose what a tol of 1e-6 needs (Gram squaring)
    sol = newton_gram(G, W, P, steps, tol, cg_iters, smooth, L0)
    # A = G QG + W RW; fp64 like the rest, then the input dtype
    A = G @ sol.QG + W @ sol.RW
    return DualResult(A.to(dtype), sol.res.to(dtype), sol.passes, sol.L)


@dataclass
class GramSolution:
    """The newton method's answer in Gram space: A = G QG + W RW (G at ||G||_F = 1), with
    ``M`` = W^T W, ``WA`` = W^T A and ``AtA`` = A^T A (I up to the smoothing) in fp64, for the
    given W; ``res``, ``passes``, ``L`` as in ``DualResult``; ``qg_norm`` (...) = ||QG||_2
    (1 / sigma_min(X), smoothed, or 0 where A is in W's span)."""

    QG: torch.Tensor
    RW: torch.Tensor
    M: torch.Tensor
    WA: torch.Tensor
    AtA: torch.Tensor
    res: torch.Tensor
    passes: torch.Tensor
    L: torch.Tensor
    qg_norm: torch.Tensor


def _ata(st: dict, mu2: float) -> torch.Tensor:
    """A^T A = Q X^T X Q = V diag(e / (e + mu^2)) V^T from a state's eigh (0 where e = 0):
    well conditioned, where Q (C ...) Q would lose cond(X)^2 eps."""
    s2 = st["s"] ** 2
    d = torch.where(s2 > 0, (s2 - mu2).clamp_min(0.0) / s2.clamp_min(torch.finfo(_F64).tiny), 0.0)
    return (st["V"] * d.unsqueeze(-2)) @ st["V"].mT


def _qmax(st: dict) -> torch.Tensor:
    """||Q||_2 = 1 / the smallest (smoothed) singular value; inf for a singular X."""
    s = st["s"][..., 0]
    return torch.where(s > 0, 1.0 / s.clamp_min(torch.finfo(s.dtype).tiny), torch.inf)


def _square_exact(pb: GramProblem, tol: float, cg_iters: int) -> GramSolution | None:
    """Square Stiefel: the closed form A = W msign(skew(W^T G)) for orthogonal W, on W
    re-orthogonalised in fp64 (W_o = W Z, Z = M^{-1/2} by Newton-Schulz; an fp32 W is ~1e-7
    off, which the optimum's near-zero singular values amplify: residual 4e-7..2e-6 measured on
    gpt-tiny's 128 x 128 projections, so some steps failed tol 1e-6 and climbed the 5-pass
    smoothing ladder). The residual is then measured against the given W."""
    eye = torch.eye(pb.n, dtype=_F64, device=pb.M.device)
    if not float(torch.linalg.matrix_norm(pb.M - eye).max()) < 1e-3:
        return None
    Z = inv_sqrt_near(pb.M)
    po = GramProblem.from_grams(pb.C, Z @ pb.G1, _sym(Z @ pb.M @ Z), pb.P, 0.0)
    st, passes = newton_solve(po, -0.5 * _sym(po.G1), 1, tol, cg_iters)
    # A = X_o Q with X_o = G + 2 W_o L = W_o skew(W_o^T G) (W_o W_o^T = I): in W's span,
    # A = W (Z skew(S) Q), with no G term whose coefficient Q (cond(X) ~ 5e3 here) would
    # amplify round-off in the retraction (stiefel_step)
    S = po.G1
    RW = Z @ (0.5 * (S - S.mT) @ st["Q"])
    WA = pb.M @ RW  # W^T A for the given W
    res = torch.linalg.matrix_norm(pb.P(WA + WA.mT)) / pb.n
    if not bool((res < tol).all()):
        return None
    # A^T A of this representation (not V diag V^T, which assumes the eigh's N is X's Gram:
    # off by eps ||G||^2 / sigma_min^2 when skew(S) is ill-conditioned)
    AtA = _sym(RW.mT @ WA)
    zero = torch.zeros_like(st["Q"])
    return GramSolution(zero, RW, pb.M, WA, AtA, res, passes, st["L"], torch.zeros_like(res))


def newton_gram(G: torch.Tensor, W: torch.Tensor, P: Projector, steps: int, tol: float,
                cg_iters: int, smooth: float, L0: torch.Tensor | None) -> GramSolution:
    """The newton method on fp64 G (||G||_F = 1), W (..., m, n): three tall Gram products, then
    n x n work only (docs/science.md §3.2-3.3); ``L0`` as in ``dual_ascent`` (already checked)."""
    L0 = None if L0 is None else P(_sym(L0.to(_F64)))
    pb = GramProblem(G, W, P, smooth)
    if P is identity and W.shape[-2] == W.shape[-1]:
        sol = _square_exact(pb, tol, cg_iters)
        if sol is not None:
            return sol
    st, passes = None, None
    if P is identity and W.shape[-2] == W.shape[-1]:
        # Square Stiefel: the cold start is the exact solution, A = W msign(skew(W^T G)), when
        # W is orthogonal; its X = W skew(W^T G) has paired (for odd n also zero) singular
        # values, and smoothing would move the optimum off it, where Newton crawls (measured:
        # 20 passes at 1e-5). So try it unsmoothed; smooth only if a W is off the manifold.
        pb.mu2 = 0.0
        st, passes = newton_solve(pb, -0.5 * P(_sym(pb.G1)), 1, tol, cg_iters)
        if not bool((st["res"] < tol).all()):
            st = None
    if st is None:
        pb.mu2 = smooth * smooth
        # Square W (DGram's, or Stiefel's off the manifold): the optimum's X has a (near-)zero
        # singular value, so climb down a smoothing ladder (dual_newton.mu_ladder). Tall W:
        # full rank in practice, one rung (the ladder was measured to double the passes).
        mus = mu_ladder(smooth, MU_START) if W.shape[-2] == W.shape[-1] else [smooth]
        st, passes = newton_solve(pb, -0.5 * P(_sym(pb.G1)) if L0 is None else L0, steps, tol,
                                  cg_iters, mus)
    return GramSolution(st["Q"], 2.0 * st["L"] @ st["Q"], pb.M, st["Y"] @ st["Q"],
                        _ata(st, pb.mu2), st["res"], passes, st["L"], _qmax(st))
