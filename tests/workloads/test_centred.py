"""The all-ones-blind continuity (workloads/metrics/centred.py, the collector's wc.* / gpc.* rows
and their cont/* summaries) on constructed cases, docs/science.md §4.5."""

from __future__ import annotations

import pytest
import torch

from workloads.config import MetricsConfig, MLPConfig
from workloads.metrics import continuity as C
from workloads.metrics.centred import centred_rows
from workloads.metrics.collect import MetricsCollector
from workloads.metrics.summary import summarize
from workloads.models.mlp import ResidualMLP

pytestmark = pytest.mark.timeout(120)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _values(rows, name):
    return {r[3]: r[4] for r in rows if r[0] == name}


def test_center_both_is_the_double_projection():
    g = _gen(0)
    W = torch.randn(3, 7, 5, generator=g, dtype=torch.float64)
    Pm = torch.eye(7, dtype=torch.float64) - 1 / 7
    Pn = torch.eye(5, dtype=torch.float64) - 1 / 5
    assert torch.allclose(C.center_both(W), Pm @ W @ Pn, atol=1e-14)
    Wc = C.center_both(W)
    assert torch.allclose(Wc.sum(-1), torch.zeros(3, 7, dtype=torch.float64), atol=1e-13)
    assert torch.allclose(Wc.sum(-2), torch.zeros(3, 5, dtype=torch.float64), atol=1e-13)
    assert torch.allclose(C.center_both(Wc), Wc, atol=1e-14)  # a projection
    # a rank-one all-ones matrix vanishes entirely
    assert C.center_both(torch.full((4, 6), 2.5)).abs().max().item() < 1e-6


def _ones_plus(signal: torch.Tensor, strength: float, n: int, L: int, seed: int):
    """L layers W_l = strength * 1 1^T / n (the shared mean direction, top-1 by construction)
    + a weaker per-layer term s_l r_l^T whose left vector s_l is one shared direction (if
    ``signal`` is given) or independent per layer; plus small noise."""
    g = _gen(seed)
    ones = torch.ones(n, dtype=torch.float64) / n ** 0.5
    Ws = []
    for _ in range(L):
        s = signal if signal is not None else torch.randn(n, generator=g, dtype=torch.float64)
        s = s - s.mean()
        r = torch.randn(n, generator=g, dtype=torch.float64)
        r = r - r.mean()
        W = strength * torch.outer(ones, ones) + torch.outer(s / s.norm(), r / r.norm())
        Ws.append(W + 1e-3 * torch.randn(n, n, generator=g, dtype=torch.float64))
    return torch.stack(Ws)


@pytest.mark.parametrize("exact", [True, False])
def test_ones_artefact_is_invisible_and_real_alignment_is_kept(exact):
    n, L = 64, 8
    # no real continuity, a dominant all-ones direction: plain M1 says ~1, centred ~baseline
    W = _ones_plus(None, 3.0, n, L, seed=1)
    U, _, V = C.top_singular(W, 1)
    assert C.top1_continuity(U[:-1, :, 0], U[1:, :, 0]).min() > 0.99  # the artefact
    rows = centred_rows("wc", "hidden", list(range(L)), W, exact, {}, _gen(0))
    top = _values(rows, "wc.top1_u")[1]
    assert top.mean().item() < 3 * C.random_baseline_top1(n)
    names = {r[0] for r in rows}
    assert "wc.ones_u" not in names and {"wc.dist_top1_v", "wc.s1_s2"} <= names
    # the same plus one shared left direction: the centred u-side sees it
    signal = torch.randn(n, generator=_gen(7), dtype=torch.float64)
    W = _ones_plus(signal, 3.0, n, L, seed=2)
    rows = centred_rows("wc", "hidden", list(range(L)), W, exact, {}, _gen(0))
    assert _values(rows, "wc.top1_u")[1].min().item() > 0.99
    assert _values(rows, "wc.top1_v")[1].mean().item() < 3 * C.random_baseline_top1(n)
    assert _values(rows, "wc.s1_s2")[0].min().item() > 10  # well separated after centring


def test_probe_stack_rows_average_over_probes():
    n, L, Pn = 32, 5, 3
    signal = torch.randn(n, generator=_gen(3), dtype=torch.float64)
    G = torch.stack([_ones_plus(signal, 2.0, n, L, seed=10 + p) for p in range(Pn)])
    rows = centred_rows("gpc", "hidden", list(range(L)), G, True, {})
    top = _values(rows, "gpc.top1_u")[1]
    assert top.shape == (L - 1,) and top.min().item() > 0.99
    assert _values(rows, "gpc.s1_s2")[0].shape == (L,)


def test_collector_emits_centred_rows_and_summaries_only_when_asked():
    torch.manual_seed(0)
    model = ResidualMLP(MLPConfig(width=32, depth=4))
    x, y = torch.rand(16, 784), torch.randint(0, 10, (16,))
    probes = [(x[:8], y[:8]), (x[8:], y[8:])]
    off = MetricsCollector(model, MetricsConfig(grad_probes=2), grad_probes=probes)
    rows_off, _ = off.collect(0)
    assert not any(r["metric"].startswith(("wc.", "gpc.")) for r in rows_off)
    on = MetricsCollector(model, MetricsConfig(grad_probes=2, centred=True), grad_probes=probes)
    rows, _ = on.collect(0)
    names = {r["metric"] for r in rows}
    assert {"wc.top1_v", "wc.top1_u", "wc.dist_top1_u", "wc.s1_s2",
            "gpc.top1_v", "gpc.top1_u", "gpc.s1_s2"} <= names
    # the uncentred rows are unchanged by the flag
    plain = {(r["metric"], r["layer"], r["next_layer"]): r["value"] for r in rows_off}
    again = {(r["metric"], r["layer"], r["next_layer"]): r["value"]
             for r in rows if not r["metric"].startswith(("wc.", "gpc."))}
    assert again == pytest.approx(plain, rel=1e-6, abs=1e-9)
    s = summarize(rows, 0)
    for key in ("cont/resid_ctop1_mean", "cont/grad_resid_ctop1_mean", "cont/resid_ctop1_d1_mean"):
        assert key in s and 0 <= s[key] <= 1
    # the cheap (subspace iteration) path gives the same rows on the same matrices
    cheap, _ = on.collect(0, exact_svd=False)
    exact = {(r["metric"], r["layer"], r["next_layer"]): r["value"] for r in rows
             if r["metric"] in ("wc.s1_s2",)}
    approx = {(r["metric"], r["layer"], r["next_layer"]): r["value"] for r in cheap
              if r["metric"] in ("wc.s1_s2",)}
    assert approx == pytest.approx(exact, rel=1e-3)
