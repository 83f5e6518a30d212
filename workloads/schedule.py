"""Learning-rate schedule: linear warm-up, then cosine decay to ``min_lr_ratio * lr`` (nanoGPT)."""

from __future__ import annotations

import math

__all__ = ["lr_at"]


def lr_at(step: int, lr: float, total_steps: int, warmup_steps: int = 0,
          schedule: str = "cosine", min_lr_ratio: float = 0.1) -> float:
    """Learning rate for optimizer step ``step`` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    min_lr = lr * min_lr_ratio
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
