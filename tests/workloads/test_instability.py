"""Instability metrics (docs/science.md §3.5) against brute-force references, in fp64."""

from __future__ import annotations

import math

import pytest
import torch

from workloads.metrics import instability as I

pytestmark = pytest.mark.timeout(60)
f64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _orth(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(n, k, generator=g, dtype=f64))[0]


# --- weights ------------------------------------------------------------------------------


def test_split_qkv_rows():
    W = torch.arange(3 * 4 * 4, dtype=f64).reshape(12, 4)
    q, k, v = I.split_qkv(W)
    assert torch.equal(q, W[:4]) and torch.equal(k, W[4:8]) and torch.equal(v, W[8:])
    with pytest.raises(ValueError, match="multiple of 3"):
        I.split_qkv(torch.zeros(10, 4))


def test_logit_bound_matches_brute_force_and_bounds_scores():
    g = _gen(0)
    d, nh, T = 24, 3, 10
    dh = d // nh
    Wq = torch.randn(2, d, d, generator=g, dtype=f64)
    Wk = torch.randn(2, d, d, generator=g, dtype=f64)
    kappa = I.head_logit_bound(Wq, Wk, nh)  # (2, nh)
    assert kappa.shape == (2, nh)
    for layer in range(2):
        for h in range(nh):
            A, B = Wq[layer, h * dh:(h + 1) * dh], Wk[layer, h * dh:(h + 1) * dh]
            ref = torch.linalg.svdvals(A.T @ B)[0] / math.sqrt(dh)
            assert abs(float(kappa[layer, h] - ref)) < 1e-10
    # |s_ij| <= kappa ||x_i|| ||x_j|| on random inputs, and the ratio gets close on the top pair
    x = torch.randn(4, T, d, generator=g, dtype=f64)
    q = (x @ Wq[0].T).view(4, T, nh, dh).transpose(1, 2)
    k = (x @ Wk[0].T).view(4, T, nh, dh).transpose(1, 2)
    s = q @ k.transpose(-2, -1) / math.sqrt(dh)  # (B, nh, T, T)
    xn = x.norm(dim=-1)
    ratio = s.abs() / (xn[:, None, :, None] * xn[:, None, None, :])
    assert (ratio.amax(dim=(0, 2, 3)) <= kappa[0] * (1 + 1e-12)).all()
    # the bound is attained by the top singular pair of W_Q^h^T W_K^h
    M = Wq[0, :dh].T @ Wk[0, :dh]
    U, S, Vh = torch.linalg.svd(M)
    xi, xj = U[:, 0], Vh[0]
    s_top = (Wq[0, :dh] @ xi) @ (Wk[0, :dh] @ xj) / math.sqrt(dh)
    assert abs(float(s_top.abs() - kappa[0, 0])) < 1e-10
    # the RoPE-safe bound dominates kappa
    assert (I.head_logit_bound_rope(Wq, Wk, nh) >= kappa * (1 - 1e-12)).all()


def test_sigma_max_and_constraint_violations():
    g = _gen(1)
    Q = _orth(32, 8, g)
    assert float(I.sigma_max(3 * Q)) == pytest.approx(3.0, abs=1e-12)
    assert float(I.stiefel_violation(Q)) < 1e-12
    assert float(I.stiefel_violation(Q.T)) < 1e-12  # wide: transposed to tall first
    assert float(I.stiefel_violation(2 * Q)) == pytest.approx(3.0, abs=1e-12)  # ||4I - I|| / sqrt n
    D = torch.tensor([1.0, 2, 4, 0.5, 1, 1, 3, 1], dtype=f64)
    QD = Q * D
    assert float(I.dgram_violation(QD)) < 1e-12
    assert float(I.dgram_violation(QD.T)) < 1e-12
    assert float(I.column_norm_spread(QD)) == pytest.approx(8.0, rel=1e-12)
    assert float(I.column_norm_spread(QD.T)) == pytest.approx(8.0, rel=1e-12)
    W = torch.randn(20, 6, generator=g, dtype=f64)
    G = W.T @ W
    off = G - torch.diag(torch.diag(G))
    assert float(I.dgram_violation(W)) == pytest.approx(float(off.norm() / G.norm()), rel=1e-12)
    ref = (G - torch.eye(6, dtype=f64)).norm() / math.sqrt(6)
    assert float(I.stiefel_violation(W)) == pytest.approx(float(ref), rel=1e-12)


# --- scores -------------------------------------------------------------------------------


