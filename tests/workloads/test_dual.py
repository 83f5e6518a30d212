"""The Manifold Muon direction solvers (workloads.geometry.dual, its three modes) against the
raw W and against an optimality certificate that uses no Gram algebra; docs/science.md §3.2-3.3.

The certificate: for a symmetric multiplier L, X = G + 2 W P(L) and a direction A with
||A||_2 <= 1 and P(W^T A + A^T W) = 0, every feasible A' has <G, A'> = <X, A'> <= ||X||_*; so
<G, A> = ||X||_* (nuclear norm from an fp64 SVD) proves that A is the optimum.
"""

from __future__ import annotations

import pytest
import torch

from workloads.config import ManifoldConfig
from workloads.geometry.dual import DualOptions, solve_direction, true_residual
from workloads.geometry.dual_newton import GramProblem, identity, newton_solve, off
from workloads.geometry.dual_paper import paper_ascent
from workloads.geometry.manifolds import MANIFOLDS, get_manifold
from workloads.geometry.msign import msign
from workloads.optim import CONSTRAINTS

F64 = torch.float64
MODES = ("fast", "paper", "exact")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def point(m: int, n: int, seed: int, spread: float = 1.0, low_rank: int = 0):
    """A tall W with orthogonal columns whose norms spread over ``spread`` (log-spaced,
    shuffled), and a gradient G (Gaussian, or rank ``low_rank`` plus 1e-4 noise)."""
    W = msign(torch.randn(m, n, dtype=F64, generator=gen(seed)), method="svd")
    d = torch.logspace(0, torch.log10(torch.tensor(spread)).item(), n, dtype=F64)
    W = W * d[torch.randperm(n, generator=gen(seed + 1))]
    G = torch.randn(m, n, dtype=F64, generator=gen(seed + 2))
    if low_rank:
        G = (torch.randn(m, low_rank, dtype=F64, generator=gen(seed + 3))
             @ torch.randn(low_rank, n, dtype=F64, generator=gen(seed + 4)) + 1e-4 * G)
    return G, W


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def certificate(G, W, P, A, L) -> tuple[float, float, float]:
    """(true residual, ||A||_2 - 1, relative duality gap) of A against W, all fp64 by SVD; L in
    the units of G scaled to ||G||_F = 1 (the Newton modes')."""
    G, W, A, L = (t.to(F64) for t in (G, W, A, L))
    Gn = G / G.norm()
    X = Gn + 2.0 * W @ P(0.5 * (L + L.mT))
    nuc = float(torch.linalg.svdvals(X).sum())
    gap = (nuc - float((Gn * A).sum())) / nuc
    res = float(true_residual(W, A, P))
    return res, float(torch.linalg.matrix_norm(A, ord=2)) - 1.0, gap


def tall(W: torch.Tensor, G: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The solver's tall form: a wide matrix is solved transposed (as the optimizer does)."""
    return (W.mT, G.mT) if W.shape[-2] < W.shape[-1] else (W, G)


# --- what is logged is the true residual ----------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["stiefel", "dgram"])
@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (16, 16)], ids=["tall", "wide", "square"])
def test_reported_residual_is_the_residual_of_A_against_the_raw_W(mode, name, shape):
    """Column norms over 10x (DGram's point; for Stiefel a W off its manifold): whatever the
    mode reaches, the residual it reports is ||P(W^T A + A^T W)||_F / n of the A it returns,
    recomputed here in fp64 against the raw W."""
    m, n = max(shape), min(shape)
    G, W = point(m, n, 3, spread=10.0)
    if shape[0] < shape[1]:
        G, W = G.mT.contiguous(), W.mT.contiguous()
    Wt, Gt = tall(W, G)
    P = MANIFOLDS[name].projector
    dt = F64 if mode == "exact" else torch.float32
    r = solve_direction(Gt.to(dt), Wt.to(dt), P, DualOptions(mode=mode))
    true = float(true_residual(Wt.to(dt).to(F64), r.A.to(F64), P))
    scale = float(Wt.norm(dim=-2).max())  # the residual's own unit (DGram: column norms)
    eps = torch.finfo(dt).eps
    assert abs(float(r.residual) - true) <= 1e-3 * true + 10 * eps * scale
    assert float(torch.linalg.matrix_norm(r.A.to(F64), ord=2)) <= 1 + 1e-4


