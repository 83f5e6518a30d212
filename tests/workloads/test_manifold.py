"""Stiefel / DGram dual ascent, tangent projections, retractions and 50 Manifold Muon steps;
docs/science.md §3.2, 3.3, 3.6. fp64 with the SVD msign where the claim is exact math."""

from __future__ import annotations

import functools

import pytest
import torch

from workloads.geometry.dgram import (
    dgram_dualize,
    dgram_retract,
    dgram_tangent_project,
    dgram_violation,
    off,
)
from workloads.geometry.dual import DualOptions
from workloads.geometry.msign import msign
from workloads.geometry.stiefel import (
    stiefel_dualize,
    stiefel_project,
    stiefel_retract,
    stiefel_tangent_project,
    stiefel_violation,
)
from workloads.optim import Muon, manifold_muon_step

svd_msign = functools.partial(msign, method="svd")
F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def on_stiefel(m: int, n: int, seed: int = 0) -> torch.Tensor:
    return stiefel_project(torch.randn(m, n, dtype=F64, generator=gen(seed)))


def on_dgram(m: int, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    d = torch.rand(n, dtype=F64, generator=gen(seed + 100)) * 1.5 + 0.5  # unsorted norms
    return on_stiefel(m, n, seed) * d, d


def spec(A: torch.Tensor) -> float:
    return float(torch.linalg.matrix_norm(A, ord=2))


# --- Stiefel dual ascent ------------------------------------------------------------------


def test_stiefel_square_first_iterate_is_tangent():
    W = on_stiefel(32, 32)
    G = torch.randn(32, 32, dtype=F64, generator=gen(1))
    A, res = stiefel_dualize(G, W, steps=1, msign_fn=svd_msign)
    H = W.mT @ A + A.mT @ W
    assert float(res) < 1e-12 and float(torch.linalg.matrix_norm(H)) < 1e-12
    # fp32 with Polar Express: same, to fp32 / iteration accuracy
    A32, res32 = stiefel_dualize(G.float(), W.float(), steps=1)
    assert float(res32) < 1e-4


@pytest.mark.parametrize(
    ("dualize", "tangent_project", "point"),
    [
        (stiefel_dualize, stiefel_tangent_project, lambda: on_stiefel(48, 16)),
        (dgram_dualize, dgram_tangent_project, lambda: on_dgram(48, 16)[0]),
    ],
    ids=["stiefel", "dgram"],
)
def test_tall_dual_ascent_beats_feasible_point(dualize, tangent_project, point):
    W = point()
    G = torch.randn(48, 16, dtype=F64, generator=gen(2))
    residuals = []
    for K in (1, 20, 100, 500):
        A, res = dualize(G, W, steps=K, lr=0.1, msign_fn=svd_msign)
        residuals.append(float(res))
        assert spec(A) <= 1 + 1e-6
    # falls with the number of steps, to near-tangency
    assert residuals == sorted(residuals, reverse=True) and residuals[-1] < 1e-3
    # a feasible point: the tangent projection of msign(G), scaled to unit spectral norm
    Z = tangent_project(W, svd_msign(G))
    A_hat = Z / spec(Z)
    assert float((G * A).sum()) >= float((G * A_hat).sum())


def test_tangent_projections_are_orthogonal_projections():
    Z = torch.randn(48, 16, dtype=F64, generator=gen(3))
    W = on_stiefel(48, 16)
    P = stiefel_tangent_project(W, Z)
    assert float(torch.linalg.matrix_norm(W.mT @ P + P.mT @ W)) < 1e-12
    Wd, d = on_dgram(48, 16)
    Pd = dgram_tangent_project(Wd, Z)
    assert float(torch.linalg.matrix_norm(off(Wd.mT @ Pd + Pd.mT @ Wd))) < 1e-12
    assert torch.allclose(dgram_tangent_project(Wd, Pd), Pd, atol=1e-12)  # idempotent
    # the residual Z - Pi(Z) is normal: orthogonal to any tangent vector, e.g. W E (E diagonal)
    E = torch.diag(torch.randn(16, dtype=F64, generator=gen(4)))
    assert abs(float(((Z - Pd) * (Wd @ E)).sum())) < 1e-10
    assert abs(float(((Z - Pd) * dgram_tangent_project(Wd, torch.randn_like(Z))).sum())) < 1e-10


# --- retractions --------------------------------------------------------------------------


def test_stiefel_retractions_land_on_manifold():
    W1 = torch.randn(64, 24, dtype=F64, generator=gen(5))
    assert float(stiefel_violation(stiefel_retract(W1, "svd"))) < 1e-6
    assert float(stiefel_violation(stiefel_retract(W1.float()))) < 1e-5  # Polar Express, fp32
    bf16 = msign(W1.float(), dtype=torch.bfloat16)  # the CUDA path's precision
    assert float(stiefel_violation(bf16.double())) < 5e-2


@pytest.mark.parametrize("method", ["paper_svd_sorted", "colnorm_polar"])
def test_dgram_retractions_land_on_manifold(method):
    W1 = torch.randn(64, 24, dtype=F64, generator=gen(6))
    assert float(dgram_violation(dgram_retract(W1, method, msign_method="svd"))) < 1e-6
    assert float(dgram_violation(dgram_retract(W1.float(), method))) < 1e-5


def test_colnorm_polar_is_idempotent_and_first_order():
    W, _ = on_dgram(48, 16, seed=7)
    assert float((dgram_retract(W, "colnorm_polar", "svd") - W).abs().max()) < 1e-12
    assert float((dgram_retract(W, "colnorm_polar") - W).abs().max()) < 1e-10  # PE in fp64
    xi = dgram_tangent_project(W, torch.randn(48, 16, dtype=F64, generator=gen(8)))
    xi = xi / torch.linalg.matrix_norm(xi)
    errs = [float(torch.linalg.matrix_norm(dgram_retract(W + t * xi, "colnorm_polar", "svd")
                                           - W - t * xi)) for t in (1e-2, 1e-3)]
    assert 50 < errs[0] / errs[1] < 200  # O(t^2)


def test_paper_svd_sorted_re_sorts_column_norms():
    """Documented quirk (docs/science.md §3.3): not idempotent; columns come back sorted by norm."""
    W, d = on_dgram(48, 16, seed=9)
    R = dgram_retract(W, "paper_svd_sorted")
    norms = torch.linalg.vector_norm(R, dim=0)
    assert torch.allclose(norms, torch.sort(d, descending=True).values, atol=1e-10)
    assert float((R - W).abs().max()) > 0.1
    # the column directions are kept: R = Q diag(sort_desc d), Q = W diag(1/d)
    assert torch.allclose(R, (W / d) * torch.sort(d, descending=True).values, atol=1e-10)
    assert torch.allclose(dgram_retract(R, "paper_svd_sorted"), R, atol=1e-10)  # sorted: fixed


# --- the step -----------------------------------------------------------------------------


def test_manifold_step_transposes_wide_matrices():
    W = on_stiefel(64, 16, seed=10).mT.float()  # wide 16 x 64, orthonormal rows
    G = torch.randn(16, 64, generator=gen(11))
    W_new, res, passes, disp = manifold_muon_step(W, G, 0.1, "stiefel")
    assert W_new.shape == (16, 64)
    assert float(stiefel_violation(W_new.mT)) < 1e-5  # rows stay orthonormal
    assert res.shape == () and 0 <= float(disp) < 0.1
    assert float(res) < 1e-4 and 1 <= int(passes) <= 20  # the default (fast) mode's tol
    Wd, _ = on_dgram(64, 16, seed=12)
    Wd_new, _, _, _ = manifold_muon_step(Wd.mT.float(), G, 0.1, "dgram")
    assert float(dgram_violation(Wd_new.mT)) < 1e-5  # rows stay mutually orthogonal


CASES = [((64, 32), "stiefel", "paper_svd_sorted"), ((32, 64), "stiefel", "paper_svd_sorted"),
         ((64, 32), "dgram", "paper_svd_sorted"), ((32, 64), "dgram", "colnorm_polar")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("shape", "constraint", "retraction"), CASES)
def test_50_manifold_muon_steps_descend_on_manifold(shape, constraint, retraction):
    m, n = shape
    X = torch.randn(n, 128, generator=gen(13))
    tall = on_stiefel(max(m, n), min(m, n), seed=14).float()
    if constraint == "dgram":
        tall = tall * torch.linspace(0.5, 2.0, min(m, n))
    target = tall if m >= n else tall.mT
    Y = target @ X
    init = on_stiefel(max(m, n), min(m, n), seed=15).float()
    p = torch.nn.Parameter((init if m >= n else init.mT).clone())
    opt = Muon([{"params": [p], "constraint": constraint}], lr=0.05, dgram_retraction=retraction)
    losses = []
    for k in range(50):
        loss = ((p @ X - Y) ** 2).mean()
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.param_groups[0]["lr"] = 0.05 * (1 - k / 50)
        opt.step()
    W = p.detach() if m >= n else p.detach().mT
    violation = stiefel_violation(W) if constraint == "stiefel" else dgram_violation(W)
    assert float(violation) < 1e-3
    assert losses[-1] < 0.9 * losses[0]
    assert float(opt.state[p]["dual_residual"]) < 1e-4  # the default (fast) dual converges
    assert 1 <= int(opt.state[p]["dual_passes"]) <= 20


@pytest.mark.parametrize("constraint", ["stiefel", "dgram"])
def test_muon_warm_starts_the_dual_from_its_state(constraint):
    """Each matrix keeps its multiplier; with the gradient unchanged, step 2 starts next to the
    solution, so it takes fewer passes than the cold step 1 and still meets tol."""
    p = torch.nn.Parameter(on_stiefel(96, 24, seed=16).float())
    p.grad = torch.randn(96, 24, generator=gen(17))
    opt = Muon([{"params": [p], "constraint": constraint}], lr=0.01)
    opt.step()
    lam, cold = opt.state[p]["dual_lambda"], int(opt.state[p]["dual_passes"])
    assert lam.shape == (24, 24) and cold >= 2
    opt.step()
    assert int(opt.state[p]["dual_passes"]) < cold
    assert float(opt.state[p]["dual_residual"]) < 1e-4


def test_paper_mode_muon_ignores_its_stored_multiplier():
    """Paper B starts every step's ascent afresh: a stored multiplier changes nothing."""
    p = torch.nn.Parameter(on_stiefel(48, 16, seed=18).float())
    q = torch.nn.Parameter(p.detach().clone())
    g = torch.randn(48, 16, generator=gen(19))
    paper = DualOptions(mode="paper")
    opts = [Muon([{"params": [x], "constraint": "dgram"}], lr=0.01, dual=paper) for x in (p, q)]
    for x, opt in zip((p, q), opts):
        x.grad = g.clone()
        opt.step()
    opts[1].state[q]["dual_lambda"] = torch.randn(16, 16, generator=gen(20))  # junk
    for x, opt in zip((p, q), opts):
        x.grad = g.clone()
        opt.step()
    assert torch.equal(p, q)


@pytest.mark.parametrize("eta", [1e-4, 1e-2, 0.3, 3.0])
def test_polar_near_is_the_polar_factor(eta):
    """The CPU retraction: coupled Newton-Schulz on the Gram near the manifold, the fp64 Gram
    eigh far from it; both equal the SVD polar factor, in either orientation."""
    from workloads.geometry.stiefel import polar_near

    W = on_stiefel(80, 20, seed=20)
    W1 = W - eta * torch.randn(80, 20, dtype=F64, generator=gen(21)) / 9
    ref = stiefel_retract(W1, "svd")
    assert float((polar_near(W1) - ref).abs().max()) < 1e-12
    assert float((polar_near(W1.mT).mT - ref).abs().max()) < 1e-12
    P32 = polar_near(W1.float())
    assert P32.dtype == torch.float32 and float((P32.double() - ref).abs().max()) < 1e-5
    assert float(stiefel_violation(stiefel_retract(W1.float(), "gram").double())) < 1e-5


def test_gram_retractions_match_svd_ones():
    """paper_svd_sorted via the Gram (U V^T diag(sorted s)) equals the tall-SVD formula."""
    W, _ = on_dgram(48, 16, seed=22)
    W1 = W - 0.05 * torch.randn(48, 16, dtype=F64, generator=gen(23))
    U, S, Vh = torch.linalg.svd(W1, full_matrices=False)
    assert torch.allclose(dgram_retract(W1, "paper_svd_sorted"), (U @ Vh) * S, atol=1e-12)
    assert torch.allclose(dgram_retract(W1, "colnorm_polar", "gram"),
                          dgram_retract(W1, "colnorm_polar", "svd"), atol=1e-12)
