"""Atomic training checkpoints: model, optimizers, RNG states, data position, monitor state.

A checkpoint is a folder ``step-<08d>`` holding ``state.pt``; it is written under a temporary
name and renamed, so a crash never leaves a half checkpoint that a resume would pick up.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["save_checkpoint", "latest_checkpoint", "load_checkpoint", "rng_state", "set_rng_state"]

_NAME = re.compile(r"^step-(\d{8})$")


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(folder: str | os.PathLike, step: int, state: dict[str, Any],
                    keep: int = 2) -> Path:
    """Write ``folder/step-<step>/state.pt`` atomically; keep the newest ``keep`` checkpoints."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    olds = sorted(p for p in root.iterdir() if _NAME.match(p.name))
    for old in olds[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(folder: str | os.PathLike) -> Path | None:
    root = Path(folder)
    if not root.is_dir():
        return None
    found = sorted(p for p in root.iterdir() if _NAME.match(p.name) and (p / "state.pt").exists())
    return found[-1] if found else None


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "state.pt"
    # Our own files: RNG states hold numpy arrays, which weights_only=True refuses.
    return torch.load(path, map_location="cpu", weights_only=False)