def _brute(scores: torch.Tensor, i0: int) -> dict[str, float]:
    """Loop-based references over causal entries j <= i."""
    B, nh, T, _ = scores.shape
    max_abs, sq, cnt, ranges, sat9, sat99, nrows, jac = 0.0, 0.0, 0, [], 0, 0, 0, []
    ent = torch.zeros(nh, dtype=f64)
    for b in range(B):
        for h in range(nh):
            for i in range(T):
                row = scores[b, h, i, : i + 1]
                max_abs = max(max_abs, float(row.abs().max()))
                sq += float((row**2).sum())
                cnt += i + 1
                ranges.append(float(row.max() - row.mean()))
                p = torch.exp(row - row.max())
                p = p / p.sum()
                if i >= 1:
                    H = -sum(float(pj * math.log(pj)) for pj in p if pj > 0)
                    ent[h] += H / math.log(i + 1) / (B * (T - 1))
                if i >= i0:
                    nrows += 1
                    sat9 += int(p.max() > 0.9)
                    sat99 += int(p.max() > 0.99)
                    J = torch.diag(p) - torch.outer(p, p)
                    jac.append(float(J.norm()))
    return {"max_abs": max_abs, "rms": math.sqrt(sq / cnt), "row_range": sum(ranges) / len(ranges),
            "sat_0p9": sat9 / nrows, "sat_0p99": sat99 / nrows, "entropy_mean": float(ent.mean()),
            "entropy_min": float(ent.min()), "jacobian_fro": sum(jac) / len(jac)}


@pytest.mark.parametrize("T", [6, 34])
def test_attention_stats_match_brute_force(T):
    g = _gen(2)
    scores = 3 * torch.randn(2, 2, T, T, generator=g, dtype=f64)
    got = I.attention_stats(scores)
    ref = _brute(scores, 16 if T >= 32 else 1)
    for key, val in ref.items():
        assert float(got[key]) == pytest.approx(val, rel=1e-9, abs=1e-12), key


def test_uniform_attention_has_entropy_one_and_no_saturation():
    scores = torch.zeros(2, 3, 40, 40, dtype=f64)  # every causal row uniform over i + 1 keys
    P = I.causal_probs(scores)
    ent = I.attention_entropy(P)
    assert torch.allclose(ent, torch.ones(3, dtype=f64), atol=1e-12)
    sat = I.softmax_saturation(P)
    assert float(sat[0.9]) == 0.0 and float(sat[0.99]) == 0.0
    # uniform over n keys: ||J||_F^2 = 1/n - 2/n^2 + 1/n^2 = (n - 1) / n^2
    n = torch.arange(17, 41, dtype=f64)
    ref = ((n - 1) / n**2).sqrt().mean()
    assert float(I.softmax_jacobian_fro(P)) == pytest.approx(float(ref), rel=1e-12)
    assert float(I.logit_stats(scores)["max_abs"]) == 0.0


def test_saturation_fraction_on_constructed_one_hot_rows():
    T = 40
    scores = torch.zeros(1, 2, T, T, dtype=f64)
    # head 0: even rows put +50 on key 0 (p_max ~ 1); head 1: every row one-hot-ish at +5
    scores[0, 0, ::2, 0] = 50.0
    scores[0, 1, :, 0] = 5.0
    P = I.causal_probs(scores)
    sat = I.softmax_saturation(P)
    # rows 16..39 count: 24 per head; head 0 saturates the 12 even ones; head 1: e^5 / (e^5 + i)
    i = torch.arange(16, T, dtype=f64)
    p1 = math.exp(5) / (math.exp(5) + i)
    ref9 = (12 + int((p1 > 0.9).sum())) / 48
    ref99 = (12 + int((p1 > 0.99).sum())) / 48
    assert float(sat[0.9]) == pytest.approx(ref9) and float(sat[0.99]) == pytest.approx(ref99)
    assert 0 < ref99 < ref9 < 1
    ent = I.attention_entropy(P)
    assert float(ent[0]) == pytest.approx(20 / 39, abs=1e-12)  # 20 odd rows uniform, 19 one-hot
    assert 0.0 < float(ent[1]) < float(ent[0])
    # one-hot rows have a vanishing softmax Jacobian
    onehot = torch.full((1, 1, T, T), -1e4, dtype=f64)
    onehot[..., 0] = 0.0
    assert float(I.softmax_jacobian_fro(I.causal_probs(onehot))) < 1e-12
    assert float(I.softmax_saturation(I.causal_probs(onehot))[0.99]) == 1.0