def test_dgram_enforces_its_own_condition_not_the_unit_column_frames():
    """The defect this replaces: a solver in the frame W~ = W D^-1 enforcing
    Off(W~^T A + A^T W~) = 0 logged ~1e-9 while Off(W^T A + A^T W) was 5e-2..8e-2."""
    G, W = point(48, 16, 5, spread=10.0)
    r = solve_direction(G, W, off, DualOptions(mode="exact"))
    res, over, gap = certificate(G, W, off, r.A, r.L)
    assert res < 1e-6 and over < 1e-9 and gap < 1e-6
    Wf = W / W.norm(dim=-2, keepdim=True)
    frame = float(true_residual(Wf, r.A, off))
    assert frame > 1e-3  # the frame's condition is a different one: A does not satisfy it


# --- exact: the optimum, certified -----------------------------------------------------------


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_exact_is_certified_optimal_and_scale_invariant(name, scale):
    G, W = point(48, 16, 0, spread=3.0 if name == "dgram" else 1.0)
    P = MANIFOLDS[name].projector
    r = solve_direction(G * scale, W, P, DualOptions(mode="exact"))
    res, over, gap = certificate(G, W, P, r.A, r.L)
    assert res < 1e-6 and over < 1e-9 and gap < 1e-6
    assert float(r.mu) == 0.0  # the unsmoothed optimum: no smoothing bias
    ref = solve_direction(G, W, P, DualOptions(mode="exact"))
    assert rel(r.A, ref.A) < 1e-6  # A(c G) = A(G)


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
def test_exact_on_a_low_rank_gradient_reports_the_smoothing_that_bounds_its_gap(name):
    """Real gradients are near rank-deficient (here rank 3 plus 1e-4 noise): the optimum's X
    has near-zero singular values, and the smoothing path ends where fp64 can follow it. The
    direction is then tangent (residual < tol) and its reported smoothing mu bounds how far
    it is from optimal: ||X||_* - <G, A> <= n mu at ||G||_F = 1 (docs/science.md §3.2)."""
    G, W = point(96, 24, 1, spread=2.0 if name == "dgram" else 1.0, low_rank=3)
    P = MANIFOLDS[name].projector
    r = solve_direction(G, W, P, DualOptions(mode="exact"))
    res, over, gap = certificate(G, W, P, r.A, r.L)
    # ||A||_2 - 1 is fp64's eps times cond(X)^2 here (the Gram squares X's condition number)
    assert res < 1e-6 and over < 1e-6 and int(r.passes) < 100
    Gn = G / G.norm()
    nuc = float(torch.linalg.svdvals(Gn + 2.0 * W @ P(0.5 * (r.L + r.L.mT))).sum())
    mu = float(r.mu)
    assert 0.0 <= mu <= 1e-4 and gap * nuc <= 24 * mu + 1e-6


def test_square_stiefel_closed_form_in_one_pass():
    G, W = point(32, 32, 5)
    for mode in ("fast", "exact"):
        dt = F64 if mode == "exact" else torch.float32
        r = solve_direction(G.to(dt), W.to(dt), identity, DualOptions(mode=mode))
        assert int(r.passes) == 1
        assert float(r.residual) < (1e-12 if mode == "exact" else 1e-4)


# --- fast: fp32, the target on regular problems ----------------------------------------------


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
def test_fast_meets_its_tol_and_the_direction_target_on_full_rank_gradients(name):
    G, W = point(96, 24, 7, spread=3.0 if name == "dgram" else 1.0)
    P = MANIFOLDS[name].projector
    ref = solve_direction(G, W, P, DualOptions(mode="exact", tol=1e-10))
    r = solve_direction(G.float(), W.float(), P, DualOptions(mode="fast"))
    assert r.A.dtype == torch.float32 and float(r.residual) < 1e-4
    assert rel(r.A.double(), ref.A) <= 1e-3


