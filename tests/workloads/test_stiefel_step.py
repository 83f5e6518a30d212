"""The Gram-space Stiefel step (direction + retraction from the Grams), the near-identity inverse
square root it uses, and the square closed form on a re-orthogonalised W; docs/science.md §3.2.
References: fp64 SVD polar factors, independent of the Gram algebra."""

from __future__ import annotations

import pytest
import torch

from workloads.geometry.dual import dual_ascent, identity
from workloads.geometry.gram_sqrt import inv_sqrt_near
from workloads.geometry.manifolds import MANIFOLDS, DualOptions, Manifold
from workloads.geometry.msign import msign
from workloads.geometry.stiefel import stiefel_violation
from workloads.geometry.stiefel_step import stiefel_gram_step

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def svd_polar(X: torch.Tensor) -> torch.Tensor:
    return msign(X.to(F64), method="svd")


def problem(shape: tuple[int, ...], seed: int, low_rank: int = 0):
    W = svd_polar(torch.randn(*shape, dtype=F64, generator=gen(seed)))
    G = torch.randn(*shape, dtype=F64, generator=gen(seed + 1))
    if low_rank:  # ill-conditioned: a rank-k gradient plus 1e-3 noise
        U = torch.randn(*shape[:-1], low_rank, dtype=F64, generator=gen(seed + 2))
        V = torch.randn(*shape[:-2], low_rank, shape[-1], dtype=F64, generator=gen(seed + 3))
        G = U @ V + 1e-3 * G
    return G, W


def reference_step(G, W, lr, opts):
    """The unfused path: the dual's A, W1 = W - lr A, the SVD polar factor of W1."""
    dual = MANIFOLDS["stiefel"].dualize(G, W, opts)
    W1 = (W - lr * dual.A).to(F64)
    W2 = svd_polar(W1)
    return W2, dual, float(torch.linalg.matrix_norm(W2 - W1).max() / W1.norm())


@pytest.mark.parametrize("shape,low_rank", [((3, 40, 12), 0), ((2, 64, 16), 2), ((2, 24, 24), 0),
                                            ((20, 20), 3), ((96, 8), 0)])
@pytest.mark.parametrize("lr", [1e-3, 0.05, 1.0])
def test_gram_step_equals_dual_then_svd_retraction_fp64(shape, low_rank, lr):
    G, W = problem(shape, 7, low_rank)
    opts = DualOptions()
    W2, res, passes, disp, L = stiefel_gram_step(W, G, lr, opts.steps, opts.tol, opts.cg_iters,
                                                 opts.smooth)
    ref, dual, ref_disp = reference_step(G, W, lr, opts)
    # the Gram route expands W1 = G a + W b, a = -lr Q: round-off grows with lr ||Q||_2, i.e.
    # with cond(X) (~1e4 for the rank-3 square case), hence 1e-8 rather than 1e-12
    assert float((W2 - ref).abs().max()) < 1e-8
    assert torch.equal(passes, dual.passes) and float(res.max()) < 1e-6
    assert torch.allclose(L, dual.L, atol=1e-12)
    assert float(stiefel_violation(W2).max()) < 1e-10
    if len(shape) == 2:
        assert abs(float(disp) - ref_disp) < 1e-10


@pytest.mark.parametrize("shape", [(4, 96, 24), (2, 32, 32)])
def test_gram_step_fp32_matches_fp64_reference(shape):
    """The optimizer's case: fp32 W, G; fp64 Grams, fp32 tall products at the end."""
    G, W = problem(shape, 9)
    W32, G32 = W.float(), G.float()
    opts = DualOptions()
    W2, res, *_ = stiefel_gram_step(W32, G32, 0.05, opts.steps, opts.tol, opts.cg_iters,
                                    opts.smooth)
    ref, _, _ = reference_step(G32.double(), W32.double(), 0.05, opts)
    assert W2.dtype == torch.float32 and float(res.max()) < 1e-6
    assert float((W2.double() - ref).abs().max()) < 1e-5
    assert float(stiefel_violation(W2.double()).max()) < 1e-5


def test_manifold_step_dispatches_to_the_gram_step_on_cpu_newton_only():
    """Stiefel.step fuses only for the newton dual with the inexact (CPU Gram) retraction; the
    other cases take the generic dualize-then-retract path, with the same answer."""
    G, W = problem((48, 12), 11)
    st, opts = MANIFOLDS["stiefel"], DualOptions()
    fused = st.step(W, G, 0.1, opts)
    generic = Manifold.step(st, W, G, 0.1, opts)
    for a, b in zip(fused[:4], generic[:4]):
        assert torch.allclose(a.to(F64), b.to(F64), atol=1e-10)
    exact = st.step(W, G, 0.1, opts, exact=True)
    assert torch.allclose(exact[0], generic[0], atol=1e-10)


