"""GPT / Llama models wired through every residual family (docs/science.md §1.1, §2.7, §4.6)."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from workloads.config import ConfigError, GPTConfig, gpt2_small, gpt_debug, llama_tiny
from workloads.models import MatrixRole, build_model
from workloads.models.gpt import GPT, apply_rope, rope_tables
from workloads.residual import RESIDUALS

VOCAB = 65
CASES = [{"family": f} for f in RESIDUALS] + [
    {"family": "spheret", "p": p} for p in (0.5, 2.0, math.inf)
]


def _cfg(arch="gpt", residual=None, **kw) -> GPTConfig:
    cfg = gpt_debug().model  # 2 layers, 2 heads, d = 64, block 32
    return dataclasses.replace(cfg, arch=arch, residual=residual or {"family": "pre_ln"}, **kw)


def _batch(seed=0, B=8, T=32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (B, T), generator=g),
            torch.randint(0, VOCAB, (B, T), generator=g))


def _id(res):
    return "-".join(str(v) for v in res.values())


# --- training ---------------------------------------------------------------------------------


TRAIN_CASES = [("gpt", r) for r in CASES] + [("llama", {"family": f}) for f in RESIDUALS]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("arch, residual", TRAIN_CASES,
                         ids=[f"{a}-{_id(r)}" for a, r in TRAIN_CASES])
def test_initial_loss_and_30_adamw_steps(arch, residual):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(_cfg(arch, residual), vocab_size=VOCAB)
    x, y = _batch(B=4)  # gpt-debug shape; a small fixed batch keeps 17 cases fast
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    losses = []
    for _ in range(30):
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for n, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), n
        opt.step()
        losses.append(loss.item())
    assert abs(losses[0] - math.log(VOCAB)) < 0.3
    assert losses[-1] < losses[0] - 1.0  # memorising one fixed batch
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= 24  # mostly monotone


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_spheret_under_bf16_autocast_keeps_fp32_stream(arch):
    torch.manual_seed(0)
    model = build_model(_cfg(arch, {"family": "spheret", "p": 1.0}), vocab_size=VOCAB)
    model.stream.record_stats = True
    x, y = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(x, y)
    assert torch.isfinite(loss) and abs(loss.item() - math.log(VOCAB)) < 0.3
    st = model.stream.stats()
    assert st["norm_err"] < 1e-5  # bf16 arithmetic would be ~4e-3
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


# --- shapes, names, counts --------------------------------------------------------------------


def _gpt2_small(n_layer=12):
    cfg = dataclasses.replace(gpt2_small().model, n_layer=n_layer)
    with torch.device("meta"):
        return build_model(cfg, vocab_size=50257)


@pytest.mark.parametrize("n_layer, total, no_wpe", [(12, 124.4, 123.6), (24, 209.3, 208.5)])
def test_gpt2_parameter_counts(n_layer, total, no_wpe):
    model = _gpt2_small(n_layer)
    assert model.config.vocab_size == 50304
    assert round(model.num_params() / 1e6, 1) == total
    assert round(model.num_params(non_embedding=True) / 1e6, 1) == no_wpe
    d, V = 768, 50304  # 12 L d^2 + V d + T d + (2L + 1) d gains (bias=False)
    assert model.num_params() == 12 * n_layer * d * d + V * d + 1024 * d + (2 * n_layer + 1) * d


def test_llama_parameter_count_and_names():
    cfg = dataclasses.replace(llama_tiny().model, ffn_hidden=0)
    model = build_model(cfg, vocab_size=VOCAB)
    d, L, f = 64, 2, 192  # 8 * 64 / 3 = 170.7 -> 192
    assert model.blocks[0].mlp.gate.weight.shape == (f, d)
    expect = L * (4 * d * d + 3 * d * f) + 2 * VOCAB * d + (2 * L + 1) * d
    assert model.num_params() == expect and model.wpe is None
    names = {n for n, _ in model.named_parameters()}
    for i in range(L):
        assert {f"blocks.{i}.attn.{m}.weight" for m in "qkvo"} <= names
        assert {f"blocks.{i}.mlp.{m}.weight" for m in ("gate", "up", "down")} <= names
    assert {"wte.weight", "lm_head.weight", "stream.ln.0.weight", "stream.ln_f.weight"} <= names
    assert not any(n.endswith(".bias") for n in names)


def test_gpt_names_tying_and_stream_parameters():
    model = build_model(_cfg(residual={"family": "spheret"}, bias=True), vocab_size=VOCAB)
    names = dict(model.named_parameters())
    assert model.lm_head.weight is model.wte.weight and "lm_head.weight" not in names
    assert names["blocks.1.attn.c_attn.weight"].shape == (3 * 64, 64)
    assert {"stream.s", "stream.g", "stream.ln_f.weight", "stream.ln_f.bias",
            "blocks.0.mlp.c_fc.bias"} <= set(names)
    untied = build_model(_cfg(tie_embeddings=False), vocab_size=VOCAB)
    assert untied.lm_head.weight is not untied.wte.weight


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_matrix_roles(arch):
    model = build_model(_cfg(arch, tie_embeddings=arch == "gpt"), vocab_size=VOCAB)
    roles = model.matrix_roles()
    assert all(isinstance(r, MatrixRole) for r in roles)
    params = dict(model.named_parameters())
    for r in roles:
        assert params[r.name] is r.param
    got = [(r.name, r.role, r.layer, r.kind, tuple(r.param.shape)) for r in roles]
    d, f = 64, (256 if arch == "gpt" else 192)
    want = [("wte.weight", "in", -1, "io", (VOCAB, d))]
    for i in range(2):
        b = f"blocks.{i}"
        if arch == "gpt":
            want += [(f"{b}.attn.c_attn.weight", "qkv", i, "attention", (3 * d, d)),
                     (f"{b}.attn.c_proj.weight", "o", i, "attention", (d, d)),
                     (f"{b}.mlp.c_fc.weight", "fc", i, "mlp", (f, d)),
                     (f"{b}.mlp.c_proj.weight", "proj", i, "mlp", (d, f))]
        else:
            want += [(f"{b}.attn.{m}.weight", m, i, "attention", (d, d)) for m in "qkvo"]
            want += [(f"{b}.mlp.gate.weight", "gate", i, "mlp", (f, d)),
                     (f"{b}.mlp.up.weight", "up", i, "mlp", (f, d)),
                     (f"{b}.mlp.down.weight", "down", i, "mlp", (d, f))]
    if arch == "llama":
        want.append(("lm_head.weight", "out", 2, "io", (VOCAB, d)))
    assert got == want


def test_init_std_follows_nanogpt():
    torch.manual_seed(0)
    cfg = dataclasses.replace(_cfg(), n_embd=256, n_head=4, n_layer=4)
    model = build_model(cfg, vocab_size=VOCAB)
    proj = 0.02 / math.sqrt(8)
    for name, p in model.named_parameters():
        if p.dim() < 2:
            continue
        want = proj if name.endswith("c_proj.weight") else 0.02
        assert abs(p.std().item() / want - 1) < 0.05, name


def test_build_model_vocab_handling():
    with pytest.raises(ConfigError, match="model.vocab_size"):
        build_model(_cfg())
    with pytest.raises(ConfigError, match="model.arch: 'rnn'"):
        build_model(_cfg(arch="rnn"), vocab_size=VOCAB)
    assert build_model(_cfg(vocab_size=100)).wte.weight.shape[0] == 100
    assert build_model(_cfg(), vocab_size=VOCAB).wte.weight.shape[0] == VOCAB


def test_build_model_dispatches_mlp():
    mlp = pytest.importorskip("workloads.models.mlp")
    from workloads.config import MLPConfig

    assert isinstance(build_model(MLPConfig(width=16, depth=2)), mlp.ResidualMLP)


# --- attention --------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_scores_reproduce_attention(arch):
    torch.manual_seed(0)
    model = build_model(_cfg(arch, bias=arch == "gpt"), vocab_size=VOCAB).double()
    attn = model.blocks[1].attn
    x = torch.randn(3, 20, 64, dtype=torch.float64)
    s = attn.scores(x)
    assert s.shape == (3, 2, 20, 20)
    causal = torch.ones(20, 20, dtype=torch.bool).tril()
    w = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
    if arch == "gpt":
        v = attn.c_attn(x)[..., 128:]
    else:
        v = attn.v(x)
    v = v.view(3, 20, 2, 32).transpose(1, 2)
    y = (w @ v).transpose(1, 2).reshape(3, 20, 64)
    ref = attn.c_proj(y) if arch == "gpt" else attn.o(y)
    assert (attn(x) - ref).abs().max() < 1e-12
    # scores are fp32 even for fp32/bf16 inputs
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.float().blocks[1].attn.scores(x.float()).dtype == torch.float32


def test_rope_is_a_relative_position_rotation():
    cos, sin = rope_tables(16, 8, 10000.0)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(8, generator=g), torch.randn(8, generator=g)
    Q = apply_rope(q.expand(1, 1, 16, 8), cos, sin)[0, 0]  # same content at every position
    K = apply_rope(k.expand(1, 1, 16, 8), cos, sin)[0, 0]
    s = Q @ K.T
    assert torch.allclose(Q.norm(dim=-1), q.norm().expand(16), atol=1e-5)
    for off in (-3, 0, 5):  # scores depend only on i - j
        diag = torch.diagonal(s, offset=off)
        assert torch.allclose(diag, diag[0].expand_as(diag), atol=1e-4)
    assert torch.allclose(Q[0], q) and not torch.allclose(Q[1], q)
    # position 1, pair (0, 4) rotates by angle 1 (theta^0)
    c, sn = math.cos(1.0), math.sin(1.0)
    assert torch.allclose(Q[1, [0, 4]], torch.tensor([c * q[0] - sn * q[4], sn * q[0] + c * q[4]]),
                          atol=1e-6)


def test_forward_shapes_and_block_size_check():
    model = build_model(_cfg(), vocab_size=VOCAB)
    x, y = _batch(T=16)
    logits, loss = model(x)
    assert logits.shape == (8, 16, VOCAB) and loss is None
    _, loss = model(x, y)
    ref = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
    assert torch.allclose(loss, ref)
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 33, dtype=torch.long))
    assert isinstance(model, GPT)
