"""A Ray-free sweep folder (spec, MLflow store, Parquet trials, Tune-layout checkpoints) for the
store and evaluation tests: three trials of gpt-debug, two completed with checkpoints at steps
4 and 8, one diverged."""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import torch

from orchestrator.spec.yaml_reader import load_spec

SPEC = """
name: fake
workload: {preset: gpt-debug}
space:
  optim.lr: {grid: [1.0e-3, 3.0e-3, 500.0]}
seeds: [0]
budget: {steps: 8, eval_every: 4, metrics_every: 0}
"""
# trial id -> (status, lr, final val loss)
TRIALS = {
    "abc12_00000": ("completed", 1e-3, 2.50),
    "abc12_00001": ("completed", 3e-3, 2.40),
    "abc12_00002": ("diverged", 500.0, math.nan),
}


@dataclass
class FakeSweep:
    root: Path
    spec: object
    uri: str
    parquet_root: str
    models: dict  # trial id -> the model saved as its final (step 8) checkpoint


def _tune_dir(root: Path, i: int, tid: str) -> Path:
    return root / "ray" / "tune" / f"trial_driver_{tid}_{i}_trial=optim_lr_x_2026-11-30_04-39-04"


def make_sweep(tmp: Path, spec_text: str = SPEC) -> FakeSweep:
    from orchestrator.store.mlflow import MlflowSink
    from orchestrator.store.parquet import ParquetSink
    from workloads.checkpoint import save_checkpoint
    from workloads.config import to_dict
    from workloads.data import load_tokens
    from workloads.models import build_model

    root = tmp / "fake"
    root.mkdir(parents=True)
    (root / "spec.yaml").write_text(textwrap.dedent(spec_text))
    spec = load_spec(str(root / "spec.yaml"))
    uri, proot = f"sqlite:///{root / 'mlflow.db'}", str(root / "parquet")
    (root / "sweep.json").write_text(json.dumps(
        {"name": "fake", "trials": len(TRIALS), "mlflow_uri": uri, "parquet_root": proot}))
    sink = MlflowSink(uri, "fake", "fake")
    sink.start_parent(spec.to_yaml(), params={"sweep": "fake"}, provenance={})
    pq = ParquetSink(proot, "fake")
    models = {}
    for i, (tid, (status, lr, loss)) in enumerate(TRIALS.items()):
        flat = {"optim.lr": lr, "train.seed": 0}
        cfg = spec.trial_config(flat)
        sink.start_child(tid, flat)
        sink.end_child(tid, status)
        pq.write_trial({"trial": tid, "status": status, "arm": f"optim.lr={lr}", "seed": 0,
                        "final_val_loss": loss, "best_val_loss": loss, "params": flat,
                        "divergence_step": 3 if status == "diverged" else None})
        if status != "completed":
            continue
        vocab = load_tokens(cfg.data).vocab_size
        for k, step in enumerate((4, 8)):  # Tune keeps 2; the final one has the highest step
            torch.manual_seed(100 * i + step)
            model = build_model(cfg.model, vocab_size=vocab)
            state = {"step": step, "config": to_dict(cfg), "model": model.state_dict()}
            save_checkpoint(_tune_dir(root, i, tid) / f"checkpoint_{k:06d}", step, state)
        models[tid] = model.eval()
    sink.close()  # as a sweep's driver ends: a plain rollback-journal mlflow.db, no -wal beside it
    return FakeSweep(root, spec, uri, proot, models)

