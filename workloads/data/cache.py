"""Where derived data lives on disk, and how it gets there without half-written files.

Every trial of a sweep may ask for the same corpus at once; each writes to its own temporary
name and renames it into place (``os.replace`` is atomic on one filesystem), so a reader sees
either nothing or the whole file. Identical writers just overwrite each other with equal bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from workloads.config import ConfigError

__all__ = ["DataError", "cache_root", "digest", "atomic_save_npy", "atomic_write_json"]


class DataError(ConfigError):
    """A user-facing data error (one line, naming ``data.*``); a ConfigError so CLIs print it."""


def cache_root(cache_dir: str = "") -> Path:
    """``cache_dir`` if given, else ``$GEOSWEEP_CACHE``, else ``~/.cache/geosweep``."""
    root = cache_dir or os.environ.get("GEOSWEEP_CACHE", "") or "~/.cache/geosweep"
    path = Path(root).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def digest(obj: Any) -> str:
    """A stable hex key for a JSON-able description (sorted keys)."""
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def atomic_save_npy(path: Path, array: np.ndarray) -> None:
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            np.save(f, array, allow_pickle=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_json(path: Path, obj: Any) -> None:
    tmp = _tmp_name(path)
    try:
        tmp.write_text(json.dumps(obj, sort_keys=True, indent=1))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
