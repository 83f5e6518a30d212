"""[1] The per-worker function: train one workload config and forward its reports to Ray.

It runs either inside a Ray Train worker (``TorchTrainer``; ``ray.train.report``, collective
over all ranks) or directly inside the Tune trial (``ray.tune.report``). The loop itself
(``workloads.train.run``) knows nothing of Ray: it reports through the callable built here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any

from orchestrator.spec.divergence_rules import DivergenceRules
from orchestrator.sweep.curve_codec import pack_curve
from orchestrator.sweep.divergence import DivergenceMonitor, penalty_value
from orchestrator.sweep.gpu_fit import check_gpu_fit, visible_devices_match
from workloads.config import flatten, from_dict
from workloads.report import Report

__all__ = ["train_worker", "make_payload", "OBJECTIVE"]

OBJECTIVE = "objective"  # the result key Tune's searcher and scheduler read
_BLOCKS_KEPT = 100  # report blocking times kept in a trial's timing (the latest ones)


def make_payload(rep: Report, ctx: dict[str, Any], metric: str, initial_loss: float,
                 rules: DivergenceRules, timing: dict[str, float],
                 worst_loss: float | None = None) -> dict[str, Any]:
    """Flatten a workload Report into the Tune result payload (docs/contracts.md).

    ``worst_loss``: the largest finite train loss the monitor saw (``penalty: worst``)."""
    out: dict[str, Any] = {k: float(v) for k, v in rep.scalars.items()}
    out["step"] = rep.step
    status = "diverged" if rep.divergence else ("completed" if rep.done else "running")
    # What the searcher and scheduler optimise: the spec's metric, or for a diverged trial an
    # informative penalty (the region is bad, but not infinitely so). The raw metric stays.
    value = out.get(metric, math.nan)
    if rep.divergence is not None or not math.isfinite(value):
        value = penalty_value(rules, initial_loss, out.get("val/best_loss", math.inf),
                              worst_loss)
    out[OBJECTIVE] = value
    if not math.isfinite(out.get("val/best_loss", 0.0)):  # inf: "no finite eval yet", not data
        del out["val/best_loss"]
    if rep.divergence is not None:
        out["diverged"] = 1.0
    out["_curve"] = pack_curve(rep.curve)  # a few byte strings (sweep/curve_codec.py)
    out["_rows"] = rep.rows
    out["_status"] = status
    out["_divergence"] = vars(rep.divergence) if rep.divergence else None
    out["_node"] = ctx["node"]
    out["_timing"] = dict(timing)
    out["_trial_params"] = ctx["params"]
    out["_arm"] = ctx["arm"]
    out["_seed"] = ctx["seed"]
    out["_world_size"] = rep.world_size
    return out


def train_worker(config: dict[str, Any]) -> None:
    """Ray entry point. ``config``: {"workload", "rules", "metric", "params", "arm", "seed",
    "mode": "train" | "in_trial", "gpus": the worker's GPU share (0: none), "weights": write
    the final weights artifact beside the final checkpoint}."""
    t_start = time.time()
    mode = config["mode"]
    if mode == "train":
        import ray.train as rt

        report_fn: Callable[..., None] = rt.report
        Checkpoint = rt.Checkpoint
        ray_ckpt = rt.get_checkpoint()
        rank = rt.get_context().get_world_rank()
    else:
        import ray.tune as rtune

        report_fn = rtune.report
        Checkpoint = rtune.Checkpoint
        ray_ckpt = rtune.get_checkpoint()
        rank = 0

    cfg = from_dict(config["workload"])
    rules = DivergenceRules(**config["rules"])
    metric = config["metric"]
    gpus = _claim_gpus(cfg, float(config.get("gpus") or 0.0), mode, config["arm"])
    ctx = {"node": f"{socket.gethostname()}:{_node_ip()}{f' gpu {gpus}' if gpus else ''}",
           "params": config["params"], "arm": config["arm"], "seed": config["seed"]}

    # Our own checkpoint folder; Ray persists it to the run's storage when reported.
    ckpt_dir = tempfile.mkdtemp(prefix="geosweep-ckpt-")
    resume = False
    if ray_ckpt is not None:
        with ray_ckpt.as_directory() as d:
            shutil.copytree(d, ckpt_dir, dirs_exist_ok=True)
        resume = True
    monitor = DivergenceMonitor(rules)
    state = {"initial_loss": math.nan, "t_setup": time.time() - t_start}
    blocks: dict[bool, list[float]] = {False: [], True: []}

    def report(rep: Report) -> None:
        state["initial_loss"] = rep.scalars.get("train/initial_loss", math.nan)
        first = not state.get("reported")
        state["reported"] = True
        timing = {"setup_s": state["t_setup"], "wall_s": time.time() - t_start,
                  "train_s": rep.scalars.get("train/time_s", math.nan),
                  # how long each earlier report held training up (ms), with and without a
                  # checkpoint to persist: what the driver's handling of a result costs the
                  # trial (benchmarks/sweep_vs_peers.py reads them from the trial record)
                  "report_block_ms": blocks[False][-_BLOCKS_KEPT:],
                  "checkpoint_report_ms": blocks[True][-_BLOCKS_KEPT:]}
        payload = make_payload(rep, ctx, metric, state["initial_loss"], rules, timing,
                               worst_loss=monitor.worst_loss)
        if not cfg.train.epochs:  # the progress line's ETA counts steps (sweep/progress.py)
            payload["_budget"] = cfg.train.steps
        if first and rank == 0:
            # as JSON text: Tune would keep min/max/avg and the last values of every numeric
            # key of a dict in its state of the trial (~50 keys), saved with the experiment
            payload["_config"] = json.dumps({k: _plain(v) for k, v in flatten(cfg).items()})
        ckpt = None
        if rep.checkpoint and rank == 0:
            stage = _staged(rep.checkpoint, stages)
            if rep.done and config.get("weights"):
                _prepare_weights(rep.checkpoint, stage)
            ckpt = Checkpoint.from_directory(stage)
        t_report = time.perf_counter()
        report_fn(payload, checkpoint=ckpt)  # persisted before it returns (sync upload)
        blocks[ckpt is not None].append(round(1000 * (time.perf_counter() - t_report), 3))
        while len(stages) > 1:  # the last one stays until the next report (belt and braces)
            shutil.rmtree(stages.pop(0), ignore_errors=True)

    from workloads.train import run

    stages: list[str] = []
    try:
        run(cfg, report=report, monitor=monitor, checkpoint_dir=ckpt_dir, resume=resume)
    finally:
        for d in [ckpt_dir, *stages]:
            shutil.rmtree(d, ignore_errors=True)
        if gpus and mode == "in_trial":
            _release_cache()


def _claim_gpus(cfg: Any, share: float, mode: str, arm: str) -> str:
    """The GPUs Ray gave this worker, as ``CUDA_VISIBLE_DEVICES`` lists them ("" for none),
    checked before anything trains.

    In the Tune trial's own process (``in_trial``) Ray set ``CUDA_VISIBLE_DEVICES`` to the
    trial's GPU when it started the actor, and torch's ``cuda:0`` is that GPU; a trial that
    sees others (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``) would train on someone
    else's. A GPU-less trial on a GPU machine sees every GPU (Ray 2.60 leaves the variable
    alone for zero GPUs), so ``train.device: auto`` becomes cpu there. A shared GPU (share <
    1) is checked against the trial's memory estimate and caps this process's allocator at
    its share, so a trial that outgrows it fails alone (orchestrator/sweep/gpu_fit.py)."""
    import ray

    # not inside Ray (a direct call): no GPU of Ray's (get_gpu_ids would start a Ray)
    ids = ray.get_gpu_ids() if ray.is_initialized() else []
    if not ids:
        if cfg.train.device == "auto":
            cfg.train.device = "cpu"
        return ""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mode == "train":  # Ray Train shares a node's GPUs between its workers (NCCL)
        return ",".join(str(i) for i in ids)
    if not visible_devices_match(visible, ids):
        raise RuntimeError(f"CUDA_VISIBLE_DEVICES={visible!r} in the trial's process but Ray "
                           f"gave it GPU(s) {ids}; unset RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_"
                           "DEVICES so that each trial sees only its own GPU")
    import torch

    if share and torch.cuda.is_available():
        dev = torch.device("cuda", 0)
        check_gpu_fit([(f"trial {arm}", cfg)], share,
                      torch.cuda.get_device_properties(dev).total_memory,
                      where=torch.cuda.get_device_name(dev))
        if share < 1:
            torch.cuda.set_per_process_memory_fraction(share, dev)
    return visible or ""


def _release_cache() -> None:
    """The trial actor is reused by the next trial: hand the cached blocks back to the GPU."""
    import gc

    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


def _prepare_weights(step_dir: str, stage: str) -> None:
    """The final weights artifact, written here beside the final checkpoint (orchestrator/
    store/weights.py ``prepare_weights``): the driver logs it without importing torch. Never
    fails the trial: without it the driver builds the artifact itself, as before."""
    from orchestrator.store.weights import prepare_weights

    try:
        prepare_weights(step_dir, stage)
    except Exception as e:  # noqa: BLE001 - the artifact has a fallback; training is done
        shutil.rmtree(os.path.join(stage, "model"), ignore_errors=True)
        print(f"[geosweep] final weights not prepared in the trial ({type(e).__name__}: {e}); "
              "the driver builds them", flush=True)


def _staged(step_dir: str, stages: list[str]) -> str:
    """A new folder holding only ``step_dir`` (``step-<08d>/``, hard links: no bytes copied),
    for Ray to persist. The checkpoint folder itself also keeps the step before it
    (workloads/checkpoint.py), which Ray would otherwise copy with every checkpoint: twice the
    bytes written per report and held per kept checkpoint. A restore copies the persisted
    folder back into the checkpoint folder, whose latest step it then resumes from, as before."""
    stage = tempfile.mkdtemp(prefix="geosweep-report-")
    stages.append(stage)
    shutil.copytree(step_dir, os.path.join(stage, os.path.basename(step_dir)),
                    copy_function=_link_or_copy)
    return stage


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links (or across devices)
        shutil.copy2(src, dst)


def _plain(v: Any) -> Any:
    """MLflow params are strings; keep numbers and strings, render the rest as text."""
    return v if isinstance(v, (str, int, float, bool)) or v is None else str(v)


def _node_ip() -> str:
    """``ip/node-id-prefix``: two Ray nodes on one host share the IP but not the node id."""
    try:
        import ray

        node = ray.get_runtime_context().get_node_id()[:8]
        return f"{ray.util.get_node_ip_address()}/{node}"
    except Exception:  # noqa: BLE001 - best effort label only
        return "?"
