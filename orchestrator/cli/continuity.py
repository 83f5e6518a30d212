"""`geosweep continuity CHECKPOINT`: continuity of a pretrained checkpoint
(orchestrator/analysis/continuity.py does the work)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from orchestrator.cli.errors import UsageError

__all__ = ["add_continuity_command", "cmd_continuity"]

DEFAULT_OUT = "geosweep-runs/continuity"


def cmd_continuity(args: argparse.Namespace) -> int:
    from orchestrator.analysis.continuity import run_continuity

    # where it writes, before the checkpoint is read: a dead MLflow server would otherwise
    # be retried for minutes after the analysis, an unknown scheme end in a traceback
    from orchestrator.cli.heartbeat import Heartbeat
    from orchestrator.cli.preflight import check_mlflow_store, check_writable_dir
    from workloads.pretrained import CheckpointError

    check_writable_dir(args.out, "--out")
    check_mlflow_store(args.mlflow_uri)  # every store problem (store/mlflow_store.py) first
    if args.mlflow_uri is None:  # the default store in --out: its own, and usable
        from orchestrator.store.targets import FolderError, check_entries

        try:
            check_entries(args.out, ("mlflow.db", "mlartifacts"))
        except FolderError as e:
            raise UsageError(str(e)) from None
        check_mlflow_store(f"sqlite:///{os.path.abspath(args.out)}/mlflow.db", flag="--out")
    from orchestrator.cli.failures import CURRENT

    CURRENT["writing"] = args.out
    hb = Heartbeat("continuity", phase=f"loading {args.checkpoint} and measuring its layers")
    hb.say(f"[continuity] {args.checkpoint}: loading the checkpoint (streamed), then the "
           f"metrics of every layer; results in {args.out}")
    try:
        with hb:
            run_continuity(args.checkpoint, args.out, args.mlflow_uri)
    except CheckpointError as e:
        raise UsageError(str(e)) from None
    return 0


def add_continuity_command(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``continuity CHECKPOINT [--out DIR] [--mlflow-uri URI]`` on a subparsers."""
    c = subparsers.add_parser("continuity", help="layer-to-layer continuity of a checkpoint "
                              "(HF folder, hub id or geosweep checkpoint)")
    c.add_argument("checkpoint", help="local HF model folder, hub id, or geosweep checkpoint")
    c.add_argument("--out", default=DEFAULT_OUT, help="folder for Parquet, PNG and MLflow store")
    c.add_argument("--mlflow-uri", default=None, help="MLflow tracking URI (default: sqlite "
                   "in --out)")
    c.set_defaults(fn=cmd_continuity)
    return c


add = add_continuity_command  # the name orchestrator.cli.COMMANDS calls
