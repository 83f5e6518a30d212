"""build_optimizers: grouping, assignment mapping, Muon math, lr schedule, checkpoints;
docs/science.md §3.1, 3.4, 3.6 item 5. Stand-in models implement matrix_roles()
(docs/contracts.md)."""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from workloads.config import ConfigError, OptimConfig, gpt_debug
from workloads.geometry.dgram import dgram_violation
from workloads.geometry.msign import msign
from workloads.geometry.stiefel import stiefel_violation
from workloads.optim import (
    STRATEGIES,
    OptimizerGroupError,
    assert_partition,
    build_optimizers,
    muon_direction,
    validate_assignment,
)


@dataclass
class Role:  # MatrixRole(name, param, role, layer, kind) of docs/contracts.md
    name: str
    param: nn.Parameter
    role: str
    layer: int
    kind: str


class TinyGPT(nn.Module):
    """GPT parameter names and shapes of the contract: c_attn 3d x d, mlp.c_proj d x 4d."""

    def __init__(self, d: int = 16, n_layer: int = 2, vocab: int = 11, T: int = 8):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(T, d)
        self.blocks = nn.ModuleList()
        for _ in range(n_layer):
            b = nn.Module()
            b.attn, b.mlp = nn.Module(), nn.Module()
            b.attn.c_attn = nn.Linear(d, 3 * d, bias=False)
            b.attn.c_proj = nn.Linear(d, d, bias=False)
            b.mlp.c_fc = nn.Linear(d, 4 * d, bias=False)
            b.mlp.c_proj = nn.Linear(4 * d, d, bias=False)
            self.blocks.append(b)
        self.stream = nn.Module()
        self.stream.gain = nn.Parameter(torch.ones(d))
        self.stream.alpha = nn.Parameter(torch.tensor(0.5))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        h = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            q, k, v = b.attn.c_attn(h).chunk(3, dim=-1)
            att = torch.softmax((q @ k.mT) / q.shape[-1] ** 0.5, dim=-1)
            h = h + self.stream.alpha * b.attn.c_proj(att @ v)
            h = h + b.mlp.c_proj(torch.relu(b.mlp.c_fc(h * self.stream.gain)))
        logits = self.lm_head(h)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    def matrix_roles(self):
        roles = [Role("wte.weight", self.wte.weight, "in", -1, "io")]
        for i, b in enumerate(self.blocks):
            roles += [Role(f"blocks.{i}.attn.c_attn.weight", b.attn.c_attn.weight, "qkv", i,
                           "attention"),
                      Role(f"blocks.{i}.attn.c_proj.weight", b.attn.c_proj.weight, "o", i,
                           "attention"),
                      Role(f"blocks.{i}.mlp.c_fc.weight", b.mlp.c_fc.weight, "fc", i, "mlp"),
                      Role(f"blocks.{i}.mlp.c_proj.weight", b.mlp.c_proj.weight, "proj", i,
                           "mlp")]
        return roles


class TinyMLP(nn.Module):
    def __init__(self, width: int = 12, depth: int = 3):
        super().__init__()
        self.w_in = nn.Linear(5, width, bias=False)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))  # has bias
        self.w_out = nn.Linear(width, 3, bias=False)

    def matrix_roles(self):
        return ([Role("w_in.weight", self.w_in.weight, "in", -1, "io")]
                + [Role(f"blocks.{i}.weight", b.weight, "hidden", i, "mlp")
                   for i, b in enumerate(self.blocks)]
                + [Role("w_out.weight", self.w_out.weight, "out", 3, "io")])


def muon_cfg(assignment="unconstrained", **kw) -> OptimConfig:
    cfg = OptimConfig(name="muon", lr=1e-3)
    cfg.manifold.assignment = assignment
    for k, v in kw.items():
        setattr(cfg.manifold if k.startswith("dual") or k == "init_on_manifold" else cfg.muon,
                k, v)
    return cfg


def all_params(opts) -> list[nn.Parameter]:
    return [p for o in (opts.adamw, opts.muon) if o is not None
            for g in o.param_groups for p in g["params"]]


# --- assignment ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["heteroo", 3, {"*.attn.*": "sphere"}, {"": "stiefel"}])
def test_validate_assignment_rejects_with_one_line(bad):
    with pytest.raises(ConfigError) as e:
        validate_assignment(bad)
    assert "optim.manifold.assignment" in str(e.value) and "\n" not in str(e.value)


