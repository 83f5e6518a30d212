"""The toy residual MLP of docs/science.md §4.5 and its ablation arms.

    x (B, 784) -> w_in -> h (B, width) -> depth x Block -> w_out -> logits (B, n_classes)
    Block, skip=True:   h <- h + phi(W_l N(h))      (Res+Act, Res+None, Res+Radial, norm arms)
    Block, skip=False:  h <- phi(W_l N(h))          (NoRes)

No biases anywhere (LayerNorm keeps its gain, drops its bias; RMSNorm has no gain, so it stays
O(d)-equivariant). Init (docs/science.md §4.5, "default init, corrected"):
W_l ~ N(0, (init_scale * c)^2 / width) with
- skip (residual arms): c = 1/sqrt(depth), so each block adds ~1/depth to ||h||^2 and the stream
  grows by a bounded factor (about e^(1/2) for Res+None) instead of 2^(depth/2);
- no skip (NoRes): c = He's gain sqrt 2 for the ReLU family, which keeps E||h||^2 constant
  through ReLU blocks (``activation_gain``);
- ``init="fan_in"``: c = 1, the pre-fix init (first losses in the hundreds at depth 16).
w_in ~ N(0, 1/d_in) and w_out ~ N(0, 1/width) (fan-in, variance preserving) [DESIGN].
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workloads.config import ConfigError, MLPConfig
from workloads.models.roles import MatrixRole

__all__ = ["ResidualMLP", "Block", "ACTIVATIONS", "NORMS", "radial", "radial_rms", "radial_gate",
           "INITS", "hidden_init_gain", "activation_gain"]


# --- activations (pure functions over the last dim) ---------------------------------------


def radial_gate(x: Tensor, scale: float = 1.0) -> Tensor:
    """tanh(||x|| / scale), shape (..., 1): depends on x only through its norm."""
    return torch.tanh(torch.linalg.vector_norm(x, dim=-1, keepdim=True) / scale)


def radial(x: Tensor) -> Tensor:
    """rho(x) = x tanh(||x||); exactly O(d)-equivariant, rho(Rx) = R rho(x)."""
    return x * radial_gate(x)


def radial_rms(x: Tensor) -> Tensor:
    """rho_rms(x) = x tanh(||x|| / sqrt(d)): keeps tanh away from saturation at width d."""
    return x * radial_gate(x, math.sqrt(x.shape[-1]))


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "silu": F.silu,
    "none": lambda x: x,
    "radial": radial,
    "radial_rms": radial_rms,
    # zero-mean and odd, per coordinate: breaks the rotation symmetry as ReLU does, without
    # ReLU's non-negative outputs that lean top vectors to the all-ones direction (§4.5)
    "tanh": torch.tanh,
}
NORMS: dict[str, Callable[[int], nn.Module]] = {
    "none": lambda d: nn.Identity(),
    "layernorm": lambda d: nn.LayerNorm(d, eps=1e-5, bias=False),
    "rmsnorm": lambda d: nn.RMSNorm(d, eps=1e-5, elementwise_affine=False),
}


# --- init -------------------------------------------------------------------------------

INITS = ("depth_scaled", "fan_in")


def activation_gain(activation: str) -> float:
    """He-style gain of a NoRes block: sqrt 2 for the ReLU family, 1 otherwise.

    Exact for ReLU (positively homogeneous: E[relu(z)^2] = E[z^2] / 2 at any scale). GELU and
    SiLU are not homogeneous, so no scale-free gain exists; sqrt 2 is the usual He choice. The
    identity, tanh (slope 1 at 0) and the radial activations (gate depends on ||x||, not per
    coordinate) get 1.
    """
    return math.sqrt(2.0) if activation in ("relu", "gelu", "silu") else 1.0


def hidden_init_gain(cfg: MLPConfig) -> float:
    """c of W_l ~ N(0, (init_scale * c)^2 / width), before ``init_scale`` (see the docstring)."""
    if cfg.init == "fan_in":
        return 1.0
    return 1.0 / math.sqrt(cfg.depth) if cfg.skip else activation_gain(cfg.activation)


# --- the model ----------------------------------------------------------------------------


class Block(nn.Module):
    """h <- h + phi(fc(norm(h))) (skip) or phi(fc(norm(h))) (no skip); h is (B, width)."""

    def __init__(self, width: int, activation: str, norm: str, skip: bool) -> None:
        super().__init__()
        self.norm = NORMS[norm](width)
        self.fc = nn.Linear(width, width, bias=False)
        self.activation, self.skip = activation, skip
        # mean radial gate of the last forward (a detached scalar; no host sync until read)
        self.tanh_mean: Tensor | None = None

    def forward(self, h: Tensor) -> Tensor:
        z = self.fc(self.norm(h))  # (B, width)
        if self.activation in ("radial", "radial_rms"):
            scale = 1.0 if self.activation == "radial" else math.sqrt(z.shape[-1])
            gate = radial_gate(z, scale)  # (B, 1)
            self.tanh_mean = gate.detach().float().mean()
            u = z * gate
        else:
            u = ACTIVATIONS[self.activation](z)
        return h + u if self.skip else u


class ResidualMLP(nn.Module):
    """``forward(x, targets=None) -> (logits, loss)``; x is (B, d_in) or (B, 1, 28, 28)."""

    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        if cfg.activation not in ACTIVATIONS:
            raise ConfigError(
                f"model.activation: {cfg.activation!r} is not one of {', '.join(ACTIVATIONS)}"
            )
        if cfg.norm not in NORMS:
            raise ConfigError(f"model.norm: {cfg.norm!r} is not one of {', '.join(NORMS)}")
        if cfg.init not in INITS:
            raise ConfigError(f"model.init: {cfg.init!r} is not one of {', '.join(INITS)}")
        self.cfg = cfg
        self.w_in = nn.Linear(cfg.d_in, cfg.width, bias=False)
        self.blocks = nn.ModuleList(
            Block(cfg.width, cfg.activation, cfg.norm, cfg.skip) for _ in range(cfg.depth)
        )
        self.w_out = nn.Linear(cfg.width, cfg.n_classes, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        c = self.cfg
        std = c.init_scale * hidden_init_gain(c) / math.sqrt(c.width)
        nn.init.normal_(self.w_in.weight, std=1.0 / math.sqrt(c.d_in))
        for b in self.blocks:
            nn.init.normal_(b.fc.weight, std=std)
            if isinstance(b.norm, nn.LayerNorm):
                nn.init.ones_(b.norm.weight)
        nn.init.normal_(self.w_out.weight, std=1.0 / math.sqrt(c.width))

    def forward(self, x: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        h = self.w_in(x.flatten(1))  # (B, width)
        for block in self.blocks:
            h = block(h)
        logits = self.w_out(h)  # (B, n_classes)
        loss = F.cross_entropy(logits, targets) if targets is not None else None
        return logits, loss

    @torch.no_grad()
    def stream_norms(self, x: Tensor) -> Tensor:
        """Mean over the batch of ||h_l||, l = 0 (after w_in) .. depth: (depth + 1,)."""
        h = self.w_in(x.flatten(1))
        norms = [h.norm(dim=-1).mean()]
        for block in self.blocks:
            h = block(h)
            norms.append(h.norm(dim=-1).mean())
        return torch.stack(norms)

    def matrix_roles(self) -> list[MatrixRole]:
        """w_in (role in, layer -1), blocks.{i}.fc (hidden, layer i), w_out (out, layer depth)."""
        roles = [MatrixRole("w_in.weight", self.w_in.weight, "in", -1, "io")]
        roles += [MatrixRole(f"blocks.{i}.fc.weight", b.fc.weight, "hidden", i, "mlp")
                  for i, b in enumerate(self.blocks)]
        roles.append(MatrixRole("w_out.weight", self.w_out.weight, "out", len(self.blocks), "io"))
        return roles

    def stats(self) -> dict[str, float]:
        """Radial arms: mean tanh gate of the last forward, per block and over blocks; else {}."""
        vals = {f"tanh_mean/{i}": float(b.tanh_mean)
                for i, b in enumerate(self.blocks) if b.tanh_mean is not None}
        if vals:
            vals["tanh_mean"] = sum(vals.values()) / len(vals)
        return vals
