"""MetricsCollector on small stand-ins of the model contract, and on the real models."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from workloads.config import MetricsConfig
from workloads.metrics import continuity as C
from workloads.metrics import instability as I
from workloads.metrics.collect import MetricsCollector

pytestmark = pytest.mark.timeout(120)
ROW_KEYS = {"step", "metric", "module", "layer", "next_layer", "value"}


# --- stand-ins implementing docs/contracts.md ----------------------------------------------


@dataclass
class Role:
    name: str
    param: nn.Parameter
    role: str
    layer: int
    kind: str


class StandInMLP(nn.Module):
    """h <- h + relu(W_l h) (or relu(W_l h) without skip); roles ``hidden``."""

    def __init__(self, d_in=16, width=32, depth=4, n_classes=5, skip=True):
        super().__init__()
        self.w_in = nn.Linear(d_in, width, bias=False)
        self.blocks = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(depth))
        self.w_out = nn.Linear(width, n_classes, bias=False)
        self.skip = skip

    def forward(self, x, targets=None):
        h = self.w_in(x)
        for b in self.blocks:
            h = h + torch.relu(b(h)) if self.skip else torch.relu(b(h))
        logits = self.w_out(h)
        loss = None if targets is None else nn.functional.cross_entropy(logits, targets)
        return logits, loss

    def matrix_roles(self):
        roles = [Role("w_in.weight", self.w_in.weight, "in", -1, "io")]
        roles += [Role(f"blocks.{i}.weight", b.weight, "hidden", i, "mlp")
                  for i, b in enumerate(self.blocks)]
        return roles + [Role("w_out.weight", self.w_out.weight, "out", len(self.blocks), "io")]


class _Attn(nn.Module):
    def __init__(self, d, nh):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)
        self.n_head = nh

    def _split(self, x):
        B, T, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=-1)
        return [t.view(B, T, self.n_head, d // self.n_head).transpose(1, 2) for t in (q, k, v)]

    def scores(self, x):
        q, k, _ = self._split(x)
        return (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])  # (B, nh, T, T)

    def forward(self, x):
        q, k, v = self._split(x)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(x.shape))


class _Block(nn.Module):
    def __init__(self, d, nh):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = _Attn(d, nh)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.proj = nn.Linear(4 * d, d, bias=False)

    def forward(self, h):
        h = h + self.attn(self.ln(h))
        return h + self.proj(torch.relu(self.fc(h)))


class StandInGPT(nn.Module):
    def __init__(self, vocab=11, d=16, nh=2, n_layer=3):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(_Block(d, nh) for _ in range(n_layer))
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets=None):
        h = self.wte(idx)
        for b in self.blocks:
            h = b(h)
        logits = self.lm_head(h)
        loss = None if targets is None else nn.functional.cross_entropy(
            logits.flatten(0, 1), targets.flatten())
        return logits, loss

    def matrix_roles(self):
        roles = [Role("wte.weight", self.wte.weight, "in", -1, "io")]
        for i, b in enumerate(self.blocks):
            p = f"blocks.{i}."
            roles += [Role(p + "attn.c_attn.weight", b.attn.c_attn.weight, "qkv", i, "attention"),
                      Role(p + "attn.c_proj.weight", b.attn.c_proj.weight, "o", i, "attention"),
                      Role(p + "fc.weight", b.fc.weight, "fc", i, "mlp"),
                      Role(p + "proj.weight", b.proj.weight, "proj", i, "mlp")]
        return roles


def _by(rows, metric, module=None, step=None):
    return {(r["layer"], r["next_layer"]): r["value"] for r in rows if r["metric"] == metric
            and (module is None or r["module"] == module) and (step is None or r["step"] == step)}


def _train(model, x, y, col, steps=3, lr=1e-2):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for s in range(steps):
        _, loss = model(x, y)
        loss.backward()
        col.after_backward(s)
        opt.step()
        opt.zero_grad(set_to_none=True)


# --- continuity rows ------------------------------------------------------------------------


def test_rows_schema_and_identical_layers_give_one():
    torch.manual_seed(0)
    m = StandInMLP()
    with torch.no_grad():
        for b in m.blocks[1:]:
            b.weight.copy_(m.blocks[0].weight)
    col = MetricsCollector(m, MetricsConfig(topk=[1, 4, 16, 64]))
    rows, scalars = col.collect(5, exact_svd=True)
    assert rows and all(set(r) == ROW_KEYS for r in rows)
    assert all(type(r["layer"]) is int and type(r["value"]) is float for r in rows)
    for metric in ("w.top1_v", "w.top1_u", "w.sub4_v", "w.sub16_u", "w.gram_in", "w.gram_out_c"):
        vals = _by(rows, metric, "hidden")
        assert set(vals) == {(0, 1), (1, 2), (2, 3)}, metric
        assert all(v == pytest.approx(1.0, abs=1e-4) for v in vals.values()), metric
    assert not _by(rows, "w.sub64_v")  # k >= n is skipped
    base = _by(rows, "base.top1_v", "hidden")
    assert all(v == pytest.approx(math.sqrt(2 / (math.pi * 32))) for v in base.values())
    assert all(v == pytest.approx(4 / 32) for v in _by(rows, "base.sub4_u").values())
    per_layer = _by(rows, "w.sigma_max", "hidden")
    assert set(per_layer) == {(i, -1) for i in range(4)}
    s = torch.linalg.svdvals(m.blocks[0].weight.detach())
    assert per_layer[(2, -1)] == pytest.approx(float(s[0]), rel=1e-5)
    assert _by(rows, "w.s1_s2")[(0, -1)] == pytest.approx(float(s[0] / s[1]), rel=1e-5)
    assert all(v == pytest.approx(1.0, rel=1e-6) for v in _by(rows, "w.sigma_growth").values())
    assert not _by(rows, "dw.top1_v") and not _by(rows, "cg.coh")  # nothing moved yet
    assert scalars["cont/resid_top1_mean"] == pytest.approx(1.0, abs=1e-4)
    assert scalars["cont/svd_exact"] == 1.0 and {r["step"] for r in rows} == {5}


def test_cheap_path_matches_exact_svd():
    torch.manual_seed(1)
    m = StandInMLP(width=32, depth=3)
    g = torch.Generator().manual_seed(0)
    s = 1.2 ** -torch.arange(32.0)  # gap 1.2 between all singular values
    with torch.no_grad():
        for b in m.blocks:
            U = torch.linalg.qr(torch.randn(32, 32, generator=g))[0]
            V = torch.linalg.qr(torch.randn(32, 32, generator=g))[0]
            b.weight.copy_(U @ torch.diag(s) @ V.T)
    col = MetricsCollector(m, MetricsConfig(coherence=False))
    exact, _ = col.collect(1, exact_svd=True)
    col.warm.clear()  # a cold start: the cheap path must converge on its own
    cheap, sc = col.collect(1, exact_svd=False)
    assert sc["cont/svd_exact"] == 0.0
    for metric in ("w.top1_v", "w.top1_u", "w.sub4_v", "w.sub16_u", "w.sigma_max", "w.s1_s2"):
        a, b = _by(exact, metric), _by(cheap, metric)
        assert a.keys() == b.keys() and a
        for key in a:
            assert b[key] == pytest.approx(a[key], abs=2e-4), (metric, key)
    assert max(_by(cheap, "w.ritz_res").values()) < 1e-3


def test_gradient_rows_cumulative_and_update_based():
    torch.manual_seed(2)
    m = StandInMLP(depth=3)
    col = MetricsCollector(m, MetricsConfig(instability=False))
    g = torch.Generator().manual_seed(1)
    G1, G2 = torch.randn(32, 32, generator=g), torch.randn(32, 32, generator=g)
    indep = [torch.randn(32, 32, generator=g) for _ in range(3)]
    for step, grads in enumerate(([G1, G1, -G1], indep, [G2, G2, G2])):
        for b, gr in zip(m.blocks, grads):
            b.weight.grad = gr.clone()
        col.after_backward(step)
    for b in m.blocks:
        b.weight.grad = None  # the loop zeroes grads before collect: nothing may depend on them
    with torch.no_grad():
        delta = torch.randn(32, 32, generator=g)
        W0 = [b.weight.detach().clone() for b in m.blocks]
        for b in m.blocks:
            b.weight.add_(delta)  # the same update everywhere
    rows, sc = col.collect(3, exact_svd=True)
    # instantaneous: the last step had identical grads; step-0 rows: +1 then -1
    assert all(v == pytest.approx(1.0, abs=1e-6) for v in _by(rows, "g.coh", step=3).values())
    assert _by(rows, "g.coh", step=0) == pytest.approx({(0, 1): 1.0, (1, 2): -1.0}, abs=1e-6)
    ref_mean = [(v1 + float(C.cosine_frobenius(indep[i], indep[i + 1])) + 1.0) / 3
                for i, v1 in enumerate((1.0, -1.0))]
    got = _by(rows, "g.coh_mean", step=3)
    assert [got[(0, 1)], got[(1, 2)]] == pytest.approx(ref_mean, abs=1e-6)
    # cumulative gradients C_l = sum of the three steps
    cum = [G1 + indep[0] + G2, G1 + indep[1] + G2, -G1 + indep[2] + G2]
    for (l0, _), v in _by(rows, "cg.coh").items():
        assert v == pytest.approx(float(C.cosine_frobenius(cum[l0], cum[l0 + 1])), abs=1e-6)
    ref = C.gram_alignment(cum[0], cum[1], "in", centred=True)
    assert _by(rows, "cg.gram_in_c")[(0, 1)] == pytest.approx(float(ref), abs=1e-5)
    # update-based: the same delta in every layer
    assert all(v == pytest.approx(1.0, abs=1e-5) for v in _by(rows, "dw.top1_v").values())
    assert all(v == pytest.approx(1.0, abs=1e-5) for v in _by(rows, "dw.coh").values())
    rel = _by(rows, "w.rel_change_fro")
    spec = _by(rows, "w.rel_change_spec")
    for i in range(3):
        assert rel[(i, -1)] == pytest.approx(float(delta.norm() / W0[i].norm()), rel=1e-5)
        ref_spec = torch.linalg.matrix_norm(delta, 2) / torch.linalg.matrix_norm(W0[i], 2)
        assert spec[(i, -1)] == pytest.approx(float(ref_spec), rel=1e-4)
    assert sc["cont/grad_coherence_mean"] == pytest.approx(sum(ref_mean) / 2, abs=1e-6)
    # the next collect: no new step-0 rows and no interval mean without new backward passes
    rows2, _ = col.collect(4, exact_svd=True)
    assert not _by(rows2, "g.coh", step=0) and not _by(rows2, "g.coh_mean")


def test_coherence_off_and_state_round_trip():
    torch.manual_seed(3)
    x, y = torch.randn(16, 16), torch.randint(0, 5, (16,))
    m = StandInMLP()
    off = MetricsCollector(m, MetricsConfig(coherence=False))
    _train(m, x, y, off)
    rows, _ = off.collect(3)
    assert not [r for r in rows if r["metric"].startswith(("g.", "cg."))]
    assert _by(rows, "dw.top1_v")  # the update-based metrics do not need gradients
    col = MetricsCollector(m, MetricsConfig())
    _train(m, x, y, col)
    state = col.state_dict()
    a, _ = col.collect(6)
    fresh = MetricsCollector(m, MetricsConfig())  # W0 = today's weights until restored
    fresh.load_state_dict(state)
    b, _ = fresh.collect(6)
    key = lambda r: (r["step"], r["metric"], r["module"], r["layer"], r["next_layer"])  # noqa: E731
    va, vb = {key(r): r["value"] for r in a}, {key(r): r["value"] for r in b}
    assert va.keys() == vb.keys()
    assert all(vb[k] == pytest.approx(v, abs=1e-6) for k, v in va.items())


# --- fused qkv and instability ------------------------------------------------------------


def test_stand_in_gpt_qkv_split_and_instability_rows():
    torch.manual_seed(4)
    m = StandInGPT()
    idx = torch.randint(0, 11, (3, 40))
    probe = idx[:2]
    col = MetricsCollector(m, MetricsConfig(), probe_batch=probe)
    _train(m, idx, idx, col)
    m.train()
    rows, sc = col.collect(3, exact_svd=True)
    assert m.training  # the probe forward restores the mode
    assert {r["module"] for r in rows} >= {"q", "k", "v", "o", "fc", "proj", "attn", "qkv"}
    Wc = torch.stack([b.attn.c_attn.weight.detach() for b in m.blocks])
    Wq, Wk, Wv = I.split_qkv(Wc)
    _, _, V = C.top_singular(Wk, 1)
    ref = C.top1_continuity(V[:-1, :, 0], V[1:, :, 0])
    assert list(_by(rows, "w.top1_v", "k").values()) == pytest.approx(ref.tolist(), abs=1e-5)
    _, _, V4 = C.top_singular(Wq, 4)
    ref4 = C.subspace_overlap(V4[:-1], V4[1:])
    assert list(_by(rows, "w.sub4_v", "q").values()) == pytest.approx(ref4.tolist(), abs=1e-5)
    Wo = torch.stack([b.attn.c_proj.weight.detach() for b in m.blocks])
    Uo, _, _ = C.top_singular(Wo, 1)  # o writes to the stream: its u side is the test side
    ref_o = C.top1_continuity(Uo[:-1, :, 0], Uo[1:, :, 0])
    assert list(_by(rows, "w.top1_u", "o").values()) == pytest.approx(ref_o.tolist(), abs=1e-5)
    # kappa rows and the empirical logits they bound
    kappa = I.head_logit_bound(Wq, Wk, 2).amax(-1)
    got = list(_by(rows, "inst.kappa_max", "attn").values())
    assert got == pytest.approx(kappa.tolist(), rel=1e-5)
    h = m.wte(probe)
    with torch.no_grad():
        for i, b in enumerate(m.blocks):
            x = b.ln(h)
            s = b.attn.scores(x)
            st = I.attention_stats(s)
            got = _by(rows, "inst.max_logit", "attn")[(i, -1)]
            assert got == pytest.approx(float(st["max_abs"]), rel=1e-5)
            got = _by(rows, "inst.entropy_min", "attn")[(i, -1)]
            assert got == pytest.approx(float(st["entropy_min"]), rel=1e-5)
            xn = x.norm(dim=-1)
            ratio = s.abs() / (xn[:, None, :, None] * xn[:, None, None, :])
            assert float(ratio.max()) <= float(kappa[i]) * (1 + 1e-4)
            h = b(h)
    for name in ("inst.stiefel_viol", "inst.dgram_viol", "inst.colnorm_spread"):
        assert set(_by(rows, name, "qkv")) == {(i, -1) for i in range(3)}
    ref_viol = I.dgram_violation(m.blocks[1].fc.weight.detach())
    assert _by(rows, "inst.dgram_viol", "fc")[(1, -1)] == pytest.approx(float(ref_viol), rel=1e-5)
    for key in ("inst/max_logit", "inst/sigma_max_q", "inst/kappa_max", "inst/entropy_min",
                "cont/resid_top1_mean", "cont/grad_coherence_mean", "metrics/time_s"):
        assert math.isfinite(sc[key]), key
    assert sc["inst/sigma_max_q"] == pytest.approx(float(I.sigma_max(Wq).max()), rel=1e-5)
    assert sc["inst/kappa_max"] == pytest.approx(float(kappa.max()), rel=1e-5)


# --- residual vs no residual (SCIENCE 4.3 M5 mechanism) -----------------------------------


def _toy(skip: bool, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    try:
        from workloads.config import MLPConfig
        from workloads.models import build_model

        return build_model(MLPConfig(d_in=32, width=64, depth=6, n_classes=10, skip=skip))
    except ImportError:
        return StandInMLP(d_in=32, width=64, depth=6, n_classes=10, skip=skip)


def test_residual_net_has_higher_gradient_coherence():
    g = torch.Generator().manual_seed(100)
    x, y = torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)
    means = {}
    for skip in (True, False):
        vals = []
        for seed in range(3):
            m = _toy(skip, seed)
            _, loss = m(x, y)
            loss.backward()
            col = MetricsCollector(m, MetricsConfig(instability=False))
            col.after_backward(0)
            rows, _ = col.collect(0)
            coh = _by(rows, "g.coh", "hidden")
            assert len(coh) == 5
            vals.append(sum(coh.values()) / len(coh))
        means[skip] = sum(vals) / len(vals)
    assert means[True] > 0.25 and abs(means[False]) < 0.1
    assert means[True] > means[False] + 0.2


# --- the real models (docs/contracts.md), when they import ---------------------------------


@pytest.mark.parametrize("preset", ["gpt_debug", "llama_tiny", "mlp_debug"])
def test_real_models(preset):
    models = pytest.importorskip("workloads.models")
    from workloads import config

    cfg = getattr(config, preset)()
    torch.manual_seed(0)
    m = models.build_model(cfg.model, vocab_size=65)
    if preset == "mlp_debug":
        x, y = torch.randn(8, 784), torch.randint(0, 10, (8,))
        probe, expect = x[:2], {"hidden"}
    else:
        x = torch.randint(0, 65, (2, cfg.model.block_size))
        y, probe = x, x[:2]
        expect = {"q", "k", "v", "o", "attn"} | ({"fc", "proj"} if preset == "gpt_debug"
                                                  else {"gate", "up", "down"})
    col = MetricsCollector(m, cfg.metrics, probe_batch=probe)
    _train(m, x, y, col, steps=2, lr=1e-3)
    for exact in (True, False):
        rows, sc = col.collect(2, exact_svd=exact)
        assert expect <= {r["module"] for r in rows}
        assert all(math.isfinite(r["value"]) for r in rows)
        metrics = {r["metric"] for r in rows}
        assert {"w.top1_v", "dw.top1_u", "cg.coh", "g.coh", "w.gram_in_c"} <= metrics
        for r in rows:
            if r["metric"] in ("w.top1_v", "w.top1_u", "w.gram_in", "w.gram_out"):
                assert -1e-6 <= r["value"] <= 1 + 1e-5
        if preset != "mlp_debug":
            kappa = _by(rows, "inst.kappa_max", "attn")
            rope = _by(rows, "inst.kappa_rope_max", "attn")
            assert all(rope[k] >= kappa[k] * (1 - 1e-5) for k in kappa)
            assert 0 <= sc["inst/entropy_min"] <= 1 + 1e-6 and sc["inst/max_logit"] > 0
        else:
            assert not [r for r in rows if r["module"] == "attn"]