def test_hetero_maps_attention_to_stiefel_mlp_to_dgram_and_transposes_wide():
    model = TinyGPT()
    opts = build_optimizers(model, muon_cfg("hetero"))
    m = opts.managed
    assert set(m) == {f"blocks.{i}.{s}.weight" for i in range(2)
                      for s in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    for i in range(2):
        assert m[f"blocks.{i}.attn.c_attn.weight"].constraint == "stiefel"
        assert m[f"blocks.{i}.attn.c_proj.weight"].constraint == "stiefel"
        assert m[f"blocks.{i}.mlp.c_fc.weight"].constraint == "dgram"
        assert m[f"blocks.{i}.mlp.c_proj.weight"].constraint == "dgram"
        assert m[f"blocks.{i}.mlp.c_proj.weight"].transposed  # 16 x 64 -> tall 64 x 16
        assert not m[f"blocks.{i}.attn.c_attn.weight"].transposed
        # init_on_manifold, checked in tall form: c_attn^T c_attn = I, rows of mlp.c_proj orthogonal
        b = model.blocks[i]
        assert float(stiefel_violation(b.attn.c_attn.weight.detach())) < 1e-5
        assert float(dgram_violation(b.mlp.c_proj.weight.detach().mT)) < 1e-5
        assert float(stiefel_violation(b.mlp.c_proj.weight.detach().mT)) > 0.1  # not Stiefel
    inv = build_optimizers(TinyGPT(), muon_cfg("hetero_inv")).constraints
    assert inv["blocks.0.attn.c_attn.weight"] == "dgram"
    assert inv["blocks.1.mlp.c_proj.weight"] == "stiefel"


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_param_in_exactly_one_group(strategy):
    model = TinyGPT()
    opts = build_optimizers(model, muon_cfg(strategy))
    ids = [id(p) for p in all_params(opts)]
    trainable = {id(p) for p in model.parameters()}  # tied wte/lm_head counted once
    assert len(ids) == len(set(ids)) == len(trainable) and set(ids) == trainable
    assert len(opts.muon.param_groups[0]["params"]) + sum(
        len(g["params"]) for g in opts.muon.param_groups[1:]) == 8
    # embeddings (tied lm_head), wpe, gains and stream scalars stay on AdamW
    adam_ids = {id(p) for g in opts.adamw.param_groups for p in g["params"]}
    assert {id(model.wte.weight), id(model.wpe.weight), id(model.stream.alpha)} <= adam_ids


def test_partition_assert_fires_on_broken_grouping():
    model = TinyGPT()
    named = dict(model.named_parameters())
    params = list(named.values())
    assert_partition(named, [params[:3], params[3:]])
    with pytest.raises(OptimizerGroupError, match="missing"):
        assert_partition(named, [params[1:]])
    with pytest.raises(OptimizerGroupError, match="blocks.0.attn.c_attn.weight"):
        assert_partition(named, [params, [model.blocks[0].attn.c_attn.weight]])
    with pytest.raises(OptimizerGroupError, match="not in the model"):
        assert_partition(named, [params, [nn.Parameter(torch.zeros(2))]])

    class Doubled(TinyGPT):  # reports one matrix under two roles: would be stepped twice
        def matrix_roles(self):
            r = super().matrix_roles()
            return r + [Role("alias", self.blocks[0].mlp.c_fc.weight, "up", 0, "mlp")]

    with pytest.raises(OptimizerGroupError, match="several groups"):
        build_optimizers(Doubled(), muon_cfg("unconstrained"))


def test_explicit_pattern_map_and_unknown_pattern():
    cfg = muon_cfg({"blocks.0.*": "stiefel", "fc": "dgram", "attention": "dgram"})
    c = build_optimizers(TinyGPT(), cfg).constraints
    assert c["blocks.0.mlp.c_fc.weight"] == "stiefel"  # first match wins
    assert c["blocks.1.mlp.c_fc.weight"] == "dgram"  # by role
    assert c["blocks.1.attn.c_proj.weight"] == "dgram"  # by kind
    assert c["blocks.1.mlp.c_proj.weight"] == "none"  # unmatched
    with pytest.raises(ConfigError, match="'blocks.9.*' matches no"):
        build_optimizers(TinyGPT(), muon_cfg({"blocks.9.*": "stiefel"}))


def test_mlp_hidden_on_muon_io_on_adamw_and_decay_rules():
    model = TinyMLP()
    opts = build_optimizers(model, muon_cfg("hetero"))
    assert set(opts.constraints) == {"blocks.0.weight", "blocks.1.weight", "blocks.2.weight"}
    assert set(opts.constraints.values()) == {"dgram"}
    decay, nodecay = opts.adamw.param_groups
    assert {id(p) for p in decay["params"]} == {id(model.w_in.weight), id(model.w_out.weight)}
    assert decay["weight_decay"] == 0.1 and nodecay["weight_decay"] == 0.0
    assert all(p.ndim == 1 for p in nodecay["params"]) and len(nodecay["params"]) == 3
    assert opts.muon.param_groups[0]["weight_decay"] == 0.0  # manifold arms: no decay
    unc = build_optimizers(TinyMLP(), muon_cfg("unconstrained"))
    assert unc.muon.param_groups[0]["weight_decay"] == 0.1
    adam = build_optimizers(TinyMLP(), OptimConfig(name="adamw"))
    assert adam.muon is None and len(all_params(adam)) == len(list(TinyMLP().parameters()))


# --- Muon math ----------------------------------------------------------------------------


def test_momentum_forms_against_hand_recursion():
    gs = [torch.full((2, 2), float(v)) for v in (1.0, 2.0, -1.0)]
    mu = 0.9
    for form, nesterov in (("sum", True), ("sum", False), ("ema", True), ("ema", False)):
        buf, ref_buf = torch.zeros(2, 2), 0.0
        for g in gs:
            d = muon_direction(buf, g, mu, nesterov, form)
            gv = float(g[0, 0])
            if form == "sum":
                ref_buf = mu * ref_buf + gv
                ref = gv + mu * ref_buf if nesterov else ref_buf
            else:
                ref_buf = mu * ref_buf + (1 - mu) * gv
                ref = (1 - mu) * gv + mu * ref_buf if nesterov else ref_buf
            assert float(d[0, 0]) == pytest.approx(ref) and float(buf[0, 0]) == pytest.approx(
                ref_buf)


def test_unconstrained_step_is_paper_b_update_and_lr_follows_schedule():
    model = TinyMLP()
    opts = build_optimizers(model, muon_cfg("unconstrained", msign="svd"))
    opts.set_lr(5e-4)  # half of optim.lr -> muon lr 0.01
    assert opts.muon.param_groups[0]["lr"] == pytest.approx(0.01)
    assert opts.adamw.param_groups[0]["lr"] == pytest.approx(5e-4)
    W0 = model.blocks[1].weight.detach().clone()
    g = torch.randn(12, 12, generator=torch.Generator().manual_seed(0))
    model.blocks[1].weight.grad = g.clone()
    opts.muon.step()
    # first step, sum form + Nesterov: G~ = g + 0.95 g; W1 = (1 - lr wd) W0 - lr msign(G~)
    ref = (1 - 0.01 * 0.1) * W0 - 0.01 * msign(1.95 * g, method="svd")
    assert torch.allclose(model.blocks[1].weight.detach(), ref, atol=1e-6)


def test_state_dict_round_trip_and_health():
    torch.manual_seed(0)
    model = TinyGPT()
    x = torch.randint(0, 11, (4, 8))
    cfg = muon_cfg("hetero", dual_steps=5)
    opts = build_optimizers(model, cfg)

    def train_step(m, o):
        o.zero_grad()
        m(x, x)[1].backward()
        o.step()

    train_step(model, opts)
    twin = copy.deepcopy(model)
    twin_opts = build_optimizers(twin, muon_cfg("hetero", dual_steps=5, init_on_manifold=False))
    twin_opts.load_state_dict(copy.deepcopy(opts.state_dict()))
    for m, o in ((model, opts), (twin, twin_opts)):
        train_step(m, o)
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), n
    h = opts.health()
    assert set(h) == set(opts.managed)  # hetero: every matrix is constrained
    for name, row in h.items():
        assert row["constraint"] == opts.constraints[name]
        assert 0 <= row["dual_residual"] < 1.0 and 0 <= row["retraction_displacement"] < 0.5
    stats = opts.stats()
    assert stats["dual_residual_max"] == max(r["dual_residual"] for r in h.values())
    assert stats["retraction_displacement/blocks.1.mlp.c_proj.weight"] == (
        h["blocks.1.mlp.c_proj.weight"]["retraction_displacement"])
    assert build_optimizers(TinyGPT(), muon_cfg("unconstrained")).health() == {}


