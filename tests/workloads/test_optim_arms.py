"""Paper C's optimiser arms (docs/science.md §4.5): Adam with beta2 = 0 and SGD with momentum,
both built by ``build_optimizers``; stepped by hand against the update rules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workloads.config import ConfigError, OptimConfig, apply_overrides, mlp_debug
from workloads.optim import build_optimizers
from workloads.validate import validate


class Lin(nn.Module):
    """One matrix W (4 x 3) and a scalar gain; loss <W, A> + g * c with fixed A, c."""

    def __init__(self) -> None:
        super().__init__()
        self.W = nn.Parameter(torch.randn(4, 3, dtype=torch.float64))
        self.g = nn.Parameter(torch.ones(1, dtype=torch.float64))

    def matrix_roles(self) -> list:
        return []


def _grads(model: Lin, A: torch.Tensor) -> None:
    model.W.grad = A.clone()
    model.g.grad = torch.full_like(model.g, 0.5)


def test_sgd_momentum_is_heavy_ball():
    torch.manual_seed(0)
    m = Lin()
    opts = build_optimizers(m, OptimConfig(name="sgd", lr=0.1, sgd_momentum=0.9,
                                           weight_decay=0.0))
    assert isinstance(opts.adamw, torch.optim.SGD) and opts.muon is None
    W0 = m.W.detach().clone()
    A1, A2 = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    _grads(m, A1)
    opts.step()
    assert torch.allclose(m.W, W0 - 0.1 * A1)  # buf = g on the first step
    _grads(m, A2)
    opts.step()
    assert torch.allclose(m.W, W0 - 0.1 * A1 - 0.1 * (0.9 * A1 + A2))
    opts.set_lr(0.05)
    assert all(g["lr"] == 0.05 for g in opts.adamw.param_groups)


def test_adam_beta2_zero_divides_by_the_current_gradient():
    """beta2 = 0: v_t = g_t^2 (bias correction 1), so the step is lr * m_hat / (|g_t| + eps)."""
    torch.manual_seed(1)
    m = Lin()
    opts = build_optimizers(m, OptimConfig(lr=1e-2, beta1=0.9, beta2=0.0, eps=1e-8,
                                           weight_decay=0.0))
    W0 = m.W.detach().clone()
    A1, A2 = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    _grads(m, A1)
    opts.step()
    W1 = W0 - 1e-2 * A1 / (A1.abs() + 1e-8)  # a sign step on the first update
    assert torch.allclose(m.W, W1, atol=1e-12)
    _grads(m, A2)
    opts.step()
    m_hat = (0.9 * 0.1 * A1 + 0.1 * A2) / (1 - 0.9**2)
    assert torch.allclose(m.W, W1 - 1e-2 * m_hat / (A2.abs() + 1e-8), atol=1e-12)


def test_sgd_is_rotation_equivariant_adam_is_not():
    """W -> R W with gradients R G: SGD's update rotates with it, Adam's (coordinate-wise) not."""
    g = torch.Generator().manual_seed(2)
    R = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))[0]
    A = torch.randn(4, 3, generator=g, dtype=torch.float64)
    for name, beta2, equivariant in (("sgd", 0.999, True), ("adamw", 0.0, False),
                                     ("adamw", 0.999, False)):
        deltas = []
        for rot in (torch.eye(4, dtype=torch.float64), R):
            torch.manual_seed(3)
            m = Lin()
            with torch.no_grad():
                m.W.copy_(rot @ m.W)
            opts = build_optimizers(m, OptimConfig(name=name, lr=1e-2, beta2=beta2,
                                                   weight_decay=0.0))
            W0 = m.W.detach().clone()
            for _ in range(2):
                _grads(m, rot @ A)
                opts.step()
            deltas.append(m.W.detach() - W0)
        assert torch.allclose(deltas[1], R @ deltas[0], atol=1e-10) == equivariant, name


@pytest.mark.parametrize("key,value,msg", [
    ("optim.beta2", 1.0, "optim.beta2: must be in [0, 1), got 1.0"),
    ("optim.beta1", -0.1, "optim.beta1: must be in [0, 1), got -0.1"),
    ("optim.sgd_momentum", 1.5, "optim.sgd_momentum: must be in [0, 1), got 1.5"),
    ("optim.name", "rmsprop", "optim.name: 'rmsprop' is not one of adamw, muon, sgd"),
])
def test_bad_optimiser_values(key, value, msg):
    with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace(")", r"\)")):
        validate(apply_overrides(mlp_debug(), {key: value}))


def test_arms_validate():
    validate(apply_overrides(mlp_debug(), {"optim.name": "sgd", "optim.lr": 0.05}))
    validate(apply_overrides(mlp_debug(), {"optim.beta2": 0.0}))
