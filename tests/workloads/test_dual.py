"""The dual ascent (workloads.geometry.dual) and the MANIFOLDS registry against an fp64 reference;
docs/science.md §3.2-3.3. The reference is the newton method run to 1e-12 without smoothing."""

from __future__ import annotations

import functools

import pytest
import torch

from workloads.config import ManifoldConfig
from workloads.geometry.dgram import off
from workloads.geometry.dual import dual_ascent, gram_msign, identity
from workloads.geometry.dual_newton import GramProblem
from workloads.geometry.manifolds import MANIFOLDS, DualOptions, get_manifold
from workloads.geometry.msign import msign
from workloads.optim import CONSTRAINTS

F64 = torch.float64
svd_msign = functools.partial(msign, method="svd")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def problem(m: int, n: int, seed: int, dgram: bool, scale: float = 1.0):
    W = msign(torch.randn(m, n, dtype=F64, generator=gen(seed)), method="svd")
    if dgram:
        W = W * (torch.rand(n, dtype=F64, generator=gen(seed + 1)) * 1.5 + 0.5)
    G = torch.randn(m, n, dtype=F64, generator=gen(seed + 2)) * scale
    return G, W


def reference(G, W, P):
    """fp64, exact msign, no smoothing, solved to 1e-12: the direction problem's solution."""
    Wf = W / W.norm(dim=-2, keepdim=True)
    r = dual_ascent(G, Wf, P, "newton", steps=200, tol=1e-12, smooth=0.0, cg_iters=30)
    assert float(r.residual.max()) < 1e-11
    # independent of the Gram algebra: A is the SVD polar factor of G + 2 W~ L and tangent
    X = G / torch.linalg.matrix_norm(G)[..., None, None] + 2.0 * Wf @ r.L
    assert rel(r.A, msign(X, method="svd")) < 1e-9
    assert float(torch.linalg.matrix_norm(P(Wf.mT @ r.A + r.A.mT @ Wf)).max()) < 1e-9
    return r.A


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_newton_reaches_tol_and_matches_reference_at_any_scale(name, scale):
    G, W = problem(48, 16, 0, name == "dgram", scale)
    P = MANIFOLDS[name].projector
    ref = reference(G, W, P)
    r = MANIFOLDS[name].dualize(G, W, DualOptions(smooth=0.0))
    assert float(r.residual) < 1e-6 and int(r.passes) <= 20
    assert rel(r.A, ref) < 1e-5
    assert float(torch.linalg.matrix_norm(r.A, ord=2)) <= 1 + 1e-9
    # default smoothing (mu = 1e-3 at ||G||_F = 1) converges too and stays close
    rs = MANIFOLDS[name].dualize(G, W, DualOptions())
    assert float(rs.residual) < 1e-6 and rel(rs.A, ref) < 3e-2


def test_gradient_variants_relative_is_scale_invariant_absolute_is_not():
    G, W = problem(48, 16, 3, False)
    ref = reference(G, W, identity)
    errs = {}
    for method in ("relative", "absolute"):
        for scale in (1e-3, 1.0):
            r = dual_ascent(G * scale, W, identity, method, steps=200, lr=0.1, tol=1e-6,
                            msign_fn=svd_msign)
            errs[method, scale] = (rel(r.A, ref), float(r.residual), int(r.passes))
    # relative: same result at both scales, converged; absolute: the tiny gradient stalls
    assert abs(errs["relative", 1e-3][0] - errs["relative", 1.0][0]) < 1e-9
    assert errs["relative", 1.0][0] < 1e-2 and errs["relative", 1.0][1] < 1e-4
    assert errs["absolute", 1.0][0] < 1e-2
    assert errs["absolute", 1e-3][0] > 10 * errs["absolute", 1.0][0]


def test_square_stiefel_exact_at_first_pass():
    G, W = problem(32, 32, 5, False)
    for method in ("newton", "relative", "absolute"):
        r = dual_ascent(G, W, identity, method, msign_fn=svd_msign)
        assert float(r.residual) < 1e-9 and int(r.passes) == 1


