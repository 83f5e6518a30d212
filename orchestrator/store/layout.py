"""The layout of a sweep folder (``<out>/<name>/``).

``spec.yaml``, ``mlflow.db`` + ``mlartifacts/`` (default MLflow store), ``parquet/`` (default
dataset root), ``ray/`` (Tune/Train storage, checkpoints; ``ray/tune`` the first Tune
experiment, ``ray/tune-<k>`` + ``ray/tune-<k>.json`` the extensions:
orchestrator/sweep/experiments.py), ``optuna.db`` (the Optuna study, for Optuna searches),
``sweep.json`` (what was run, for ``status``/``resume``). ``sweep_paths`` reads only
``spec.name`` and ``spec.tracking``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SweepPaths", "sweep_paths"]


@dataclass
class SweepPaths:
    root: Path
    spec: Path
    mlflow_uri: str
    artifacts: Path
    parquet_root: str
    ray_storage: Path
    manifest: Path


def sweep_paths(spec: Any, out: str | os.PathLike) -> SweepPaths:
    root = Path(out).expanduser().resolve() / spec.name
    mlflow_uri = spec.tracking.mlflow_uri or f"sqlite:///{root / 'mlflow.db'}"
    parquet_root = spec.tracking.parquet_root or str(root / "parquet")
    return SweepPaths(root, root / "spec.yaml", mlflow_uri, root / "mlartifacts", parquet_root,
                      root / "ray", root / "sweep.json")
