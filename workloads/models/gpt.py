"""nanoGPT-style GPT-2 (``arch="gpt"``) and a Llama-style variant (``arch="llama"``).

Blocks hold only ``attn`` and ``mlp``; the residual wiring (norms, skips, retractions) is the
family's stream (``workloads.residual``), so every family shares these modules:

    h = stream.enter(drop(wte[idx] + wpe[pos]))
    for i, block in enumerate(blocks):
        h = stream.sublayer(2i, h, block.attn); h = stream.sublayer(2i + 1, h, block.mlp)
    logits = lm_head(stream.exit(h))

gpt: fused c_attn, GELU MLP 4d, learned positions, optional bias, LayerNorm.
llama: separate q, k, v, o, RoPE, SwiGLU (gate, up, down), RMSNorm, no biases.
Init (both): N(0, 0.02); the output projections (c_proj / o / down) N(0, 0.02/sqrt(2L)).
"""

from __future__ import annotations

import abc
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workloads.config import ConfigError, GPTConfig
from workloads.geometry.sphere import fp32_region
from workloads.models.roles import MatrixRole
from workloads.residual import make_stream

__all__ = ["GPT", "CausalSelfAttention", "LlamaAttention", "MLP", "SwiGLU", "Block",
           "rope_tables", "apply_rope", "ffn_width"]


def ffn_width(cfg: GPTConfig) -> int:
    """ffn_hidden, else 4d (gpt) or 8d/3 rounded up to a multiple of 64 (llama)."""
    if cfg.ffn_hidden:
        return cfg.ffn_hidden
    if cfg.arch == "gpt":
        return 4 * cfg.n_embd
    return 64 * math.ceil(8 * cfg.n_embd / 3 / 64)


def rope_tables(T: int, hs: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos, sin of shape (T, hs) for the rotate-half convention (pairs i and i + hs/2)."""
    inv = 1.0 / theta ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs)  # (hs/2,)
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)  # (T, hs/2)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, nh, T, hs) rotated by position; cos/sin (T, hs)."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


# --- attention ----------------------------------------------------------------------------


class _Attention(nn.Module, abc.ABC):
    """Shared causal attention; subclasses say how q, k, v are made and how y is projected."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.n_embd, self.dropout = cfg.n_head, cfg.n_embd, cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def _heads(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        return x.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

    @abc.abstractmethod
    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v of shape (B, nh, T, hs), positions already encoded."""

    @abc.abstractmethod
    def project(self, y: Tensor) -> Tensor:
        """(B, T, C) attention output -> (B, T, C) residual branch output."""

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.project(y))

    def scores(self, x: Tensor) -> Tensor:
        """fp32 pre-softmax logits q.k/sqrt(hs), (B, nh, T, T), no causal mask."""
        q, k, _ = self.qkv(x)
        if q.dtype in (torch.bfloat16, torch.float16):
            q, k = q.float(), k.float()
        with fp32_region(q):
            return (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])


class CausalSelfAttention(_Attention):
    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg)
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # rows [Q; K; V]
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def qkv(self, x):
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        return self._heads(q), self._heads(k), self._heads(v)

    def project(self, y):
        return self.c_proj(y)

    def roles(self) -> list[tuple[str, nn.Linear, str]]:
        return [("c_attn", self.c_attn, "qkv"), ("c_proj", self.c_proj, "o")]


class LlamaAttention(_Attention):
    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg)
        d = cfg.n_embd
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        cos, sin = rope_tables(cfg.block_size, d // cfg.n_head, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def qkv(self, x):
        T = x.shape[1]
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        cos, sin = self.cos[:T].to(q.dtype), self.sin[:T].to(q.dtype)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def project(self, y):
        return self.o(y)

    def roles(self):
        return [(n, getattr(self, n), n) for n in ("q", "k", "v", "o")]


# --- MLPs ---------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, ffn_width(cfg), bias=cfg.bias)
        self.c_proj = nn.Linear(ffn_width(cfg), cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))

    def roles(self):
        return [("c_fc", self.c_fc, "fc"), ("c_proj", self.c_proj, "proj")]


class SwiGLU(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d, f = cfg.n_embd, ffn_width(cfg)
        self.gate = nn.Linear(d, f, bias=False)
        self.up = nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.down(F.silu(self.gate(x)) * self.up(x)))

    def roles(self):
        return [(n, getattr(self, n), n) for n in ("gate", "up", "down")]


class Block(nn.Module):
    """Only the two branches; the stream decides how they meet h."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        llama = cfg.arch == "llama"
        self.attn = LlamaAttention(cfg) if llama else CausalSelfAttention(cfg)
        self.mlp = SwiGLU(cfg) if llama else MLP(cfg)


# --- the model ----------------------------------------------------------------------------

_OUT_PROJ = ("attn.c_proj.weight", "mlp.c_proj.weight", "attn.o.weight", "mlp.down.weight")


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.vocab_size <= 0:
            raise ConfigError(f"model.vocab_size: must be > 0, got {cfg.vocab_size!r}")
        self.config = cfg
        llama = cfg.arch == "llama"
        d, L = cfg.n_embd, cfg.n_layer
        self.wte = nn.Embedding(cfg.vocab_size, d)
        self.wpe = None if llama else nn.Embedding(cfg.block_size, d)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(L))
        self.stream = make_stream(cfg.residual, d, L, "rmsnorm" if llama else "layernorm",
                                  bias=cfg.bias and not llama)
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.wte.weight = self.lm_head.weight  # named "wte.weight" (registered first)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith(_OUT_PROJ):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * L))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def num_params(self, non_embedding: bool = False) -> int:
        """All parameters (tied ones once); ``non_embedding`` leaves out wpe (nanoGPT's count)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.wpe is not None:
            n -= self.wpe.weight.numel()
        return n

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """idx (B, T) token ids -> logits (B, T, V) and mean cross-entropy (ignore_index -1)."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} > block_size {self.config.block_size}")
        x = self.wte(idx)  # (B, T, d)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        h = self.stream.enter(self.drop(x))
        for i, block in enumerate(self.blocks):
            h = self.stream.sublayer(2 * i, h, block.attn)
            h = self.stream.sublayer(2 * i + 1, h, block.mlp)
        logits = self.lm_head(self.stream.exit(h))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss

    def matrix_roles(self) -> list[MatrixRole]:
        """Block matrices in order, plus io: wte ("in", layer -1), untied lm_head ("out", L)."""
        L = self.config.n_layer
        roles = [MatrixRole("wte.weight", self.wte.weight, "in", -1, "io")]
        for i, block in enumerate(self.blocks):
            for part, kind in (("attn", "attention"), ("mlp", "mlp")):
                for name, lin, role in getattr(block, part).roles():
                    roles.append(MatrixRole(f"blocks.{i}.{part}.{name}.weight", lin.weight,
                                            role, i, kind))
        if not self.config.tie_embeddings:
            roles.append(MatrixRole("lm_head.weight", self.lm_head.weight, "out", L, "io"))
        return roles