def test_batched_equals_per_matrix():
    Gs, Ws = zip(*(problem(40, 12, s, True) for s in range(3)))
    G, W = torch.stack(Gs), torch.stack(Ws)
    Wf = W / W.norm(dim=-2, keepdim=True)
    rb = dual_ascent(G, Wf, off, steps=20)
    for i in range(3):
        ri = dual_ascent(G[i], Wf[i], off, steps=20)
        assert rel(rb.A[i], ri.A) < 1e-6 and float(rb.residual[i]) < 1e-6
    assert rb.passes.shape == (3,)
    X = torch.randn(4, 50, 10, dtype=F64, generator=gen(9))
    assert rel(gram_msign(X), msign(X, method="svd")) < 1e-10
    assert all(rel(gram_msign(X)[i], msign(X[i], method="svd")) < 1e-10 for i in range(4))


def test_registry_drives_choices_and_rejects_unknown():
    assert CONSTRAINTS == tuple(MANIFOLDS) == ("none", "stiefel", "dgram")
    with pytest.raises(ValueError, match="is not one of none, stiefel, dgram"):
        get_manifold("oblique")


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
    assert float(r.residual) < 1e-6


def test_none_is_plain_muon():
    G = torch.randn(20, 8, dtype=F64, generator=gen(8))
    r = MANIFOLDS["none"].dualize(G, G, DualOptions(msign_method="svd"))
    assert rel(r.A, msign(G, method="svd")) < 1e-12 and int(r.passes) == 0


def test_config_defaults():
    c = ManifoldConfig()
    assert c.dual_tol == 1e-6 and c.dual_method == "newton" and c.dual_smooth == 1e-3


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
def test_warm_start_from_previous_step_is_cheaper_and_exact(name):
    """The previous step's multiplier (W moved by 1e-2 A, G perturbed by 1%) warm-starts the
    next dual: fewer passes than cold, same converged direction as the fp64 reference."""
    G, W = problem(96, 24, 11, name == "dgram")
    M, P = MANIFOLDS[name], MANIFOLDS[name].projector
    first = M.dualize(G, W, DualOptions(smooth=0.0))
    assert first.L is not None and first.L.shape == (24, 24)
    W2 = M.retract(W - 1e-2 * first.A, exact=True)
    G2 = G + 1e-2 * G.norm() / 48 * torch.randn(96, 24, dtype=F64, generator=gen(12))
    ref = reference(G2, W2, P)
    cold = M.dualize(G2, W2, DualOptions(smooth=0.0))
    warm = M.dualize(G2, W2, DualOptions(smooth=0.0), L0=first.L)
    assert float(warm.residual) < 1e-6 and rel(warm.A, ref) < 1e-5
    assert int(warm.passes) < int(cold.passes)


def test_warm_start_ignored_for_square_and_shape_change():
    G, W = problem(16, 16, 13, False)
    junk = torch.randn(16, 16, dtype=F64, generator=gen(14))
    r = dual_ascent(G, W, identity, L0=junk)  # square: the exact cold start wins
    assert float(r.residual) < 1e-9 and int(r.passes) == 1
    G, W = problem(40, 10, 15, False)
    r = dual_ascent(G, W, identity, L0=torch.zeros(12, 12, dtype=F64))
    assert float(r.residual) < 1e-6


def test_fp32_inputs_meet_tol_like_fp64():
    """fp32 G, W (the optimizer's case): the Grams are formed in fp64, so the same passes and
    the reference direction to fp32 round-off (fp32 Grams would leave ~1e-5)."""
    G, W = problem(96, 24, 24, False)
    ref = reference(G, W, identity)
    r32 = MANIFOLDS["stiefel"].dualize(G.float(), W.float(), DualOptions(smooth=0.0))
    assert r32.A.dtype == torch.float32 and float(r32.residual) < 1e-6
    assert rel(r32.A.double(), ref) < 1e-5


def test_square_stiefel_off_manifold_falls_back_to_smoothed_newton():
    G, W = problem(24, 24, 25, False)
    r = dual_ascent(G, W, identity, smooth=1e-3)
    assert float(r.residual) < 1e-9 and int(r.passes) == 1  # on the manifold: exact pass
    W2 = W * torch.linspace(0.5, 1.5, 24, dtype=F64)  # columns rescaled: off Stiefel
    pb = GramProblem(G / G.norm(), W2, identity, 1e-3)
    first = float(pb.state(-0.25 * (pb.G1 + pb.G1.mT))["res"])  # the cold start
    r2 = dual_ascent(G, W2, identity, smooth=1e-3)  # the closed form does not hold: Newton
    assert int(r2.passes) > 1 and float(r2.residual) < first
