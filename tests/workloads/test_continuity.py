"""Continuity metrics against independent references (docs/science.md §4.7), mostly in fp64."""

from __future__ import annotations

import math

import pytest
import torch

from workloads.metrics import continuity as C

pytestmark = pytest.mark.timeout(60)
f64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _orth(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(n, k, generator=g, dtype=f64))[0]


def _with_spectrum(m: int, n: int, s: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    r = len(s)
    return _orth(m, r, g) @ torch.diag(s) @ _orth(n, r, g).T


def _sign_aligned_err(A: torch.Tensor, B: torch.Tensor) -> float:
    """max |A - B| after flipping each column of A to B's sign."""
    sign = torch.sign((A * B).sum(-2, keepdim=True))
    return float((A * sign - B).abs().max())


# --- identical layers and random baselines ------------------------------------------------


def test_identical_adjacent_layers_give_one():
    W = torch.randn(1, 48, 32, generator=_gen(0), dtype=f64).expand(3, 48, 32)
    U, S, V = C.top_singular(W, 4)
    assert torch.allclose(C.top1_continuity(V[:-1, :, 0], V[1:, :, 0]), torch.ones(2, dtype=f64))
    assert torch.allclose(C.top1_continuity(U[:-1, :, :1], U[1:, :, :1]), torch.ones(2, dtype=f64))
    assert torch.allclose(C.subspace_overlap(V[:-1], V[1:]), torch.ones(2, dtype=f64))
    for side in ("in", "out"):
        for cen in (False, True):
            got = C.gram_alignment(W[:-1], W[1:], side, cen)
            assert torch.allclose(got, torch.ones(2, dtype=f64))
    assert torch.allclose(C.cosine_frobenius(W[:-1], W[1:]), torch.ones(2, dtype=f64))


def test_random_baseline_formula():
    assert C.random_baseline_top1(256) == pytest.approx(0.0499, abs=1e-4)
    assert C.random_baseline_top1(512) == pytest.approx(0.0353, abs=1e-4)
    assert C.random_baseline_top1(768) == pytest.approx(0.0288, abs=1e-4)
    for n in (8, 64, 256):  # the approximation vs the exact Gamma-function form
        assert C.random_baseline_top1(n) == pytest.approx(C.random_baseline_top1(n, True), rel=0.04)
    assert C.random_baseline_subspace(4, 64) == 4 / 64


@pytest.mark.parametrize("m,n", [(32, 32), (48, 24)])
def test_independent_random_layers_hit_the_baselines(m, n):
    N = 600  # pairs; Monte-Carlo standard error of mean |cos| ~ 0.6 / sqrt(n N)
    W = torch.randn(N + 1, m, n, generator=_gen(1), dtype=f64)
    U, S, V = C.top_singular(W, 4)
    for X, dim in ((V, n), (U, m)):
        c = C.top1_continuity(X[:-1, :, 0], X[1:, :, 0]).mean().item()
        se = 0.61 / math.sqrt(dim * N)
        assert abs(c - C.random_baseline_top1(dim, exact=True)) < 4 * se
        assert abs(c - C.random_baseline_top1(dim)) < 4 * se + 0.01 / dim
        psi = C.subspace_overlap(X[:-1], X[1:]).mean().item()
        assert psi == pytest.approx(4 / dim, rel=0.15)
    # M3 raw baseline ~ m/(m+n) on the input side, ~ n/(m+n) on the output side; centred ~ 0
    g = C.gram_alignment_adjacent(W)
    assert g["in"].mean().item() == pytest.approx(m / (m + n), abs=0.02)
    assert g["out"].mean().item() == pytest.approx(n / (m + n), abs=0.02)
    for key in ("in_c", "out_c"):
        assert abs(g[key].mean().item()) < 4 * g[key].std().item() / math.sqrt(N)


# --- M3 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("m,n", [(20, 12), (12, 20), (16, 16)])
def test_gram_alignment_three_expressions_agree(m, n):
    g = _gen(2)
    Wa, Wb = torch.randn(m, n, generator=g, dtype=f64), torch.randn(m, n, generator=g, dtype=f64)
    Ga, Gb = Wa.T @ Wa, Wb.T @ Wb
    explicit = (Ga * Gb).sum() / (Ga.norm() * Gb.norm())
    _, sa, Vha = torch.linalg.svd(Wa, full_matrices=False)
    _, sb, Vhb = torch.linalg.svd(Wb, full_matrices=False)
    spectral = (sa[:, None] ** 2 * sb[None, :] ** 2 * (Vha @ Vhb.T) ** 2).sum()
    spectral = spectral / torch.sqrt((sa**4).sum() * (sb**4).sum())
    cross = (Wb @ Wa.T).pow(2).sum() / (Ga.norm() * Gb.norm())
    got = C.gram_alignment(Wa, Wb, "in")
    for ref in (spectral, cross):
        assert abs(float(explicit - ref)) < 1e-10
    assert abs(float(got - explicit)) < 1e-10
    # output side and the isotropy-centred versions against explicit Grams
    Ha, Hb = Wa @ Wa.T, Wb @ Wb.T
    ref_out = (Ha * Hb).sum() / (Ha.norm() * Hb.norm())
    assert abs(float(C.gram_alignment(Wa, Wb, "out") - ref_out)) < 1e-10
    for G1, G2, side in ((Ga, Gb, "in"), (Ha, Hb, "out")):
        eye = torch.eye(G1.shape[0], dtype=f64)
        c1, c2 = G1 - torch.trace(G1) / len(eye) * eye, G2 - torch.trace(G2) / len(eye) * eye
        ref = (c1 * c2).sum() / (c1.norm() * c2.norm())
        assert abs(float(C.gram_alignment(Wa, Wb, side, centred=True) - ref)) < 1e-10
    # the stacked adjacent-pair form equals the pairwise one
    adj = C.gram_alignment_adjacent(torch.stack([Wa, Wb]))
    for side in ("in", "out"):
        for cen in (False, True):
            key = side + ("_c" if cen else "")
            assert abs(float(adj[key][0] - C.gram_alignment(Wa, Wb, side, cen))) < 1e-10


def test_gram_alignment_sign_flip_invariant_and_bad_side():
    g = _gen(3)
    W, Wb = torch.randn(24, 16, generator=g, dtype=f64), torch.randn(24, 16, generator=g, dtype=f64)
    U, S, Vh = torch.linalg.svd(W, full_matrices=False)
    D = torch.diag(torch.tensor([1.0, -1, -1, 1, -1] + [1] * 11, dtype=f64))
    W_flip = U @ torch.diag(S) @ D @ Vh  # flips v_i alone: a different matrix, the same Grams
    assert (W_flip - W).abs().max() > 0.1
    for side in ("in", "out"):
        for cen in (False, True):
            a, b = C.gram_alignment(W, Wb, side, cen), C.gram_alignment(W_flip, Wb, side, cen)
            assert abs(float(a - b)) < 1e-12
    with pytest.raises(ValueError, match="side"):
        C.gram_alignment(W, Wb, "both")


# --- planted continuity and the shared rotation -------------------------------------------


def test_planted_continuity_tends_to_one():
    g = _gen(4)
    s = torch.cat([torch.tensor([3.0], dtype=f64), torch.linspace(1.5, 0.5, 39, dtype=f64)])
    W = _with_spectrum(40, 40, s, g)
    E = torch.randn(40, 40, generator=g, dtype=f64)
    gaps = []
    for eps in (1e-1, 1e-2, 1e-3, 1e-4):
        _, _, V = C.top_singular(torch.stack([W, W + eps * E]), 1)
        gaps.append(1 - float(C.top1_continuity(V[0], V[1])))
    # 1 - |cos| ~ theta^2 / 2 with theta = O(eps): a hundredfold drop per decade of eps
    assert all(b < 0.03 * a for a, b in zip(gaps, gaps[1:]))
    assert gaps[0] > 1e-4 and gaps[-1] < 1e-7


def test_shared_rotation_leaves_m1_m3_unchanged_but_m7_sees_it():
    g = _gen(5)
    W = torch.randn(4, 24, 24, generator=g, dtype=f64)
    W[1:] += 2.0 * W[:1]  # some continuity, so the values are not all at baseline
    R = _orth(24, 24, g)
    WR = R @ W @ R.T
    U, S, V = C.top_singular(W, 4)
    Ur, Sr, Vr = C.top_singular(WR, 4)
    for X, Xr in ((V, Vr), (U, Ur)):
        a = C.top1_continuity(X[:-1, :, 0], X[1:, :, 0])
        b = C.top1_continuity(Xr[:-1, :, 0], Xr[1:, :, 0])
        assert torch.allclose(a, b, atol=1e-10)
        ref = C.subspace_overlap(Xr[:-1], Xr[1:])
        assert torch.allclose(C.subspace_overlap(X[:-1], X[1:]), ref, atol=1e-10)
    for side in ("in", "out"):
        for cen in (False, True):
            assert torch.allclose(C.gram_alignment(W[:-1], W[1:], side, cen),
                                  C.gram_alignment(WR[:-1], WR[1:], side, cen), atol=1e-10)
    # M7 (temporal self-alignment) compares a layer with itself before/after: it drops
    assert float(C.top1_continuity(V[:, :, 0], Vr[:, :, 0]).max()) < 0.9


# --- cheap top-k --------------------------------------------------------------------------


@pytest.mark.parametrize("m,n,k", [(64, 48, 1), (48, 64, 4), (96, 32, 4)])
def test_cheap_topk_matches_exact_svd_when_gap_at_least_1p2(m, n, k):
    g = _gen(6)
    r = min(m, n)
    s = 1.2 ** -torch.arange(r, dtype=f64)  # every consecutive gap s_i / s_i+1 = 1.2
    W = torch.stack([_with_spectrum(m, n, s, g) for _ in range(3)])
    Ue, Se, Ve = C.top_singular(W, k)
    U, S, V, Vq, res = C.subspace_iteration(W, k, tol=1e-8, max_iters=300, generator=_gen(0))
    assert _sign_aligned_err(V, Ve) < 1e-4 and _sign_aligned_err(U, Ue) < 1e-4
    assert float((S - Se).abs().max()) < 1e-6 and float(res.max()) < 1e-8
    assert Vq.shape[-1] == min(k + 4, r)
    Ul, Sl, Vl = C.lowrank_top(W, k)
    assert _sign_aligned_err(Vl, Ve) < 1e-4 and _sign_aligned_err(Ul, Ue) < 1e-4
    assert float((Sl - Se).abs().max()) < 1e-4


def test_power_iteration_flat_tail_and_warm_start():
    g = _gen(7)
    s = torch.tensor([1.2] + [1.0] * 31, dtype=f64)  # gap 1.2 only at the top, flat tail
    W = _with_spectrum(64, 32, s, g)
    Ue, Se, Ve = C.top_singular(W, 1)
    U, S, V, Vq, res = C.subspace_iteration(W, 1, tol=1e-7, max_iters=400, generator=_gen(1))
    assert _sign_aligned_err(V, Ve) < 1e-4 and float(res.max()) < 1e-7
    # a warm start from the previous block converges in a few iterations after a small move
    W2 = W + 1e-4 * torch.randn(64, 32, generator=g, dtype=f64)
    *_, res_warm = C.subspace_iteration(W2, 1, V0=Vq, max_iters=3, check_every=3)
    *_, res_cold = C.subspace_iteration(W2, 1, max_iters=3, check_every=3, generator=_gen(2))
    assert float(res_warm.max()) < 1e-3 < float(res_cold.max())


def test_ritz_residual_zero_for_exact_vectors():
    W = torch.randn(2, 30, 20, generator=_gen(8), dtype=f64)
    U, S, V = C.top_singular(W, 3)
    assert float(C.ritz_residual(W, V, S).max()) < 1e-12
    assert float(C.ritz_residual(W, torch.roll(V, 1, -1), S).min()) > 1e-2


# --- M5, M6 -------------------------------------------------------------------------------


def test_gradient_coherence_duplicated_and_independent():
    g = _gen(9)
    G = torch.randn(40, 32, generator=g, dtype=f64)
    assert float(C.cosine_frobenius(G, G)) == pytest.approx(1.0, abs=1e-12)
    assert float(C.cosine_frobenius(G, -3 * G)) == pytest.approx(-1.0, abs=1e-12)
    Gs = torch.randn(200, 40, 32, generator=g, dtype=f64)
    coh = C.cosine_frobenius(Gs[:-1], Gs[1:])
    assert float(coh.abs().max()) < 5 / math.sqrt(40 * 32)  # ~0 +- 1/sqrt(mn)
    assert abs(float(coh.mean())) < 4 / math.sqrt(40 * 32 * 199)


def test_relative_change():
    g = _gen(10)
    W0 = torch.randn(3, 20, 10, generator=g, dtype=f64)
    fro, spec = C.relative_change(1.25 * W0, W0)
    assert torch.allclose(fro, torch.full((3,), 0.25, dtype=f64))
    assert torch.allclose(spec, torch.full((3,), 0.25, dtype=f64))
    x, y = torch.randn(20, generator=g, dtype=f64), torch.randn(10, generator=g, dtype=f64)
    fro, spec = C.relative_change(W0[0] + torch.outer(x, y), W0[0])
    s0 = torch.linalg.svdvals(W0[0])[0]
    assert float(spec) == pytest.approx(float(x.norm() * y.norm() / s0), rel=1e-10)
    assert float(fro) == pytest.approx(float(x.norm() * y.norm() / W0[0].norm()), rel=1e-10)
    assert C.relative_change(W0, W0, spectral=False)[1] is None


def test_half_precision_is_upcast():
    W = torch.randn(2, 16, 8, generator=_gen(11)).to(torch.bfloat16)
    U, S, V = C.top_singular(W, 2)
    assert S.dtype == torch.float32
    assert C.gram_alignment(W[:1], W[1:]).dtype == torch.float32
