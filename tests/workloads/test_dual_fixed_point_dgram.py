"""Tall DGram's preconditioned fixed point (workloads.geometry.dual_fixed_point_dgram), the
``fast`` mode's path for W on DGram: against the exact Newton solver on the same problem,
with column norms spread (the preconditioner's hard case), and through its Newton handoff;
docs/science.md §3.2.4."""

from __future__ import annotations

import pytest
import torch

import workloads.geometry.dual as dual
import workloads.geometry.dual_fixed_point_dgram as dfd
from workloads.geometry.dual import DualOptions, solve_direction, true_residual
from workloads.geometry.dual_newton import GramProblem, newton_solve, off
from workloads.geometry.msign import msign

F64 = torch.float64


def dgram_problem(m: int, n: int, seed: int, spread: float = 3.0, rank: int = 0,
                  noise: float = 1e-4):
    """W on DGram (orthonormal columns times norms from 1 to ``spread``); G Gaussian, or
    rank ``rank`` plus ``noise`` (near rank-deficient, as real gradients)."""
    g = torch.Generator().manual_seed(seed)
    W = msign(torch.randn(m, n, dtype=F64, generator=g), method="svd")
    W = W * torch.linspace(1.0, spread, n, dtype=F64)
    G = torch.randn(m, n, dtype=F64, generator=g)
    if rank:
        G = (torch.randn(m, rank, dtype=F64, generator=g)
             @ torch.randn(rank, n, dtype=F64, generator=g) + noise * G)
    return G / G.norm(), W / W.norm(dim=-2).max()


def solve_fp(G, W, mu=0.0, steps=80, tol=1e-10):
    pb = GramProblem(G, W, off, F64)
    st, passes = dfd.dgram_fixed_point(pb, torch.zeros_like(pb.M), steps, tol, mu)
    A = G @ st["Q"] + W @ (2.0 * st["L"] @ st["Q"])
    return A, st, passes


@pytest.mark.parametrize("spread", [1.0, 3.0])
def test_full_rank_gradient_reaches_the_exact_optimum(spread):
    """A regular problem: unsmoothed, the fixed point is the optimum the exact Newton mode
    finds (an independent method), its multiplier zero on the diagonal."""
    G, W = dgram_problem(96, 24, 0, spread)
    A, st, passes = solve_fp(G, W, mu=3.5e-4)
    assert float(st["mu2"]) == 0.0
    assert float(st["L"].diagonal().abs().max()) == 0.0
    assert float(true_residual(W, A, off)) < 1e-10
    assert float(torch.linalg.matrix_norm(A, ord=2)) <= 1 + 1e-10
    ref = solve_direction(G, W, off, DualOptions(mode="exact", tol=1e-12, steps=200))
    assert float((A - ref.A).norm() / ref.A.norm()) < 1e-7
    assert int(passes) < 80


@pytest.mark.parametrize("seed", [1, 2])
def test_low_rank_gradient_is_the_newton_solvers_smoothed_optimum(seed):
    mu = 3.5e-4
    G, W = dgram_problem(96, 24, seed, 3.0, rank=2)
    A, st, _ = solve_fp(G, W, mu=mu, tol=1e-9)
    assert float(st["mu2"]) == pytest.approx(mu * mu)
    assert float(true_residual(W, A, off)) < 1e-9
    pb = GramProblem(G, W, off, F64)
    nt, _ = newton_solve(pb, torch.zeros_like(pb.M), 100, 1e-11, 30, mu, mu, polish=False)
    An = G @ nt["Q"] + W @ (2.0 * nt["L"] @ nt["Q"])
    assert float((A - An).norm() / An.norm()) < 1e-5


def test_the_preconditioner_changes_the_speed_not_the_answer(monkeypatch):
    """Q^'s eigh refreshed every pass or every 5: the same fixed point."""
    G, W = dgram_problem(80, 16, 3, 3.0)
    A5, _, _ = solve_fp(G, W)
    monkeypatch.setattr(dfd, "REFRESH", 1)
    A1, _, _ = solve_fp(G, W)
    assert float((A1 - A5).norm() / A5.norm()) < 1e-8


def test_fast_mode_routes_tall_dgram_here_then_newton_and_logs_the_true_residual(monkeypatch):
    """``fast`` on tall W on DGram: fp32 in, the fixed point for at most
    ``DGRAM_FIXED_POINT_PASSES`` passes, then Newton from its multiplier; the reported residual
    is the true one against W, below the mode's tol."""
    G, W = dgram_problem(128, 32, 4, 3.0, rank=3)
    seen = []
    real_fp, real_newton = dual.dgram_fixed_point, dual.newton_solve

    def fp(pb, L, steps, tol, mu):
        seen.append(("fp", steps))
        return real_fp(pb, L, steps, tol, mu)

    def newton(pb, L, steps, tol, cg, start, floor, polish=True):
        seen.append(("newton", start == floor))
        return real_newton(pb, L, steps, tol, cg, start, floor, polish=polish)

    monkeypatch.setattr(dual, "dgram_fixed_point", fp)
    monkeypatch.setattr(dual, "newton_solve", newton)
    monkeypatch.setattr(dual, "DGRAM_FIXED_POINT_PASSES", 2)  # too few: Newton must finish
    r = solve_direction(G.float(), W.float(), off, DualOptions(mode="fast"))
    assert seen[0] == ("fp", 2) and ("newton", True) in seen
    assert r.A.dtype == torch.float32 and int(r.passes) > 2
    true = float(true_residual(W, r.A.double(), off))
    assert float(r.residual) < 1e-4 and abs(float(r.residual) - true) <= 1e-3 * true + 1e-6


@pytest.mark.parametrize("case", ["off_manifold", "square"])
def test_other_dgram_batches_stay_with_newton(monkeypatch, case):
    G, W = dgram_problem(64 if case == "square" else 96, 64 if case == "square" else 24, 5)
    if case == "off_manifold":
        W = W + 0.05 * torch.roll(W, 1, dims=-1)  # columns no longer orthogonal
    monkeypatch.setattr(dual, "dgram_fixed_point", lambda *a, **k: pytest.fail("used"))
    r = solve_direction(G.float(), W.float(), off, DualOptions(mode="fast"))
    true = float(true_residual(W, r.A.double(), off))
    assert abs(float(r.residual) - true) <= 1e-3 * true + 1e-6
