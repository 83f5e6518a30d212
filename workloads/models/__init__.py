"""Models: ``build_model(model_cfg, vocab_size)`` and the ``MatrixRole`` every model reports."""

from __future__ import annotations

import dataclasses

from torch import nn

from workloads.config import ConfigError, GPTConfig, MLPConfig
from workloads.models.roles import MatrixRole

__all__ = ["MatrixRole", "build_model", "GPT2_VOCAB", "GPT2_VOCAB_PADDED"]

GPT2_VOCAB = 50257
GPT2_VOCAB_PADDED = 50304  # nanoGPT: padded to a multiple of 64 for speed


def build_model(model_cfg: GPTConfig | MLPConfig, vocab_size: int | None = None) -> nn.Module:
    """Dispatch on ``model_cfg.arch``: gpt / llama -> ``GPT``, mlp -> ``ResidualMLP``."""
    arch = getattr(model_cfg, "arch", None)
    if arch == "mlp":
        from workloads.models.mlp import ResidualMLP

        return ResidualMLP(model_cfg)
    if arch not in ("gpt", "llama"):
        raise ConfigError(f"model.arch: {arch!r} is not one of gpt, llama, mlp")
    from workloads.models.gpt import GPT

    if model_cfg.vocab_size == 0:
        if not vocab_size:
            raise ConfigError("model.vocab_size: 0 needs the tokenizer's vocab_size, none given")
        vocab = GPT2_VOCAB_PADDED if vocab_size == GPT2_VOCAB else vocab_size
        model_cfg = dataclasses.replace(model_cfg, vocab_size=vocab)
    return GPT(model_cfg)
