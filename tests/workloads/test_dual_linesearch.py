"""The Newton dual's step-length search (workloads.geometry.dual_newton._newton_pass) on the
near rank-deficient gradients of real training (docs/science.md §3.2): it must not spend an
eigh per backtrack on most passes, and must still reach tol with a tangent unit direction."""

from __future__ import annotations

import pytest
import torch

import workloads.geometry.dual_newton as dn
from workloads.geometry.dual import DualOptions, identity, off, solve_direction, true_residual
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


def mixed_batch(mode: str):
    """A batch of four tall problems of unlike difficulty: two near rank-deficient gradients
    (many passes) and two full-rank ones (a few), in fp32 for ``fast``."""
    dt = F64 if mode == "exact" else torch.float32
    pairs = [low_rank_problem(96, 24, 2, 1e-4, 0), low_rank_problem(96, 24, 24, 0.0, 1),
             low_rank_problem(96, 24, 3, 1e-4, 2), low_rank_problem(96, 24, 24, 0.0, 3)]
    return (torch.stack([g for g, _ in pairs]).to(dt), torch.stack([w for _, w in pairs]).to(dt))


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_passes_on_active_matrices_only_change_nothing_but_the_cost(mode, monkeypatch):
    """A Newton pass (and a backtrack) runs on the matrices still open only: the same passes
    and the same A (to the working dtype's round-off) as the whole batch carried through
    every pass with the solved matrices masked (``_subset`` off), and fewer eigh rows
    (matrices per eigh call, summed) than batch x calls."""
    G, W = mixed_batch(mode)
    # fast solves tall Stiefel by its fixed point (test_dual_fixed_point.py): its Newton
    # passes are DGram's, on the same W (orthonormal columns are on DGram too)
    P = off if mode == "fast" else identity
    opts = DualOptions(mode=mode)
    rows, calls = [], []
    eig = dn.eig_gram

    def counted(N):
        rows.append(N.shape[0])
        calls.append(1)
        return eig(N)

    monkeypatch.setattr(dn, "eig_gram", counted)
    r = solve_direction(G, W, P, opts)
    monkeypatch.setattr(dn, "eig_gram", eig)
    passes = r.passes.tolist()
    assert max(passes) > min(passes)  # unlike difficulty, or the test shows nothing
    assert sum(rows) < 0.8 * 4 * len(calls)
    monkeypatch.setattr(dn, "_subset", lambda mask: None)
    whole = solve_direction(G, W, P, opts)
    assert whole.passes.tolist() == passes
    tol = 1e-9 if mode == "exact" else 1e-4
    assert float((whole.A - r.A).abs().max()) < tol
    # what each matrix of the batch logs is its true residual, recomputed in fp64 against W
    true = true_residual(W.to(F64), r.A.to(F64), P)
    eps = torch.finfo(G.dtype).eps
    assert bool(((r.residual.to(F64) - true).abs() <= 1e-3 * true + 10 * eps).all())
