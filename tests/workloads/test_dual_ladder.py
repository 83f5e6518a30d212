"""The smoothing ladder of the Newton dual (workloads.geometry.dual_newton.mu_ladder) on square
DGram problems, whose optimum has a (near-)zero singular value; docs/science.md §3.3."""

from __future__ import annotations

import pytest
import torch

from workloads.geometry.dual import dual_ascent
from workloads.geometry.dual_newton import mu_ladder, off
from workloads.geometry.manifolds import MANIFOLDS, DualOptions
from workloads.geometry.msign import msign

F64 = torch.float64


def square_dgram(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A point on DGram (orthogonal columns, norms in [0.5, 2]) and a Gaussian gradient of the
    optimizer's scale (1e-2), as the benchmark's 128 x 128 attention projections."""
    g = torch.Generator().manual_seed(seed)
    W = msign(torch.randn(n, n, dtype=F64, generator=g), method="svd")
    W = W * (torch.rand(n, dtype=F64, generator=g) * 1.5 + 0.5)
    return torch.randn(n, n, dtype=F64, generator=g) * 1e-2, W


def test_mu_ladder_rungs():
    assert mu_ladder(1e-3, 0.1) == pytest.approx([1e-3 * 10 ** (k / 2) for k in range(4, -1, -1)])
    assert mu_ladder(0.0, 0.1) == [0.0] and mu_ladder(0.5, 0.1) == [0.5]


@pytest.mark.parametrize("n,seed,bound", [(32, 0, 1e-4), (128, 2, 3e-6)])
def test_square_dgram_dual_reaches_tol_and_is_a_tangent_unit_direction(n, seed, bound):
    """Measured on these inputs in 20 passes: 1.4e-5 (n = 32) and 6.4e-7 (n = 128); without
    the ladder 8.6e-5 and 1.0e-5 (the n = 128 bound fails then), on gpt-tiny's own 128 x 128
    matrices up to 1e-2."""
    G, W = square_dgram(n, seed)
    r = MANIFOLDS["dgram"].dualize(G, W, DualOptions())
    assert float(r.residual) <= bound and int(r.passes) <= 20
    Wf = W / W.norm(dim=-2, keepdim=True)
    # the residual is the real constraint violation of A (not only the Gram algebra's)
    H = off(Wf.mT @ r.A + r.A.mT @ Wf)
    assert float(torch.linalg.matrix_norm(H)) / n <= bound
    assert float(torch.linalg.matrix_norm(r.A, ord=2)) <= 1 + 1e-9
    # at least as good as the tangent-projected msign, the obvious feasible competitor
    # (scaled to unit spectral norm)
    T = msign(G, method="svd")
    d2 = (W * W).sum(-2)
    S = off(W.mT @ T + T.mT @ W) / (d2.unsqueeze(-1) + d2.unsqueeze(-2))
    T = T - W @ S
    T = T / torch.linalg.matrix_norm(T, ord=2)
    assert float((G * r.A).sum()) >= float((G * T).sum())


def test_tall_problems_keep_one_rung():
    """Tall W: the ladder is not used (it doubled the passes there); cold start as before."""
    g = torch.Generator().manual_seed(3)
    W = msign(torch.randn(96, 24, dtype=F64, generator=g), method="svd")
    G = torch.randn(96, 24, dtype=F64, generator=g)
    r = dual_ascent(G, W, off, smooth=1e-3)
    assert float(r.residual) < 1e-6 and int(r.passes) <= 6
