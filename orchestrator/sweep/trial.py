"""[2] One Tune trial: turn the sampled params into a workload config and train it.

Two executors, chosen per spec (``resources.executor``); ``auto`` picks ``in_trial`` for every
single-worker trial, CPU or GPU, and ``train`` only for several workers:
- ``in_trial``: the per-worker function called directly inside the Tune trial. No Train
  controller, no worker group: measured ~10-20 s cheaper per trial on CPU (benchmarks/
  train_executor.py). A GPU trial asks Tune for its GPU share; Ray sets the trial actor's
  ``CUDA_VISIBLE_DEVICES`` to the GPU it gave, so several trials of ``gpus_per_worker`` < 1
  share one GPU, each on its own ``cuda:0`` (orchestrator/sweep/worker.py checks it and caps
  the trial's memory at its share).
- ``train``: a Ray Train run with N workers (DDP over gloo on CPU, NCCL on GPU). Its reports
  reach Tune through a ``TuneReportCallback`` (the Ray 2.60 Train V2 pattern).
  ``TorchTrainer``'s pieces are swapped for the ones in orchestrator/sweep/lean_train.py,
  which start fewer processes and import less per trial.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

from orchestrator.sweep.worker import train_worker

__all__ = ["resolve_executor", "trial_driver", "trial_resources", "prewarm"]

_PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


def resolve_executor(resources: Any) -> str:
    if resources.executor != "auto":
        return resources.executor
    if resources.workers_per_trial == 1:
        return "in_trial"
    return "train"


def trial_resources(resources: Any) -> dict[str, float]:
    """What the Tune trial itself asks Ray for."""
    if resolve_executor(resources) == "in_trial":
        res = {"CPU": float(resources.cpus_per_worker)}
        if resources.gpus_per_worker:
            res["GPU"] = float(resources.gpus_per_worker)
        res.update({k: float(v) for k, v in resources.custom.items()})
        return res
    # The driver only waits on its TorchTrainer; a full CPU for it would starve the workers
    # (1 driver + 2 workers at 1 CPU hangs on a 2-core machine: docs/platform.md).
    return {"CPU": 0.01}


def prewarm(resources: Any) -> None:
    """On the sweep's driver, once Ray is up: for the ``train`` executor, create Ray Train's
    cluster-wide autoscaling coordinator (a detached actor, one per Ray cluster) now, while
    Tune starts, not in the first trial's Train controller, which waits up to 5 s for it (then
    goes on without it). Only earlier: the controller would create the same actor."""
    if resolve_executor(resources) != "train":
        return
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )
    except ImportError:  # another Ray: its controller does what it does
        return
    get_or_create_autoscaling_coordinator()


def trial_driver(config: dict[str, Any], plan: dict[str, Any], storage: str,
                 finished: frozenset[str] = frozenset(), weights: bool = False) -> None:
    """``plan``: ``SweepSpec.trial_plan()``, plain values the driver resolved and validated once
    (the base config, the space's key order, the divergence rules, the metric, resources).
    ``finished``: trials a resumed driver found finished in Parquet. Tune's experiment
    snapshot may predate them (it is saved every ~10 s), so it restarts them; they return at
    once, without training or reporting, and keep their recorded outcome. ``weights``: the
    sweep keeps final weights; the trial writes their artifact with its final checkpoint."""
    import ray.tune

    if ray.tune.get_context().get_trial_id() in finished:
        return

    from orchestrator.spec.params import arm_label
    from orchestrator.sweep.space import flat_from_tune_config
    from workloads.config import apply_overrides, from_dict, to_dict

    flat = flat_from_tune_config(config)
    # The values were checked on the driver (every candidate and corner combination of the
    # space against the workload); here they are only applied.
    cfg = apply_overrides(from_dict(plan["base"]), flat)
    r = SimpleNamespace(**plan["resources"])
    executor = resolve_executor(r)
    loop_config = {
        "workload": to_dict(cfg),
        "rules": plan["rules"],
        "metric": plan["metric"],
        "params": {k: _plain(v) for k, v in flat.items()},
        "arm": arm_label(flat, plan["space_keys"]),
        "seed": cfg.train.seed,
        "mode": executor,
        "gpus": float(r.gpus_per_worker),
        "weights": weights,
    }
    if executor == "in_trial":
        train_worker(loop_config)
        return

    import ray.train

    from orchestrator.sweep.lean_train import LeanTorchConfig, TuneForward, lean_trainer

    # Ray Train's node-preemption watcher is one more actor process per trial; a preempted
    # worker still ends as a worker failure that FailureConfig retries. The user's setting wins.
    os.environ.setdefault(_PREEMPTION_WATCHER_ENV, "0")
    per_worker = {"CPU": float(r.cpus_per_worker), **{k: float(v) for k, v in r.custom.items()}}
    if r.gpus_per_worker:
        per_worker["GPU"] = float(r.gpus_per_worker)
    trial_id = ray.tune.get_context().get_trial_id()
    trainer = lean_trainer(
        train_worker,
        train_loop_config=loop_config,
        backend_config=LeanTorchConfig(backend="nccl" if r.gpus_per_worker else "gloo"),
        scaling_config=ray.train.ScalingConfig(
            num_workers=r.workers_per_trial, use_gpu=bool(r.gpus_per_worker),
            resources_per_worker=per_worker),
        run_config=ray.train.RunConfig(
            name=f"train-{trial_id}",  # unique per Tune trial, never random (docs/platform.md)
            storage_path=storage,
            callbacks=[TuneForward()],
            failure_config=ray.train.FailureConfig(max_failures=r.max_failures),
        ),
    )
    trainer.fit()


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    return v