def test_batched_equals_per_matrix():
    Gs, Ws = zip(*(point(40, 12, s, spread=3.0) for s in range(3)))
    G, W = torch.stack(Gs), torch.stack(Ws)
    for mode in ("exact", "paper"):
        rb = solve_direction(G, W, off, DualOptions(mode=mode))
        assert rb.passes.shape == (3,) and rb.residual.shape == (3,)
        for i in range(3):
            ri = solve_direction(G[i], W[i], off, DualOptions(mode=mode))
            assert rel(rb.A[i], ri.A) < 1e-6


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
def test_warm_start_from_previous_step_is_cheaper_and_as_good(name):
    """The previous step's multiplier (W moved by 1e-2 A, G perturbed by 1%) warm-starts the
    next solve: fewer passes than cold, the same certified optimum."""
    G, W = point(96, 24, 11, spread=2.0 if name == "dgram" else 1.0)
    M, P = MANIFOLDS[name], MANIFOLDS[name].projector
    opts = DualOptions(mode="exact")
    first = M.dualize(G, W, opts)
    assert first.L is not None and first.L.shape == (24, 24)
    W2 = M.retract(W - 1e-2 * first.A, exact=True)
    G2 = G + 1e-2 * G.norm() / 48 * torch.randn(96, 24, dtype=F64, generator=gen(12))
    cold = M.dualize(G2, W2, opts)
    warm = M.dualize(G2, W2, opts, L0=first.L)
    assert int(warm.passes) < int(cold.passes)
    res, _, gap = certificate(G2, W2, P, warm.A, warm.L)
    assert res < 1e-6 and gap < 1e-6 and rel(warm.A, cold.A) < 1e-5


# --- paper: Paper B's loop, exactly ------------------------------------------------------------


def paper_b_loop(W, G, P, alpha=0.1, steps=20, tol=1e-6):
    """A transcription of Paper B's ``manifold_muon`` direction (one matrix, its break)."""
    L = -0.25 * P(W.mT @ G + G.mT @ W)
    for step in range(steps):
        A = msign(G + 2 * W @ P(0.5 * (L + L.mT)), method="svd")
        H = P(W.mT @ A + A.mT @ W)
        if torch.norm(H) / H.shape[-1] < tol:
            break
        L = L - alpha * (1 - step / steps) * H
    return A


@pytest.mark.parametrize("P,spread,tol", [(off, 2.0, 1e-6), (identity, 1.0, 0.1)],
                         ids=["dgram-no-break", "stiefel-break"])
def test_paper_mode_is_paper_b_loop_per_matrix(P, spread, tol):
    Gs, Ws = zip(*(point(40, 12, s, spread=spread) for s in range(3)))
    G, W = torch.stack(Gs), torch.stack(Ws)
    svd = lambda X: msign(X, method="svd")  # noqa: E731
    A, res, passes, _ = paper_ascent(G, W, P, svd, 20, 0.1, tol, check_every=4)
    for i in range(3):
        assert rel(A[i], paper_b_loop(W[i], G[i], P, tol=tol)) < 1e-12
    assert torch.allclose(res, true_residual(W, A, P), rtol=1e-9, atol=0)
    if tol == 0.1:
        assert int(passes.max()) < 20 and bool((res < tol).all())  # the break, per matrix


def test_paper_mode_starts_fresh_every_step_and_the_warm_variant_does_not():
    G, W = point(40, 12, 21, spread=2.0)
    junk = torch.randn(12, 12, dtype=F64, generator=gen(22))
    paper = DualOptions(mode="paper")
    a = solve_direction(G, W, off, paper)
    b = solve_direction(G, W, off, paper, L0=junk)  # the optimizer's stored multiplier
    assert torch.equal(a.A, b.A)
    warm = solve_direction(G, W, off, DualOptions(mode="paper", warm_start=True), L0=junk)
    assert not torch.equal(a.A, warm.A)


