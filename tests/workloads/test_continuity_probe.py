"""Paper C's gradient continuity and controls (workloads/metrics/probe.py and the collector's
gp.*, dist, ones, self, stream rows) on constructed cases, docs/science.md §4.3 and §4.5."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from workloads.config import MetricsConfig, MLPConfig
from workloads.metrics import probe as P
from workloads.metrics.collect import MetricsCollector
from workloads.metrics.continuity import random_baseline_top1
from workloads.models.mlp import ResidualMLP

pytestmark = pytest.mark.timeout(120)


def _by(rows, metric, step=None):
    return {(r["layer"], r["next_layer"]): r["value"] for r in rows
            if r["metric"] == metric and (step is None or r["step"] == step)}


def _unit(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(*shape, generator=g, dtype=torch.float64)
    return y / y.norm(dim=-1, keepdim=True)


# --- pure pieces ----------------------------------------------------------------------------


def test_pairs_at():
    assert P.pairs_at([0, 1, 2, 3], 2) == ([0, 1], [2, 3])
    assert P.pairs_at([0, 2, 3, 5], 2) == ([0, 2], [1, 3])  # by layer index, not position
    assert P.pairs_at([0, 1], 5) == ([], [])


def test_ones_alignment():
    n = 64
    assert P.ones_alignment(torch.ones(n)).item() == pytest.approx(1.0)
    assert P.ones_alignment(-3 * torch.ones(n)).item() == pytest.approx(1.0)  # sign-invariant
    e = torch.zeros(n)
    e[0] = 1.0
    assert P.ones_alignment(e).item() == pytest.approx(1 / 8)
    # uniform random unit vectors: E|<y, 1/sqrt(n)>| = sqrt(2 / (pi n)) (the M1 baseline)
    got = P.ones_alignment(_unit(20000, n)).mean().item()
    assert got == pytest.approx(random_baseline_top1(n), rel=0.02)


def test_vector_rows_identical_and_random():
    L, n = 12, 64
    same = _unit(1, n).expand(3, L, n)  # P = 3 probes, every layer the same vector
    rows = P.vector_rows("gp", "hidden", list(range(L)), {"v": same}, adjacent=True)
    names = {(r[0], r[3]) for r in rows}
    assert names == {("gp.top1_v", 1), ("gp.ones_v", 0)} | {
        ("gp.dist_top1_v", d) for d in (1, 2, 5, 10)}
    for name, _, layers, d, vals in rows:
        if name != "gp.ones_v":
            assert len(layers) == L - d and torch.allclose(vals, torch.ones_like(vals))
    # independent random vectors: every distance sits at the random baseline
    rand = _unit(40, L, n, seed=1)
    rows = P.vector_rows("gp", "hidden", list(range(L)), {"v": rand}, adjacent=False)
    for name, _, _layers, d, vals in rows:
        if name == "gp.dist_top1_v":  # mean of 40 probes x (L - d) pairs, sd ~0.075 each
            assert vals.mean().item() == pytest.approx(random_baseline_top1(n), abs=0.02), d


def test_probe_gradients_leave_grad_and_mode_alone():
    torch.manual_seed(0)
    m = ResidualMLP(MLPConfig(width=16, depth=3))
    m.train()
    x, y = torch.rand(8, 784), torch.randint(0, 10, (8,))
    params = [b.fc.weight for b in m.blocks]
    grads, losses = P.probe_gradients(m, params, [(x, y), (x[:4], y[:4])])
    assert all(p.grad is None for p in m.parameters()) and m.training
    _, loss = m(x, y)
    loss.backward()
    assert torch.allclose(grads[0][1], m.blocks[1].fc.weight.grad)
    assert losses[0].item() == pytest.approx(loss.item())


# --- the collector ---------------------------------------------------------------------------


def _mlp(skip=True, activation="relu", width=32, depth=12, seed=0):
    torch.manual_seed(seed)
    return ResidualMLP(MLPConfig(d_in=20, width=width, depth=depth, skip=skip,
                                 activation=activation))


def _probes(n=3, b=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(b, 20, generator=g), torch.randint(0, 10, (b,), generator=g))
            for _ in range(n)]


def test_gp_rows_match_an_independent_svd():
    m, probes = _mlp(), _probes()
    col = MetricsCollector(m, MetricsConfig(instability=False), grad_probes=probes)
    rows = col.init_rows()
    assert {r["step"] for r in rows} == {0}
    assert all(p.grad is None for p in m.parameters())
    vs, us, gaps = [], [], []
    for x, y in probes:  # numpy float64 reference
        m.zero_grad()
        m(x, y)[1].backward()
        Gs = [b.fc.weight.grad.double().numpy() for b in m.blocks]
        svd = [np.linalg.svd(G) for G in Gs]
        us.append([u[:, 0] for u, _, _ in svd])
        vs.append([vt[0] for _, _, vt in svd])
        gaps.append([s[0] / s[1] for _, s, _ in svd])
    for side, vecs in (("v", vs), ("u", us)):
        for d in (1, 2, 5, 10):
            got = _by(rows, f"gp.dist_top1_{side}")
            for layer in range(12 - d):
                want = np.mean([abs(v[layer] @ v[layer + d]) for v in vecs])
                assert got[(layer, layer + d)] == pytest.approx(want, abs=1e-4)
        assert _by(rows, f"gp.top1_{side}") == pytest.approx(
            {k: v for k, v in _by(rows, f"gp.dist_top1_{side}").items() if k[1] == k[0] + 1})
        ones = _by(rows, f"gp.ones_{side}")
        want = np.mean([abs(v[4].sum()) / math.sqrt(32) for v in vecs])
        assert ones[(4, -1)] == pytest.approx(want, abs=1e-4)
    assert _by(rows, "gp.s1_s2")[(7, -1)] == pytest.approx(np.mean(gaps, 0)[7], rel=1e-4)
    assert set(_by(rows, "gp.loss")) == {(-1, -1)}
    # the cheap path (subspace iteration, warm-started from the exact vectors) agrees
    cheap, _ = col.collect(1, exact_svd=False)
    exact = _by(rows, "gp.top1_v")
    assert _by(cheap, "gp.top1_v") == pytest.approx(exact, abs=1e-3)
    assert max(_by(cheap, "gp.ritz_res").values()) < 1e-2


def test_residual_gradients_are_continuous_from_init():
    """§4.3 M5: at init, Res+None's probe gradients share top vectors across layers (paper:
    ~0.93) and NoRes's do not; NoRes's level is flat over distance (the all-ones lean)."""
    probes = _probes(4, 32)
    means = {}
    for skip, act in ((True, "none"), (False, "relu")):
        col = MetricsCollector(_mlp(skip, act, width=64), MetricsConfig(instability=False),
                               grad_probes=probes)
        col.init_rows()
        means[skip] = {d: col.scalars0[f"cont0/grad_resid_top1_d{d}_mean"] for d in (1, 5, 10)}
    assert means[True][1] > 0.8 and means[True][1] > means[True][10]
    assert means[False][1] < 0.5 and abs(means[False][1] - means[False][10]) < 0.15


def test_weight_controls_identical_static_and_all_ones():
    m = _mlp(width=32, depth=12)
    n = 32
    with torch.no_grad():  # every layer the same matrix with top right vector all-ones
        W = 1e-4 * torch.randn(n, n) + 2.0 * torch.outer(_unit(n, seed=3).float(),
                                                          torch.ones(n) / math.sqrt(n))
        for b in m.blocks:
            b.fc.weight.copy_(W)
    col = MetricsCollector(m, MetricsConfig(instability=False))
    rows, sc = col.collect(1)
    for d in (1, 2, 5, 10):
        vals = {k: v for k, v in _by(rows, "w.dist_top1_v").items() if k[1] - k[0] == d}
        assert len(vals) == 12 - d and all(v == pytest.approx(1.0, abs=1e-5) for v in vals.values())
    assert all(v == pytest.approx(1.0, abs=1e-4) for v in _by(rows, "w.ones_v").values())
    assert sc["cont/ones_v_mean"] == pytest.approx(1.0, abs=1e-4)
    assert sc["cont/resid_top1_d10_mean"] == pytest.approx(1.0, abs=1e-5)
    # M7: a static weight is self-aligned (against the last collect and against init) ...
    rows2, sc2 = col.collect(2)
    assert all(v == pytest.approx(1.0, abs=1e-5) for v in _by(rows2, "w.self_v").values())
    assert all(v == pytest.approx(1.0, abs=1e-5) for v in _by(rows2, "w.self0_u").values())
    assert not _by(rows, "w.self_v")  # no previous collect at the first one
    # ... a shared rotation W -> R W R^T of every layer keeps M1 but M7 sees it (§4.7 item 4)
    R = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(4)))[0]
    with torch.no_grad():
        for b in m.blocks:
            b.fc.weight.copy_(R @ b.fc.weight @ R.T)
    rows3, sc3 = col.collect(3)
    assert all(v == pytest.approx(1.0, abs=1e-5) for v in _by(rows3, "w.top1_v").values())
    assert sc3["cont/self_resid_mean"] < 0.5 and sc3["cont/self0_resid_mean"] < 0.5


def test_stream_rows_init_rows_and_cont0_scalars():
    m = _mlp(width=32, depth=6)
    x = torch.rand(16, 20)
    col = MetricsCollector(m, MetricsConfig(instability=False), probe_batch=x,
                           grad_probes=_probes(2))
    rows = col.init_rows()
    norms = m.stream_norms(x)
    got = _by(rows, "act.stream_norm")
    assert set(got) == {(i, -1) for i in range(7)}
    assert got[(6, -1)] == pytest.approx(norms[-1].item(), rel=1e-6)
    growth = _by(rows, "act.stream_growth")[(-1, -1)]
    assert growth == pytest.approx((norms[-1] / norms[0]).item(), rel=1e-6)
    assert all(math.isfinite(r["value"]) for r in rows)
    _, sc = col.collect(5)
    assert sc["cont0/stream_growth"] == pytest.approx(growth)
    assert sc["cont0/resid_top1_mean"] == pytest.approx(
        np.mean([r["value"] for r in rows if r["metric"] in ("w.top1_v", "w.top1_u")]))
    assert {"cont/stream_growth", "cont/probe_loss", "cont/grad_resid_top1_mean",
            "cont/grad_ones_v_mean", "cont/self0_resid_mean"} <= set(sc)
    state = col.state_dict()
    fresh = MetricsCollector(m, MetricsConfig(instability=False), probe_batch=x)
    fresh.load_state_dict(state)
    assert fresh.scalars0 == col.scalars0 and set(fresh.prev_top) == {"hidden"}


def test_training_loop_reports_step_zero_rows():
    """The loop calls init_rows() before the first step: the first report carries gp.* and the
    stream rows at step 0 (first-batch state), later collects at metrics steps."""
    from workloads.config import apply_overrides, preset
    from workloads.train import run

    cfg = apply_overrides(preset("mlp-debug"), {"train.steps": 4, "train.eval_every": 4,
                                                "train.metrics_every": 2})
    reports = []
    run(cfg, report=reports.append)
    rows = reports[0].rows
    assert sorted({r["step"] for r in rows}) == [0, 2, 4]
    for step in (0, 2, 4):
        assert _by(rows, "gp.top1_v", step) and _by(rows, "act.stream_growth", step)
    assert _by(rows, "w.self0_v", 4) and not _by(rows, "w.self_v", 0)
    sc = reports[0].scalars
    assert 0.5 < sc["cont0/stream_growth"] < 4 and abs(sc["cont0/probe_loss"] - 2.3) < 0.6
