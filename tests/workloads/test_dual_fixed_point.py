"""Tall Stiefel's fixed-point solver (workloads.geometry.dual_fixed_point), the ``fast`` mode's
path for W on the manifold: against an fp64 SVD certificate, against the Newton solver on the
same (smoothed) problem, and through its fallback; docs/science.md §3.2.3."""

from __future__ import annotations

import pytest
import torch

import workloads.geometry.dual as dual
import workloads.geometry.dual_fixed_point as dfp
from workloads.geometry.dual import DualOptions, solve_direction, true_residual
from workloads.geometry.dual_newton import GramProblem, identity, newton_solve
from workloads.geometry.msign import msign

F64 = torch.float64


def stiefel_problem(m: int, n: int, seed: int, rank: int = 0, noise: float = 1e-4):
    """W with orthonormal columns; G Gaussian, or rank ``rank`` plus ``noise`` (the near
    rank-deficient gradients of real training)."""
    g = torch.Generator().manual_seed(seed)
    W = msign(torch.randn(m, n, dtype=F64, generator=g), method="svd")
    G = torch.randn(m, n, dtype=F64, generator=g)
    if rank:
        G = (torch.randn(m, rank, dtype=F64, generator=g)
             @ torch.randn(rank, n, dtype=F64, generator=g) + noise * G)
    return G / G.norm(), W


def nuclear_gap(G, W, A, L) -> float:
    """(||X||_* - <G, A>) / ||X||_* with X = G + 2 W sym(L), by an fp64 SVD: 0 proves A optimal
    when A is tangent with ||A||_2 <= 1 (no Gram algebra involved)."""
    X = G + 2.0 * W @ (0.5 * (L + L.mT))
    nuc = float(torch.linalg.svdvals(X).sum())
    return (nuc - float((G * A).sum())) / nuc


def solve_fp(G, W, mu=0.0, steps=40, tol=1e-10, L=None):
    pb = GramProblem(G, W, identity, F64)
    L = torch.zeros_like(pb.M) if L is None else L
    st, passes = dfp.stiefel_fixed_point(pb, L, steps, tol, mu)
    A = G @ st["Q"] + W @ (2.0 * st["L"] @ st["Q"])
    return A, st, passes


def test_full_rank_gradient_reaches_the_unsmoothed_optimum():
    G, W = stiefel_problem(96, 24, 0)
    A, st, passes = solve_fp(G, W, mu=3.5e-4)
    assert float(st["mu2"]) == 0.0  # regular: the unsmoothed fixed point, no smoothing
    assert float(true_residual(W, A, identity)) < 1e-10
    assert float(torch.linalg.matrix_norm(A, ord=2)) <= 1 + 1e-10
    assert abs(nuclear_gap(G, W, A, st["L"])) < 1e-10  # fp64 SVD round-off
    assert int(passes) <= 20


def test_the_optimum_is_a_fixed_point_of_the_map():
    """F(S*) = S* at the exact optimum found by the Newton solver (an independent method)."""
    G, W = stiefel_problem(60, 12, 1)
    ref = solve_direction(G, W, identity, DualOptions(mode="exact", tol=1e-12, steps=200))
    pb = GramProblem(G, W, identity, F64)
    st = dfp._state(pb, ref.L, dfp._frame(pb), torch.zeros((), dtype=F64))
    S = 0.5 * (pb.G1 + pb.G1.mT) + 2.0 * ref.L
    assert float((dfp._map(st) - S).norm() / S.norm()) < 1e-9


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_low_rank_gradient_is_the_newton_solvers_smoothed_optimum(seed):
    """Near rank-deficient G: the unsmoothed iteration is not used (or stalls), the smoothed
    problem at mu is solved, and its answer is the one Newton finds at the same mu: tangent,
    within n mu of the objective's optimum (docs/science.md §3.2)."""
    mu = 3.5e-4
    G, W = stiefel_problem(96, 24, seed, rank=2)
    A, st, passes = solve_fp(G, W, mu=mu, tol=1e-9)
    assert float(st["mu2"]) == pytest.approx(mu * mu)
    assert float(true_residual(W, A, identity)) < 1e-9 and int(passes) <= 40
    pb = GramProblem(G, W, identity, F64)
    nt, _ = newton_solve(pb, torch.zeros_like(pb.M), 100, 1e-11, 30, mu, mu, polish=False)
    An = G @ nt["Q"] + W @ (2.0 * nt["L"] @ nt["Q"])
    assert float((A - An).norm() / An.norm()) < 1e-5
    assert 0.0 <= nuclear_gap(G, W, A, st["L"]) <= 24 * mu


def test_batched_matrices_finish_on_their_own_passes():
    pairs = [stiefel_problem(80, 16, 3), stiefel_problem(80, 16, 4, rank=2),
             stiefel_problem(80, 16, 5)]
    G, W = torch.stack([g for g, _ in pairs]), torch.stack([w for _, w in pairs])
    A, st, passes = solve_fp(G, W, mu=3.5e-4, tol=1e-8)
    assert passes.tolist()[1] != passes.tolist()[0]  # unlike difficulty, unlike passes
    for i, (g, w) in enumerate(pairs):
        a, _, p = solve_fp(g, w, mu=3.5e-4, tol=1e-8)
        assert int(p) == int(passes[i])
        assert float((A[i] - a).norm() / a.norm()) < 1e-9


def test_fast_mode_routes_tall_stiefel_here_and_logs_the_true_residual():
    """``fast`` on tall W on the manifold: fp32 in, the fixed point used (one eigh a pass, no
    Newton pass), the reported residual the true one against W, below the mode's tol."""
    G, W = stiefel_problem(128, 32, 6, rank=3)
    calls = []
    real = dual.stiefel_fixed_point

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    dual.stiefel_fixed_point = spy
    try:
        r = solve_direction(G.float(), W.float(), identity, DualOptions(mode="fast"))
    finally:
        dual.stiefel_fixed_point = real
    assert calls and r.A.dtype == torch.float32
    true = float(true_residual(W, r.A.double(), identity))
    assert float(r.residual) < 1e-4 and abs(float(r.residual) - true) <= 1e-3 * true + 1e-6
    assert float(torch.linalg.matrix_norm(r.A.double(), ord=2)) <= 1 + 1e-4


def test_newton_takes_over_where_the_fixed_point_runs_out(monkeypatch):
    """With two fixed-point passes allowed, the matrices left above tol go on with Newton from
    the best multiplier: the mode's tol is still met and the passes count both."""
    G, W = stiefel_problem(96, 24, 7, rank=2)
    real = dfp.stiefel_fixed_point
    monkeypatch.setattr(dual, "stiefel_fixed_point",
                        lambda pb, L, steps, tol, mu: real(pb, L, 2, tol, mu))
    r = solve_direction(G.float(), W.float(), identity, DualOptions(mode="fast"))
    assert float(r.residual) < 1e-4 and int(r.passes) > 2


def test_off_the_manifold_w_goes_to_newton(monkeypatch):
    """The fixed point assumes W^T W = I; a W off it (columns scaled) is Newton's."""
    G, W = stiefel_problem(64, 16, 8)
    W = W * torch.linspace(1.0, 2.0, 16, dtype=F64)
    monkeypatch.setattr(dual, "stiefel_fixed_point", lambda *a, **k: pytest.fail("used"))
    r = solve_direction(G.float(), W.float(), identity, DualOptions(mode="fast"))
    assert float(r.residual) < 1e-4