def test_paper_mode_is_not_scale_invariant_the_newton_modes_are():
    """Paper B's alpha is absolute while the optimal multiplier scales with G: a gradient
    1000x smaller stalls its ascent (docs/science.md §3.2); fast and exact solve at ||G|| = 1."""
    G, W = point(48, 16, 3)
    big = solve_direction(G, W, identity, DualOptions(mode="paper"))
    small = solve_direction(G * 1e-3, W, identity, DualOptions(mode="paper"))
    assert float(small.residual) > 10 * float(big.residual)
    f1 = solve_direction(G.float(), W.float(), identity, DualOptions(mode="fast"))
    f2 = solve_direction(G.float() * 1e-3, W.float(), identity, DualOptions(mode="fast"))
    assert rel(f1.A.double(), f2.A.double()) < 1e-4


# --- square DGram: why no unsmoothed pass reaches it ----------------------------------------


def test_square_dgram_optimum_is_not_a_polar_factor():
    """The stated reason square DGram is slow to solve (docs/science.md §3.3): at a square
    W = Q D with unequal column norms the optimal direction has a singular value well below 1,
    so X = G + 2 W L is singular at the optimum and no msign(X) (all singular values 1) is
    it. Measured: the smoothing path ends tangent and near-optimal (small residual and duality
    gap) with sigma_min(A) ~0.74, while unsmoothed Newton passes from the same start stall."""
    G, W = point(12, 12, 2, spread=1.2)
    r = solve_direction(G, W, off, DualOptions(mode="exact", steps=400, tol=1e-5))
    res, over, gap = certificate(G, W, off, r.A, r.L)
    assert res < 5e-5 and over < 1e-9 and 0 <= gap < 2e-4
    assert float(torch.linalg.svdvals(r.A)[-1]) < 0.9 and float(r.mu) > 0.0
    c = float(W.norm(dim=-2).max())
    pb = GramProblem(G / G.norm(), W / c, off, F64)
    st, _ = newton_solve(pb, -0.5 * off(0.5 * (pb.G1 + pb.G1.mT)), 100, 1e-5, 30, start=0.0)
    assert float(st["res"]) * c > 1e-3  # unsmoothed: 100 passes and still 100x away


# --- registry and config -----------------------------------------------------------------------


def test_registry_drives_choices_and_rejects_unknown():
    assert CONSTRAINTS == tuple(MANIFOLDS) == ("none", "stiefel", "dgram")
    with pytest.raises(ValueError, match="is not one of none, stiefel, dgram"):
        get_manifold("oblique")
    with pytest.raises(ValueError, match="dual mode 'newton' is not one of fast, paper, exact"):
        DualOptions(mode="newton")


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
def test_registry_objects_project_retract_tangent(name):
    M = MANIFOLDS[name]
    Z = torch.randn(30, 10, dtype=F64, generator=gen(7))
    W = M.project(Z)
    assert float(M.violation(W)) < 1e-10
    assert float(M.violation(M.retract(W + 1e-3 * Z, exact=True))) < 1e-10
    T = M.tangent_project(W, Z)
    H = M.projector(W.mT @ T + T.mT @ W)
    assert float(H.norm()) < 1e-10
    r = M.dualize(Z, W)
    assert float(r.residual) < 1e-4


def test_none_is_plain_muon():
    G = torch.randn(20, 8, dtype=F64, generator=gen(8))
    r = MANIFOLDS["none"].dualize(G, G, DualOptions(msign_method="svd"))
    assert rel(r.A, msign(G, method="svd")) < 1e-12 and int(r.passes) == 0


def test_config_defaults_are_the_modes_own():
    c = ManifoldConfig()
    assert c.dual_mode == "fast" and c.dual_tol is None and c.dual_steps is None
    assert c.dual_warm_start is None
    assert DualOptions(mode="fast").stop_tol == 1e-4 and DualOptions(mode="fast").warm
    assert DualOptions(mode="paper").stop_tol == 1e-6 and not DualOptions(mode="paper").warm
    assert DualOptions(mode="exact").max_passes == 100
    assert DualOptions(mode="fast", tol=1e-5, steps=7).stop_tol == 1e-5
    assert DualOptions(mode="fast", tol=1e-5, steps=7).max_passes == 7
