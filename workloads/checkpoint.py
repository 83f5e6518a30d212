"""Atomic training checkpoints: model, optimizers, RNG states, data position, monitor state.

A checkpoint is a folder ``step-<08d>`` holding ``state.pt``; it is written under a temporary
name and renamed, so a crash never leaves a half checkpoint that a resume would pick up.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["save_checkpoint", "latest_checkpoint", "load_checkpoint", "rng_state", "set_rng_state",
           "safe_load", "CheckpointLoadError"]


class CheckpointLoadError(ValueError):
    """A checkpoint that cannot be read safely (truncated, foreign, or carrying code); one line."""


def _allowed_globals() -> list:
    """What our own checkpoints pickle beyond tensors and plain containers: numpy's RNG state
    (an ndarray of uint32) and nothing else. Anything outside this list is refused, so a
    checkpoint from elsewhere cannot run code when loaded (weights_only=True)."""
    from numpy import dtype, ndarray

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    allowed: list = [ndarray, _reconstruct, dtype]
    try:  # numpy >= 1.25 pickles the dtype's class too
        from numpy import dtypes

        allowed += [dtypes.UInt32DType, dtypes.Float64DType, dtypes.Int64DType]
    except ImportError:
        pass
    return allowed


def safe_load(path: str | os.PathLike, mmap: bool = False) -> Any:
    """``torch.load`` with ``weights_only=True`` and our allow-list; every failure is a
    ``CheckpointLoadError`` naming the file (truncated, not a checkpoint, or foreign code)."""
    path = Path(path)
    try:
        with torch.serialization.safe_globals(_allowed_globals()):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = found.group(1) if found else "an object"
        raise CheckpointLoadError(
            f"{path}: refused to load: it pickles {what}, outside geosweep's allow-list "
            "(tensors, plain containers, numpy arrays); a checkpoint from elsewhere could run "
            "code") from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError) as e:
        if isinstance(e, OSError) and e.errno is not None and not isinstance(
                e, FileNotFoundError):
            raise
        first = (str(e).strip().split(". ") or [type(e).__name__])[0][:100]
        raise CheckpointLoadError(
            f"{path}: not a readable checkpoint, truncated or corrupt ({first or type(e).__name__}"
            "); delete it to fall back to an earlier one") from None

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
    # through a Python file: a full disk is then OSError(ENOSPC) naming the file, where
    # torch's own writer raises an opaque RuntimeError; no half-written step is left behind
    try:
        with open(tmp / "state.pt", "wb") as f:
            torch.save(state, f)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        # torch's writer, closing after a failed write, raises a RuntimeError whose context
        # is the OSError that says what happened
        cause = e if isinstance(e, OSError) else e.__context__
        if isinstance(cause, OSError) and cause.errno:
            raise OSError(cause.errno, cause.strerror, str(final / "state.pt")) from None
        raise
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
    return safe_load(path)
