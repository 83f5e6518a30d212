"""The residual MLP of SCIENCE.md 4.5: shapes, block semantics, symmetry, init, training."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import erf

from workloads.config import ConfigError, MLPConfig
from workloads.models import MatrixRole
from workloads.models.mlp import ACTIVATIONS, NORMS, Block, ResidualMLP, radial, radial_rms


@pytest.mark.parametrize("norm", list(NORMS))
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_forward_shapes(activation, norm):
    torch.manual_seed(0)
    m = ResidualMLP(MLPConfig(width=32, depth=3, activation=activation, norm=norm))
    x, y = torch.rand(5, 784), torch.randint(0, 10, (5,))
    logits, loss = m(x, y)
    assert logits.shape == (5, 10) and loss.shape == () and torch.isfinite(loss)
    assert m(x)[1] is None
    assert torch.allclose(m(x.view(5, 1, 28, 28))[0], logits)  # images are flattened
    names = {n for n, _ in m.named_parameters()}
    assert {"w_in.weight", "w_out.weight", "blocks.2.fc.weight"} <= names
    assert not any(n.endswith("bias") for n in names)
    assert ("blocks.0.norm.weight" in names) == (norm == "layernorm")


# --- block semantics against a float64 numpy reference -------------------------------------


def _ref_forward(x, w_in, ws, w_out, act, norm, skip):
    """Independent numpy float64 forward of the model definition."""
    acts = {
        "relu": lambda z: np.maximum(z, 0),
        "none": lambda z: z,
        "radial": lambda z: z * np.tanh(np.linalg.norm(z, axis=-1, keepdims=True)),
        "radial_rms": lambda z: z * np.tanh(
            np.linalg.norm(z, axis=-1, keepdims=True) / np.sqrt(z.shape[-1])),
        "silu": lambda z: z / (1 + np.exp(-z)),
        "gelu": lambda z: 0.5 * z * (1 + erf(z / np.sqrt(2))),
    }
    norms = {
        "none": lambda h: h,
        "rmsnorm": lambda h: h / np.sqrt((h**2).mean(-1, keepdims=True) + 1e-5),
        "layernorm": lambda h: (h - h.mean(-1, keepdims=True))
        / np.sqrt(h.var(-1, keepdims=True) + 1e-5),
    }
    h = x @ w_in.T
    for w in ws:
        u = acts[act](norms[norm](h) @ w.T)
        h = h + u if skip else u
    return h @ w_out.T


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("norm", list(NORMS))
def test_matches_reference(skip, activation, norm):
    torch.manual_seed(1)
    cfg = MLPConfig(d_in=5, width=3, depth=2, n_classes=4, activation=activation, norm=norm,
                    skip=skip)
    m = ResidualMLP(cfg).double()
    x = torch.randn(7, 5, dtype=torch.float64)
    ws = [b.fc.weight.detach().numpy() for b in m.blocks]
    ref = _ref_forward(x.numpy(), m.w_in.weight.detach().numpy(), ws,
                       m.w_out.weight.detach().numpy(), activation, norm, skip)
    np.testing.assert_allclose(m(x)[0].detach().numpy(), ref, rtol=1e-10, atol=1e-12)


def test_skip_by_hand():
    """width 2, depth 1, relu, identity w_in/w_out: h0 = (1, 2), W h0 = (3, -1)."""
    for skip, expected in ((True, [4.0, 2.0]), (False, [3.0, 0.0])):
        m = ResidualMLP(MLPConfig(d_in=2, width=2, depth=1, n_classes=2, skip=skip))
        with torch.no_grad():
            m.w_in.weight.copy_(torch.eye(2))
            m.w_out.weight.copy_(torch.eye(2))
            m.blocks[0].fc.weight.copy_(torch.tensor([[1.0, 1.0], [-1.0, 0.0]]))
        # skip: h0 + relu(W h0) = (1, 2) + (3, 0); no skip: relu(W h0) = (3, 0)
        assert m(torch.tensor([[1.0, 2.0]]))[0][0].tolist() == expected


# --- symmetry -----------------------------------------------------------------------------


def _orthogonal(d, seed):
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


@pytest.mark.parametrize("rho", [radial, radial_rms])
def test_radial_is_orthogonally_equivariant(rho):
    R = _orthogonal(16, 0)
    x = torch.randn(9, 16, dtype=torch.float64) * 0.5
    assert torch.allclose(rho(x @ R.T), rho(x) @ R.T, atol=1e-12)
    # and it is not coordinate-wise: relu fails the same test
    assert not torch.allclose(torch.relu(x @ R.T), torch.relu(x) @ R.T, atol=1e-3)


def test_radial_values():
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)  # ||x|| = 5
    assert torch.allclose(radial(x), x * math.tanh(5.0))
    assert torch.allclose(radial_rms(x), x * math.tanh(5.0 / math.sqrt(2)))


@pytest.mark.parametrize("norm,equivariant", [("none", True), ("rmsnorm", True),
                                              ("layernorm", False)])
def test_block_global_rotation_symmetry(norm, equivariant):
    """Res+Radial with RMSNorm keeps the global O(d) symmetry W -> R W R^T; LayerNorm breaks it."""
    torch.manual_seed(0)
    d = 12
    block = Block(d, "radial_rms", norm, skip=True).double()
    rotated = Block(d, "radial_rms", norm, skip=True).double()
    R = _orthogonal(d, 1)
    with torch.no_grad():
        rotated.fc.weight.copy_(R @ block.fc.weight @ R.T)
    h = torch.randn(6, d, dtype=torch.float64)
    same = torch.allclose(rotated(h @ R.T), block(h) @ R.T, atol=1e-10)
    assert same == equivariant


# --- init ---------------------------------------------------------------------------------


@pytest.mark.parametrize("c", [0.25, 0.5, 1.0, 2.0])
def test_init_std(c):
    torch.manual_seed(0)
    m = ResidualMLP(MLPConfig(width=256, depth=16, init_scale=c))
    hidden = torch.cat([b.fc.weight.flatten() for b in m.blocks])  # 1M samples
    assert abs(hidden.std().item() / (c / 16) - 1) < 0.01
    assert abs(hidden.mean().item()) < 0.01 * c / 16
    assert abs(m.w_in.weight.std().item() * 28 - 1) < 0.02  # N(0, 1/784)
    assert abs(m.w_out.weight.std().item() * 16 - 1) < 0.05  # N(0, 1/256)


def test_matrix_roles():
    m = ResidualMLP(MLPConfig(width=16, depth=3))
    roles = m.matrix_roles()
    assert all(isinstance(r, MatrixRole) for r in roles)
    params = dict(m.named_parameters())
    assert [(r.name, r.role, r.layer, r.kind) for r in roles] == [
        ("w_in.weight", "in", -1, "io"),
        ("blocks.0.fc.weight", "hidden", 0, "mlp"),
        ("blocks.1.fc.weight", "hidden", 1, "mlp"),
        ("blocks.2.fc.weight", "hidden", 2, "mlp"),
        ("w_out.weight", "out", 3, "io"),
    ]
    assert all(params[r.name] is r.param for r in roles)
    assert m.w_in.weight.shape == (16, 784) and m.w_out.weight.shape == (10, 16)


def test_bad_config():
    with pytest.raises(ConfigError, match="model.activation: 'tanh' is not one of"):
        ResidualMLP(MLPConfig(activation="tanh"))
    with pytest.raises(ConfigError, match="model.norm: 'batchnorm' is not one of"):
        ResidualMLP(MLPConfig(norm="batchnorm"))


def test_radial_stats():
    torch.manual_seed(0)
    x = torch.rand(32, 784)
    means = {}
    for act in ("radial", "radial_rms"):
        m = ResidualMLP(MLPConfig(width=256, depth=4, activation=act))
        m(x)
        s = m.stats()
        assert set(s) == {"tanh_mean", "tanh_mean/0", "tanh_mean/1", "tanh_mean/2", "tanh_mean/3"}
        assert 0 < s["tanh_mean"] <= 1
        means[act] = s["tanh_mean"]
    # SCIENCE 4.5 caveat: raw ||x|| saturates tanh at width 256; the rms variant does not
    assert means["radial"] > 0.99 > means["radial_rms"]
    relu = ResidualMLP(MLPConfig(width=16, depth=2))
    relu(x)
    assert relu.stats() == {}


# --- training -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mnist_batch(tmp_path_factory):
    from workloads.data import load_mnist

    data = load_mnist(cache_dir=str(tmp_path_factory.mktemp("cache")))
    g = torch.Generator().manual_seed(0)
    idx = torch.randperm(60000, generator=g)[:128]
    return data.x_train[idx], data.y_train[idx]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_adam_reduces_loss(mnist_batch, activation):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y = mnist_batch
    m = ResidualMLP(MLPConfig(width=64, depth=4, activation=activation))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    losses = []
    for _ in range(30):
        _, loss = m(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert math.isfinite(losses[-1]) and losses[-1] < 0.25 * losses[0], losses[::10]