def test_dual_stats_and_rows_exposed_per_matrix():
    torch.manual_seed(0)
    model = TinyGPT()
    x = torch.randint(0, 11, (4, 8))
    opts = build_optimizers(model, muon_cfg("hetero"))  # default dual: fast, tol 1e-4
    model(x, x)[1].backward()
    opts.step()
    stats = opts.muon.dual_stats()
    assert [n for n, _, _ in stats] == [n for g in opts.muon.param_groups for n in g["names"]]
    assert {n for n, _, _ in stats} == set(opts.managed)
    for _, residual, passes in stats:
        # a cold first step on a tiny model's rank-deficient gradients: fast mode's fp32
        # residual, as logged (its tol 1e-4 is met from the warm-started steps on)
        assert residual < 1e-3 and 1 <= passes <= 20
    rows = opts.dual_rows(step=7)
    assert len(rows) == 3 * len(stats)
    assert {r["metric"] for r in rows} == {"optim/dual_residual", "optim/dual_passes",
                                           "optim/dual_mu"}
    row = next(r for r in rows if r["metric"] == "optim/dual_passes" and r["module"] == "qkv")
    assert set(row) == {"step", "metric", "module", "layer", "next_layer", "value"}
    assert row["step"] == 7 and row["next_layer"] == -1 and row["layer"] in (0, 1)
    assert opts.stats()["dual_passes_max"] == max(p for _, _, p in stats)


