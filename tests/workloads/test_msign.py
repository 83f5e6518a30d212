"""msign backends against an independent fp64 polar factor (eigh of X^T X); docs/science.md §3.6."""

from __future__ import annotations

import pytest
import torch

from workloads.geometry.msign import MSIGN_METHODS, NS5_COEFFS, POLAR_EXPRESS_COEFFS, msign


def polar_ref(X: torch.Tensor) -> torch.Tensor:
    """X (X^T X)^{-1/2} in fp64 via eigh: independent of torch.linalg.svd."""
    X = X.double()
    wide = X.shape[-2] < X.shape[-1]
    if wide:
        X = X.mT
    evals, evecs = torch.linalg.eigh(X.mT @ X)
    P = X @ (evecs * evals.rsqrt().unsqueeze(-2)) @ evecs.mT
    return P.mT if wide else P


def rel_err(A: torch.Tensor, B: torch.Tensor) -> float:
    return float(torch.linalg.matrix_norm(A.double() - B.double()).max()
                 / torch.linalg.matrix_norm(B.double()).min())


def well_conditioned(m: int, n: int, seed: int = 0, cond: float = 10.0) -> torch.Tensor:
    """U diag(s) V^T with singular values log-spaced in [1, cond], scaled by 3 (scale-free test)."""
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(max(m, n), min(m, n), generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(min(m, n), min(m, n), generator=g, dtype=torch.float64))
    s = torch.logspace(0, torch.log10(torch.tensor(cond)).item(), min(m, n), dtype=torch.float64)
    X = 3.0 * (U * s) @ V.mT
    return (X if m >= n else X.mT).float()


@pytest.mark.parametrize("shape", [(256, 64), (64, 256), (128, 128), (3, 96, 32)])
def test_polar_express_fp32_matches_polar_factor(shape):
    X = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    out = msign(X)
    assert out.dtype == torch.float32 and out.shape == X.shape
    assert rel_err(out, polar_ref(X)) < 1e-3
    # fp32 actually gets ~1e-6 on these (cond <= ~300)
    assert rel_err(out, polar_ref(X)) < 1e-5


def test_polar_express_fp32_ill_conditioned_square():
    # a 384 x 384 Gaussian has cond ~1e3: 10 steps leave ~1e-2, the default 12 get < 1e-3
    X = torch.randn(384, 384, generator=torch.Generator().manual_seed(2))
    ref = polar_ref(X)
    assert rel_err(msign(X), ref) < 1e-3
    assert rel_err(msign(X, steps=8), ref) > rel_err(msign(X), ref)


def test_polar_express_singular_values_near_one():
    X = well_conditioned(256, 64)
    for dtype in (torch.float32, torch.bfloat16):
        s = torch.linalg.svdvals(msign(X, dtype=dtype).double())
        assert (s - 1).abs().max() < 0.05, (dtype, s.min(), s.max())
    s32 = torch.linalg.svdvals(msign(X).double())
    assert (s32 - 1).abs().max() < 1e-5


def test_ns5_singular_values_in_band_not_one():
    X = well_conditioned(256, 64, cond=100.0)
    s = torch.linalg.svdvals(msign(X, method="ns5").double())
    assert s.min() > 0.3 and s.max() < 1.6
    assert (s - 1).abs().max() > 0.05  # NS5 is not an exact polar factor


def test_svd_method_is_exact_and_keeps_rank():
    X = torch.randn(40, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert rel_err(msign(X, method="svd"), polar_ref(X)) < 1e-12
    # rank 5: the five nonzero singular values go to 1, the rest stay 0
    L = X[:, :5] @ torch.randn(5, 24, dtype=torch.float64)
    s = torch.linalg.svdvals(msign(L, method="svd"))
    assert torch.allclose(s[:5], torch.ones(5, dtype=torch.float64), atol=1e-10)
    assert s[5:].abs().max() < 1e-10


@pytest.mark.parametrize("method", sorted(MSIGN_METHODS))
def test_transpose_equivariance_and_zero(method):
    X = torch.randn(50, 20, generator=torch.Generator().manual_seed(4))
    assert torch.allclose(msign(X.mT, method=method), msign(X, method=method).mT, atol=1e-5)
    Z = msign(torch.zeros(8, 5), method=method)
    assert torch.equal(Z, torch.zeros(8, 5))
    nan_in = torch.full((6, 4), float("nan"))
    assert torch.isfinite(msign(nan_in, method=method)).all()


def test_fp64_input_iterates_in_fp64():
    X = torch.randn(64, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    out = msign(X)
    assert out.dtype == torch.float64
    assert rel_err(out, polar_ref(X)) < 1e-10


def test_coefficient_table():
    a0, b0, c0 = POLAR_EXPRESS_COEFFS[0]
    assert a0 == pytest.approx(8.28721201814563 / 1.01, rel=1e-15)
    assert b0 == pytest.approx(-23.595886519098837 / 1.01**3, rel=1e-15)
    assert c0 == pytest.approx(17.300387312530933 / 1.01**5, rel=1e-15)
    a, b, c = POLAR_EXPRESS_COEFFS[-1]
    assert (a, b, c) == (1.875, -1.25, 0.375) and a + b + c == 1.0  # p(1) = 1, unscaled
    assert len(POLAR_EXPRESS_COEFFS) == 8 and NS5_COEFFS == (3.4445, -4.7750, 2.0315)


def test_unknown_method_is_one_line_error():
    with pytest.raises(ValueError, match="not one of"):
        msign(torch.randn(3, 3), method="newton")


def test_gram_method_is_exact_and_cheap_side_independent():
    """``gram``: one fp64 eigh of the small Gram, the polar factor to fp64 for fp64 input and to
    fp32 round-off for a well-conditioned fp32 one, either orientation, any column scaling."""
    X = torch.randn(3, 64, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    assert rel_err(msign(X, method="gram"), polar_ref(X)) < 1e-12
    assert rel_err(msign(X.mT, method="gram"), polar_ref(X).mT) < 1e-12
    graded = X * torch.logspace(-2, 2, 24, dtype=torch.float64)  # DGram-like column norms
    assert rel_err(msign(graded, method="gram"), polar_ref(graded)) < 1e-8
    Xf = well_conditioned(256, 64)
    assert rel_err(msign(Xf, method="gram"), polar_ref(Xf)) < 1e-5
