"""The Newton dual's step-length search (workloads.geometry.dual_newton._newton_pass) on the
near rank-deficient gradients of real training (docs/science.md §3.2): it must not spend an
eigh per backtrack on most passes, and must still reach tol with a tangent unit direction."""

from __future__ import annotations

import pytest
import torch

import workloads.geometry.dual_newton as dn
from workloads.geometry.dual import DualOptions, identity, solve_direction
from workloads.geometry.msign import msign

F64 = torch.float64


def low_rank_problem(m: int, n: int, rank: int, noise: float, seed: int):
    """Stiefel W and a rank-``rank`` gradient plus ``noise``: X = G + 2 W Lambda then has
    singular values ~mu at the optimum, as on gpt-debug's c_attn (sigma_min(G) ~ 5e-5)."""
    g = torch.Generator().manual_seed(seed)
    W = msign(torch.randn(m, n, dtype=F64, generator=g), method="svd")
    G = (torch.randn(m, rank, dtype=F64, generator=g) @ torch.randn(rank, n, dtype=F64, generator=g)
         + noise * torch.randn(m, n, dtype=F64, generator=g))
    return G, W


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_low_rank_gradient_few_backtracks_and_converged(seed, monkeypatch):
    """The line search's evaluations (one eigh each) per Newton pass stay near one: plain
    halving from t = 1 took 41, 16, 29 eighs for 13, 8, 11 passes on these inputs."""
    G, W = low_rank_problem(96, 24, 2, 1e-4, seed)
    evals, steps = [], []
    state, newton_pass = dn.GramProblem.state, dn._newton_pass

    def counted_pass(pb, st, active, cg):
        steps.append(1)
        monkeypatch.setattr(dn.GramProblem, "state",
                            lambda pb, L: evals.append(1) or state(pb, L))
        try:
            return newton_pass(pb, st, active, cg)
        finally:
            monkeypatch.setattr(dn.GramProblem, "state", state)

    monkeypatch.setattr(dn, "_newton_pass", counted_pass)
    r = solve_direction(G, W, identity, DualOptions(mode="exact", steps=40, tol=1e-6))
    assert float(r.residual) < 1e-6 and int(r.passes) < 40
    assert len(evals) <= 1.5 * len(steps) + 2
    # independent of the Gram algebra: the tall A is tangent and has unit spectral norm
    H = W.mT @ r.A + r.A.mT @ W
    assert float(torch.linalg.matrix_norm(H)) / 24 < 1e-6
    # (1e-6: fp64's eps times cond(X)^2 on a near rank-deficient X, through its Gram)
    assert float(torch.linalg.matrix_norm(r.A, ord=2)) <= 1 + 1e-6