# --- the real model (written by the models room), when present ----------------------------

HAVE_GPT = importlib.util.find_spec("workloads.models.gpt") is not None


@pytest.mark.skipif(not HAVE_GPT, reason="workloads.models.gpt not written yet")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_trains_gpt_debug(strategy):
    from workloads.models import build_model

    torch.manual_seed(0)
    wl = gpt_debug()
    model = build_model(wl.model, vocab_size=65)
    wl.optim.name, wl.optim.manifold.assignment = "muon", strategy
    wl.optim.manifold.dual_steps = 5  # docs/science.md §1.2 Tiny-B
    opts = build_optimizers(model, wl.optim)
    assert len(opts.managed) == 4 * wl.model.n_layer
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 65, (4, 32), generator=g)
    y = torch.randint(0, 65, (4, 32), generator=g)
    losses = []
    for _ in range(30):
        opts.set_lr(wl.optim.lr)
        opts.zero_grad()
        loss = model(x, y)[1]
        losses.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opts.step()
    assert losses[-1] < losses[0] - 0.5, losses[::5]


def test_init_match_starts_every_assignment_from_the_same_matrices():
    """optim.manifold.init_match: the unconstrained arm starts on Stiefel too, and the
    constrained arms' own retraction leaves a Stiefel point where it is: one start for all."""
    starts = {}
    for a in ("unconstrained", "all_stiefel", "all_dgram", "hetero"):
        torch.manual_seed(0)
        model = TinyGPT()
        cfg = muon_cfg(a)
        cfg.manifold.init_match = True
        opts = build_optimizers(model, cfg)
        starts[a] = {n: p.detach().clone() for n, p in model.named_parameters()
                     if n in opts.managed}
    ref = starts["unconstrained"]
    for W in ref.values():
        T = W.mT if W.shape[0] < W.shape[1] else W
        assert float(stiefel_violation(T)) < 1e-5
    for a, s in starts.items():
        for n, W in s.items():
            assert torch.allclose(W, ref[n], atol=1e-5), (a, n)
    torch.manual_seed(0)
    plain = TinyGPT()
    build_optimizers(plain, muon_cfg("unconstrained"))
    sv = torch.linalg.svdvals(plain.blocks[0].attn.c_attn.weight.detach())
    assert float(sv.max() / sv.min()) > 2.0  # unmatched: the unconstrained start is not on it
