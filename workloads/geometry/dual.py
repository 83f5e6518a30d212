"""The Manifold Muon direction problem and its three solvers; docs/science.md §3.2-3.3.

Primal, for a tall W (m >= n) and a self-adjoint projector P on symmetric n x n matrices:

    max <G, A>  s.t.  ||A||_2 <= 1,  P(W^T A + A^T W) = 0,

always against the raw W: DGram's condition Off(W^T A + A^T W) = 0 involves its column norms,
and no rescaled frame has the same tangent space (W = W~ D gives D B + B^T D, B = W~^T A, not
B + B^T). Dual: minimise ||G + 2 W Lambda||_* over symmetric Lambda = P(Lambda); its gradient is
H = P(W^T A + A^T W) with A = msign(G + 2 W Lambda).

``DUAL_MODES``, named by what they promise:

- ``fast`` (default): for tall W on its manifold a fixed point of the optimality condition
  (Stiefel: ``dual_fixed_point``; DGram: ``dual_fixed_point_dgram``, at most
  ``DGRAM_FIXED_POINT_PASSES`` passes, then Newton), else Newton on the dual in Gram space
  (``dual_newton``); fp32 tall products
  (Grams, A, residual) and the n x n work in fp64 on CPU, fp32 on CUDA (``mode_dtypes``),
  batched over a shape bucket, stopping at ``tol`` (default 1e-4); its smoothing ladder stops
  at ``ladder_floor`` and it warm-starts from the previous step's multiplier and rung.
- ``paper``: Paper B's ascent exactly (``dual_paper``): K = ``steps`` passes at most,
  alpha (1 - k/K), Polar Express msign (bf16 on CUDA, fp32 on CPU), a fresh start every step,
  its stop at ``tol`` (default 1e-6), on the raw G.
- ``exact``: the same Newton in fp64, its ladder ending in an unsmoothed polish, ``tol``
  default 1e-6: the reference for tests and small CPU studies.

Whatever the mode, ``residual`` is ||P(W^T A + A^T W)||_F / n of the A returned, measured from
that A against the given W (``true_residual``): one tall product, so what is logged is the
constraint violation of the direction the optimizer applies, not a solver's internal figure.
In ``fast`` and ``exact`` a matrix whose solve ends at or above tol (square DGram, a solve out
of passes) gets the nearest tangent direction in the unit ball instead (``dual_feasible``,
docs/science.md §3.2.5), so the direction applied always meets tol.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from workloads.choices import DUAL_MODE_DEFAULTS, dual_settings
from workloads.geometry.dual_feasible import restore_feasibility
from workloads.geometry.dual_fixed_point import stiefel_fixed_point
from workloads.geometry.dual_fixed_point_dgram import dgram_fixed_point
from workloads.geometry.dual_newton import (
    M_EYE_TOL,
    GramProblem,
    identity,
    newton_solve,
    off,
    resolution,
)
from workloads.geometry.dual_paper import paper_ascent
from workloads.geometry.gram_sqrt import inv_sqrt_near
from workloads.geometry.msign import msign

__all__ = ["DUAL_MODES", "MODE_TOL", "DEFAULT_DUAL", "DualOptions", "DualResult", "solve_direction",
           "true_residual", "usable_warm_start", "identity", "off"]

Projector = Callable[[torch.Tensor], torch.Tensor]
DUAL_MODES = ("fast", "paper", "exact")  # workloads/choices.py keeps the same names
MODE_TOL = {m: tol for m, (tol, _) in DUAL_MODE_DEFAULTS.items()}  # dual_tol left null
_F32 = torch.float32
FAST_FLOOR = torch.finfo(torch.float32).eps ** 0.5  # ~3.5e-4, see ladder_floor


def mode_dtypes(mode: str, device: torch.device) -> tuple[torch.dtype, torch.dtype]:
    """``(tall, small)``: the dtype of the tall products (Grams, A, residual) and of the n x n
    work. ``exact``: fp64 and fp64. ``fast``: fp32 tall products; the n x n work in fp64 on
    CPU and fp32 on CUDA (no fp64 on the GPU). Why not fp32 everywhere [measured, captured
    gpt-debug gradients, docs/science.md §3.2.2]: an fp32 eigh resolves X's singular values
    down to sqrt(n eps) sigma_max only, so the smoothing must stop there (mu ~ 3e-3), and on
    near rank-deficient gradients that smoothed direction is up to 5% below the optimum in the
    objective (median direction error 0.14); with fp64 n x n work on the fp32 Grams the
    ladder goes down to ``FAST_FLOOR`` (~3.5e-4): objective gap <= 2e-3, median direction
    error 1.5e-2 (Stiefel) / 4e-2 (DGram), for ~1.4x the CPU time of a cold solve. (fp64 Grams
    too measured the same errors: the fp32 tall products are not what limits.)"""
    if mode == "exact":
        return torch.float64, torch.float64
    return _F32, (_F32 if device.type == "cuda" else torch.float64)


def ladder_floor(mode: str, n: int, small: torch.dtype) -> float:
    """The ladder's last smoothing rung: the eigh's resolution sqrt(n eps) in the n x n dtype,
    and for ``fast`` no lower than sqrt(eps32) ~ 3.5e-4 (``FAST_FLOOR``: deeper rungs cost
    passes, ~2 each, for an objective gap already <= 2e-3 there)."""
    floor = resolution(n, small)
    return max(floor, FAST_FLOOR) if mode == "fast" else floor
MU_START = 0.1  # a cold solve's first smoothing rung, ||G||_F = 1 units (dual_newton)
# A warm start begins one rung above where the previous step ended, or on it for ``fast``
# Stiefel (its square case is closed-form; on captured gpt-debug all_stiefel tall batches 8.4
# passes instead of 10.4, 25% less CPU, the same worst residual 4.9e-5 and direction error;
# DGram's square matrices started on that rung fell to residual ~8e-2)
WARM_RUNGS = 3.1622776601683795
_F64 = torch.float64
# tall DGram's fixed point (dual_fixed_point_dgram) gets at most this many passes, then Newton
# at the floor rung finishes from its best multiplier (its region of quadratic convergence,
# which the fixed point, linear at ~0.6 a pass, reaches in ~8; measured on gpt-debug hetero
# training: its MLP bucket 53 ms with 8 then Newton, 57-64 with 6 or 4, 74 with 12, 94 for
# Newton alone; captured batches with column norms spread 1..3 all met tol at 8)
DGRAM_FIXED_POINT_PASSES = 8


@dataclass(frozen=True)
class DualOptions:
    """The direction solver's knobs (``optim.manifold.dual_*``, docs/science.md §3.2).

    ``steps`` and ``tol`` None are the mode's (``workloads.choices.DUAL_MODE_DEFAULTS``);
    ``warm_start`` None is the mode's
    default (on for ``fast`` and ``exact``; off for ``paper``, where on is the ``paper`` loop
    started from the previous step's multiplier: not the paper, offered as a variant).
    ``lr`` and ``msign_method`` are the paper loop's alpha and msign; ``check_every`` its
    passes between host syncs."""

    mode: str = "fast"
    steps: int | None = None
    tol: float | None = None
    lr: float = 0.1
    warm_start: bool | None = None
    msign_method: str = "polar_express"
    cg_iters: int = 30
    check_every: int = 4

    def __post_init__(self) -> None:
        if self.mode not in DUAL_MODES:
            raise ValueError(f"dual mode {self.mode!r} is not one of {', '.join(DUAL_MODES)}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"dual steps must be >= 1, got {self.steps}")

    @property
    def stop_tol(self) -> float:
        return dual_settings(self.mode, self.tol, self.steps)[0]

    @property
    def max_passes(self) -> int:
        return dual_settings(self.mode, self.tol, self.steps)[1]

    @property
    def warm(self) -> bool:
        return self.mode != "paper" if self.warm_start is None else self.warm_start


DEFAULT_DUAL = DualOptions()  # the fast mode with its own tol and pass cap


@dataclass
class DualResult:
    """``A`` (..., m, n) the direction; ``residual`` (...) its true residual (module
    docstring); ``passes`` (...) the passes each matrix used (msign or eigh evaluations, line
    search retries not counted); ``L`` (..., n, n) the final multiplier, to warm-start the
    next step (Newton modes: in the units of G scaled to ||G||_F = 1; paper: of the raw G);
    ``mu`` (...) the smoothing of the returned direction, at ||G||_F = 1 (0: the unsmoothed
    optimum; the paper loop and plain msign are unsmoothed): a direction with residual 0 and
    mu > 0 is feasible but not the exact optimum, so the two are logged side by side."""

    A: torch.Tensor
    residual: torch.Tensor
    passes: torch.Tensor
    L: torch.Tensor | None = None
    mu: torch.Tensor | None = None


def true_residual(W: torch.Tensor, A: torch.Tensor, P: Projector) -> torch.Tensor:
    """||P(W^T A + A^T W)||_F / n for tall W, A (..., m, n), in A's dtype."""
    WA = W.to(A.dtype).mT @ A
    return torch.linalg.matrix_norm(P(WA + WA.mT)) / W.shape[-1]


def usable_warm_start(L0: torch.Tensor | None, W: torch.Tensor) -> torch.Tensor | None:
    """``L0`` if it can warm-start the dual for tall W (..., m, n), else None (cold start)."""
    if L0 is not None and L0.shape != W.shape[:-2] + (W.shape[-1], W.shape[-1]):
        return None  # a shape change (new bucket) starts cold
    return L0


def _square_stiefel(pb: GramProblem, tol: torch.Tensor) -> dict | None:
    """Square Stiefel: the closed form A = W msign(skew(W^T G)) for orthogonal W, on W
    re-orthogonalised in the working dtype (W_o = W Z, Z = M^{-1/2}; an fp32 W is ~1e-7 off):
    A = W Z msign(K), K = skew(Z W^T G). msign(K) is skew (an odd polynomial of a skew matrix
    is skew), so W^T A is skew to round-off whatever the msign's accuracy on K's small
    singular values: the exact SVD in fp64, Polar Express in fp32 (through a Gram, fp32 would
    square K's condition: residual 1e-4..1e-3 on real, rank-deficient gradients). None unless
    W is within 1e-3 of orthogonal and the answer meets ``tol`` against the given W."""
    eye = torch.eye(pb.n, dtype=pb.dtype, device=pb.M.device)
    if not float(torch.linalg.matrix_norm(pb.M - eye).max()) < 1e-3:
        return None
    Z = inv_sqrt_near(pb.M)
    S = Z @ pb.G1
    K = 0.5 * (S - S.mT)
    RW = Z @ msign(K, method="svd" if pb.dtype == torch.float64 else "polar_express")
    WA = pb.M @ RW  # W^T A for the given W
    res = torch.linalg.matrix_norm(pb.P(WA + WA.mT)) / pb.n
    if not bool((res < tol).all()):
        return None
    return {"RW": RW, "L": -0.5 * (0.5 * (S + S.mT))}


def _newton(G: torch.Tensor, W: torch.Tensor, P: Projector, opts: DualOptions,
            L0: torch.Tensor | None, mu0: torch.Tensor | None = None,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fast / exact modes: ``(A, passes, L, mu)``; A in the mode's tall dtype."""
    tall, dtype = mode_dtypes(opts.mode, W.device)
    G, W = G.to(tall), W.to(tall)
    # Scale invariance: A(G) = A(c G) for c > 0, so solve at ||G||_F = 1.
    G = G / torch.linalg.matrix_norm(G).clamp_min(torch.finfo(dtype).tiny)[..., None, None]
    # A is invariant to W -> W / c (the condition is homogeneous in W), while the residual
    # scales with c: solve at a largest column norm of 1 (DGram's grow) to tol / c, so the
    # residual against the given W meets tol
    c = torch.linalg.vector_norm(W, dim=-2).amax(-1).clamp_min(torch.finfo(dtype).tiny)
    W = W / c[..., None, None]
    # the Grams in the tall dtype, the rest in the small, CG in fp32 but for exact
    pb = GramProblem(G, W, P, dtype, cg_dtype=torch.float64 if opts.mode == "exact" else _F32)
    # (half of it: the solver stops on its Gram-space residual, and the A formed from the
    # Grams carries the working dtype's round-off on top, ~10-30% of it in fp32)
    tol, n, square = 0.5 * opts.stop_tol / c, W.shape[-1], W.shape[-2] == W.shape[-1]
    if P is identity and square:
        sol = _square_stiefel(pb, opts.stop_tol / c)  # a closed form: no margin
        if sol is not None:
            ones = torch.ones(W.shape[:-2], dtype=torch.long, device=W.device)
            return (W @ sol["RW"].to(tall), ones, sol["L"] / c[..., None, None],
                    torch.zeros_like(c))
    # the ladder's floor is the dtype's resolution; exact polishes unsmoothed below it. A warm
    # start (the previous step's multiplier: W and the momentum move little) starts on the
    # rung the previous step ended on (the batch's largest), or at the floor
    floor = ladder_floor(opts.mode, n, dtype)
    L0 = usable_warm_start(L0, W) if opts.warm else None
    fp = _fixed_point_for(pb, P, square, opts.mode)
    if fp is not None:
        # tall Stiefel on its manifold: the fixed point of the optimality condition, ~3x
        # cheaper than Newton; tall DGram on its own: a preconditioned fixed point, ~1.5-2x.
        # cold: Lambda = 0 (X = G; measured 6-13 passes on captured gpt-debug Stiefel
        # batches, 9-17 from Newton's start -1/2 sym(W^T G), where the symmetric part is 0)
        start = (P(0.5 * (L0 + L0.mT)).to(dtype) * c[..., None, None] if L0 is not None
                 else torch.zeros_like(pb.M))
        st, passes = _fixed_point_then_newton(pb, start, opts, tol, floor, fp)
        A = G @ st["Q"].to(tall) + W @ (2.0 * st["L"] @ st["Q"]).to(tall)
        return A, passes, st["L"] / c[..., None, None], st["mu2"].sqrt()
    if L0 is not None:
        L0 = L0.to(dtype) * c[..., None, None]  # the scaled W's multiplier
        prior = 0.0 if mu0 is None or mu0.shape != c.shape else float(mu0.max())
        rungs = 1.0 if P is identity and opts.mode == "fast" else WARM_RUNGS
        start, L = min(MU_START, rungs * max(floor, prior)), P(0.5 * (L0 + L0.mT))
    else:
        # fast: a short ladder (its floor is fp32's resolution, ~1e-3..1e-2: three rungs);
        # exact: from MU_START down to fp64's
        start = MU_START if opts.mode == "exact" else min(MU_START, 10.0 * floor)
        L = -0.5 * P(0.5 * (pb.G1 + pb.G1.mT))
    st, passes = newton_solve(pb, L, opts.max_passes, tol, opts.cg_iters, start, floor,
                              polish=opts.mode == "exact")
    A = G @ st["Q"].to(tall) + W @ (2.0 * st["L"] @ st["Q"]).to(tall)
    return A, passes, st["L"] / c[..., None, None], st["mu2"].sqrt()


def _fixed_point_for(pb: GramProblem, P: Projector, square: bool, mode: str
                     ) -> Callable[..., tuple[dict, torch.Tensor]] | None:
    """The fixed-point solver for a ``fast`` tall batch whose W is on its manifold (Stiefel:
    M = I, DGram: M diagonal, to ``M_EYE_TOL``; one host sync), else None (Newton)."""
    if square or mode != "fast":
        return None
    if P is identity and pb.m_is_eye():
        return stiefel_fixed_point
    if P is off and float(torch.linalg.matrix_norm(off(pb.M)).max()) < M_EYE_TOL:
        return dgram_fixed_point
    return None


def _fixed_point_then_newton(pb: GramProblem, L: torch.Tensor, opts: DualOptions,
                             tol: torch.Tensor, floor: float,
                             fp: Callable[..., tuple[dict, torch.Tensor]]
                             ) -> tuple[dict, torch.Tensor]:
    """Tall Stiefel or DGram in ``fast``: the fixed point ``fp`` (unsmoothed, then at the
    floor where it stalls); a matrix it leaves above tol is handed to the Newton ladder from
    its best multiplier with the passes left, and keeps whichever ends lower. Stiefel's fixed
    point may take every pass and Newton's ladder then starts a rung above the floor; DGram's
    takes at most ``DGRAM_FIXED_POINT_PASSES`` and Newton starts on the floor rung."""
    handoff = fp is dgram_fixed_point
    st, passes = fp(pb, L, min(DGRAM_FIXED_POINT_PASSES, opts.max_passes) if handoff
                    else opts.max_passes, tol, floor)
    left = opts.max_passes - int(passes.max())
    open_ = st["res"] >= tol
    if left > 0 and bool(open_.any()):
        nt, more = newton_solve(pb, st["L"], left, tol, opts.cg_iters,
                                floor if handoff else min(MU_START, 10.0 * floor),
                                floor, polish=False)
        take = open_ & (nt["res"] < st["res"])
        st = {k: torch.where(take.reshape(take.shape + (1,) * (v.ndim - take.ndim)), nt[k], v)
              for k, v in st.items() if k in nt}
        passes = passes + torch.where(open_, more, 0)
    return st, passes


def solve_direction(G: torch.Tensor, W: torch.Tensor, P: Projector = identity,
                    opts: DualOptions = DEFAULT_DUAL, L0: torch.Tensor | None = None,
                    msign_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    mu0: torch.Tensor | None = None) -> DualResult:
    """The direction A (..., m, n) for tall G, W (..., m, n) in ``opts.mode``; see the module
    docstring. ``L0`` (..., n, n) and ``mu0`` (...), a previous ``DualResult``'s ``L`` and
    ``mu``, warm-start the multiplier (and its smoothing rung) when the mode does;
    ``msign_fn`` overrides the paper loop's msign (tests)."""
    if W.ndim < 2 or W.shape[-2] < W.shape[-1]:
        raise ValueError(f"expected a tall (..., m, n) matrix with m >= n, got {tuple(W.shape)}")
    if G.shape != W.shape:
        raise ValueError(f"gradient shape {tuple(G.shape)} != weight shape {tuple(W.shape)}")
    if opts.mode == "paper":
        fn = msign_fn or (lambda X: msign(X, method=opts.msign_method, steps=10)
                          if opts.msign_method == "polar_express" else
                          msign(X, method=opts.msign_method))
        L0 = usable_warm_start(L0, W) if opts.warm else None
        A, res, passes, L = paper_ascent(G, W, P, fn, opts.max_passes, opts.lr, opts.stop_tol,
                                         opts.check_every, L0)
        return DualResult(A, res, passes, L, torch.zeros_like(res))
    A, passes, L, mu = _newton(G, W, P, opts, L0, mu0)
    A, res = _restored(W, A, P, true_residual(W, A, P), opts)
    return DualResult(A, res, passes, L, mu)


def _restored(W: torch.Tensor, A: torch.Tensor, P: Projector, res: torch.Tensor,
              opts: DualOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, residual)`` with every matrix the solver left at or above tol replaced by the
    nearest tangent direction in the unit ball (``dual_feasible``: square DGram, whose optimum
    no pass reaches, and any solve that ran out of passes), where that lowers its true
    residual; one host sync. The fast and exact modes only: ``paper`` reports what Paper B's
    loop reaches."""
    open_ = res >= opts.stop_tol
    if not bool(open_.any()):
        return A, res
    batch, (m, n) = res.shape, A.shape[-2:]
    idx = open_.reshape(-1).nonzero().squeeze(-1)
    Wo, Ao = W.reshape(-1, m, n)[idx], A.reshape(-1, m, n)[idx]
    An, _ = restore_feasibility(Wo, Ao, P, mode_dtypes(opts.mode, W.device)[1])
    rn = true_residual(Wo, An, P)
    take = rn < res.reshape(-1)[idx]
    A, res = A.reshape(-1, m, n).clone(), res.reshape(-1).clone()
    A[idx] = torch.where(take[:, None, None], An, Ao)
    res[idx] = torch.where(take, rn, res[idx])
    return A.reshape(batch + (m, n)), res.reshape(batch)