@pytest.mark.parametrize("err", [1e-7, 1e-3, 0.05, 0.3, 0.45, 0.6, 0.9])
@pytest.mark.parametrize("scale", [1.0, 1.3])
def test_inv_sqrt_near_matches_eigh_near_and_far(err, scale):
    """With E = N / (tr N / n) - I: the binomial series (||E|| small), Newton-Schulz (up to
    NEAR = 0.5) and eigh (above) all give N^{-1/2} to fp64 round-off."""
    n = 20
    E = torch.randn(3, n, n, dtype=F64, generator=gen(13))
    E = E + E.mT
    E = err * E / torch.linalg.matrix_norm(E)[..., None, None]  # ||N - I||_F = err
    E = E - torch.diag_embed(E.diagonal(dim1=-2, dim2=-1).mean(-1, keepdim=True).expand(3, n))
    N = scale * (torch.eye(n, dtype=F64) + E)  # tr N / n = scale, ||N / scale - I||_F ~ err
    e, V = torch.linalg.eigh(N)
    ref = (V * e.rsqrt().unsqueeze(-2)) @ V.mT
    Z = inv_sqrt_near(N)
    assert float((Z - ref).abs().max()) < 1e-12
    assert float((Z @ N @ Z - torch.eye(n, dtype=F64)).abs().max()) < 1e-12


def test_inv_sqrt_near_meets_a_loose_tol_with_fewer_terms():
    """The retraction asks for fp32 accuracy only: a lower-degree series, still to tol."""
    n = 32
    E = torch.randn(2, n, n, dtype=F64, generator=gen(15))
    E = 1e-3 * (E + E.mT) / torch.linalg.matrix_norm(E + E.mT)[..., None, None]
    N = 1.0004 * torch.eye(n, dtype=F64) + E
    e, V = torch.linalg.eigh(N)
    ref = (V * e.rsqrt().unsqueeze(-2)) @ V.mT
    err = float((inv_sqrt_near(N, 4 * torch.finfo(torch.float32).eps) - ref).abs().max())
    assert 1e-15 < err < 5e-7


def test_inv_sqrt_near_ill_conditioned_and_rank_deficient():
    n = 16
    U = svd_polar(torch.randn(n, n, dtype=F64, generator=gen(14)))
    e = torch.logspace(-10, 0, n, dtype=F64)
    N = (U * e) @ U.mT
    Z = inv_sqrt_near(N)
    assert float((Z @ N @ Z - torch.eye(n, dtype=F64)).norm()) < 1e-5 * n
    e = torch.cat([torch.zeros(3, dtype=F64), torch.logspace(-4, 0, n - 3, dtype=F64)])
    Z0 = inv_sqrt_near((U * e) @ U.mT)  # rank n - 3: the null space maps to 0, the rest exact
    assert float((Z0 @ U[:, :3]).abs().max()) < 1e-9
    ref = (U[:, 3:] * e[3:].rsqrt()) @ U[:, 3:].mT
    assert float((Z0 - ref).abs().max() / ref.abs().max()) < 1e-9


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_square_stiefel_fp32_w_is_exact_against_its_polar_factor(seed):
    """An fp32-orthogonal square W (||W^T W - I|| ~ 1e-6): the closed form on the fp64 polar
    factor W_o gives A = W_o msign(skew(W_o^T G)) (fp64 SVD reference) in one pass, and its
    tangent residual against the given W stays far below tol (2e-8 vs 1e-6 at n = 64)."""
    n = 64
    W32 = torch.linalg.qr(torch.randn(n, n, generator=gen(seed)))[0]
    G = torch.randn(n, n, dtype=F64, generator=gen(seed + 10))
    W = W32.double()
    r = dual_ascent(G, W, identity)
    Wo = svd_polar(W)
    S = Wo.mT @ G
    ref = Wo @ svd_polar(0.5 * (S - S.mT))
    assert int(r.passes) == 1 and float(r.residual) < 1e-7
    assert float((r.A - ref).norm() / ref.norm()) < 1e-6
    H = W.mT @ r.A + r.A.mT @ W
    assert abs(float(torch.linalg.matrix_norm(H)) / n - float(r.residual)) < 1e-12
