"""Feasibility restoration (workloads.geometry.dual_feasible) and its use by the direction
solver: a direction left above tol is replaced by the nearest tangent one in the unit ball,
checked against a dense least-squares projection and an fp64 certificate."""

from __future__ import annotations

import pytest
import torch

from workloads.geometry.dual import DualOptions, solve_direction, true_residual
from workloads.geometry.dual_feasible import restore_feasibility
from workloads.geometry.dual_newton import identity, off
from workloads.geometry.msign import msign

F64 = torch.float64
P_OF = {"stiefel": identity, "dgram": off}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def weight(m: int, n: int, seed: int, spread: float, off_manifold: float = 0.0) -> torch.Tensor:
    """Orthogonal columns with norms log-spread over ``spread``, plus ``off_manifold`` noise."""
    W = msign(torch.randn(m, n, dtype=F64, generator=gen(seed)), method="svd")
    W = W * torch.logspace(0, torch.log10(torch.tensor(spread)).item(), n, dtype=F64)
    return W + off_manifold * torch.randn(m, n, dtype=F64, generator=gen(seed + 1))


def dense_projection(W: torch.Tensor, A: torch.Tensor, P) -> torch.Tensor:
    """The nearest A' with P(W^T A' + A'^T W) = 0, by least squares on the vectorised
    constraint (every entry of P's output as a row)."""
    m, n = A.shape
    basis = torch.eye(m * n, dtype=F64).reshape(m * n, m, n)
    C = torch.stack([P(W.mT @ E + E.mT @ W).reshape(-1) for E in basis], dim=1)
    a = A.reshape(-1)
    return (a - torch.linalg.pinv(C) @ (C @ a)).reshape(m, n)  # minus its part in C's row space


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
@pytest.mark.parametrize("case", ["on_manifold", "off_manifold", "square"])
def test_restored_direction_is_the_nearest_tangent_one_scaled_into_the_ball(name, case):
    m, n = (6, 6) if case == "square" else (9, 5)
    W = weight(m, n, 1, spread=10.0 if name == "dgram" else 1.0,
               off_manifold=0.2 if case == "off_manifold" else 0.0)
    A = torch.randn(m, n, dtype=F64, generator=gen(2))
    A = A / torch.linalg.matrix_norm(A, ord=2)
    P = P_OF[name]
    An, s = restore_feasibility(W, A, P, F64)
    ref = dense_projection(W, A, P)
    assert float(true_residual(W, ref, P)) < 1e-12  # the reference is tangent
    assert float((An * s.clamp_min(1.0) - ref).norm() / ref.norm()) < 1e-10
    assert abs(float(s) - float(torch.linalg.matrix_norm(ref, ord=2))) < 1e-10
    assert float(true_residual(W, An, P)) < 1e-12
    assert float(torch.linalg.matrix_norm(An, ord=2)) <= 1.0 + 1e-12


def test_a_tangent_direction_in_the_ball_is_left_as_it_is():
    W = weight(9, 5, 3, spread=5.0)
    A0 = torch.randn(9, 5, dtype=F64, generator=gen(4))
    T, _ = restore_feasibility(W, A0, off, F64)  # tangent, ||T||_2 <= 1
    T2, s = restore_feasibility(W, 0.5 * T, off, F64)
    assert float((T2 - 0.5 * T).norm()) < 1e-12 and float(s) <= 0.5 + 1e-12


def test_batched_and_fp32_input_keep_their_shape_and_dtype():
    W = torch.stack([weight(8, 8, k, spread=3.0) for k in range(3)]).float()
    A = torch.randn(3, 8, 8, generator=gen(5))
    An, s = restore_feasibility(W, A, off, F64)
    assert An.shape == A.shape and An.dtype == torch.float32 and s.shape == (3,)
    assert float(true_residual(W.double(), An.double(), off).max()) < 1e-6


# --- in the solver -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
def test_a_solve_out_of_passes_still_returns_a_tangent_direction_at_its_true_residual(name):
    """Three passes do not reach tol here; the direction returned is restored: its logged
    residual is its true one and below tol, ||A||_2 <= 1, and it is as good in the objective
    as the unrestored one to within the residual it removed."""
    G = torch.randn(24, 8, dtype=F64, generator=gen(6))
    W = weight(24, 8, 7, spread=10.0 if name == "dgram" else 1.0)
    P = P_OF[name]
    opts = DualOptions(mode="exact", steps=3, tol=1e-10)
    r = solve_direction(G, W, P, opts)
    true = float(true_residual(W, r.A, P))
    assert abs(float(r.residual) - true) < 1e-14 and true < 1e-10
    assert float(torch.linalg.matrix_norm(r.A, ord=2)) <= 1.0 + 1e-12
    best = solve_direction(G, W, P, DualOptions(mode="exact"))
    Gn = G / G.norm()
    assert float((Gn * r.A).sum()) <= float((Gn * best.A).sum()) + 1e-9  # feasible: not above


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_square_dgram_meets_the_tolerance(mode):
    """Square DGram, whose optimum no unsmoothed pass reaches (test_dual.py): the direction the
    solver applies meets the mode's tol against the raw W, with ||A||_2 <= 1 (to the working
    dtype), on a near rank-deficient gradient and column norms over 3x."""
    n = 16
    W = weight(n, n, 8, spread=3.0)
    G = (torch.randn(n, 3, dtype=F64, generator=gen(9)) @ torch.randn(3, n, dtype=F64,
                                                                     generator=gen(10))
         + 1e-3 * torch.randn(n, n, dtype=F64, generator=gen(11)))
    dt = F64 if mode == "exact" else torch.float32
    opts = DualOptions(mode=mode)
    r = solve_direction(G.to(dt), W.to(dt), off, opts)
    true = float(true_residual(W, r.A.to(F64), off))
    assert true < opts.stop_tol and abs(float(r.residual) - true) < 10 * torch.finfo(dt).eps
    assert float(torch.linalg.matrix_norm(r.A.to(F64), ord=2)) <= 1.0 + 10 * torch.finfo(dt).eps


def test_paper_mode_is_not_restored():
    """``paper`` reports what Paper B's loop reaches, above tol included."""
    G = torch.randn(24, 8, dtype=F64, generator=gen(12))
    W = weight(24, 8, 13, spread=3.0)
    r = solve_direction(G.float(), W.float(), off, DualOptions(mode="paper", steps=2))
    assert float(r.residual) > 1e-3
