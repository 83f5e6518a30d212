"""The training loop: model, optimizers, data, metrics, checkpoints. Plain PyTorch.

``run(cfg, report=..., monitor=...)`` trains any workload. It never imports Ray, MLflow or the
orchestrator: it talks through the ``report`` callable and the ``StepMonitor`` it is handed.
Under ``torch.distributed`` (Ray Train's TorchTrainer sets it up) it wraps the model in DDP,
gives each rank its own data stream, and all-reduces the loss so every rank takes the same
divergence decision at the same step (otherwise one rank would stop and the others hang).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from workloads.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from workloads.config import MLPConfig, WorkloadConfig, to_dict
from workloads.report import CurvePoint, Divergence, Report, StepInfo, StepMonitor
from workloads.schedule import lr_at
from workloads.validate import validate

__all__ = ["run", "RunResult", "resolve_device", "build_data", "Data"]


@dataclass
class RunResult:
    steps: int
    final_train_loss: float
    final_val_loss: float
    best_val_loss: float
    initial_loss: float
    train_time_s: float
    divergence: Divergence | None = None
    val_history: list[tuple[int, float]] = field(default_factory=list)
    train_losses: list[float] = field(default_factory=list)  # every step (tests, golden values)


# --- set-up helpers ----------------------------------------------------------------------


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
    if name == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"train.device: {name!r} requested but CUDA is not available")
    return torch.device(name)


@dataclass
class Data:
    """What the loop needs from a dataset, whatever it is."""

    batcher: Any  # .next() -> (x, y); state_dict()/load_state_dict()
    eval_sets: dict[str, list]  # split -> fixed list of (x, y) batches
    vocab_size: int | None  # None for classification
    items_per_batch: int  # tokens (LM) or samples (MLP) per micro-batch per rank
    steps_per_epoch: int | None = None
    probe: Any = None  # a fixed input batch for the instability probe
    grad_probes: list = field(default_factory=list)  # fixed (x, y) batches for gradient metrics


def build_data(cfg: WorkloadConfig, rank: int = 0, world_size: int = 1) -> Data:
    from workloads import data as wdata

    t = cfg.train
    if isinstance(cfg.model, MLPConfig):
        mnist = wdata.load_mnist(cache_dir=cfg.data.cache_dir)
        batcher = wdata.ArrayBatcher(mnist.x_train, mnist.y_train, t.batch_size, seed=t.seed,
                                     rank=rank, world_size=world_size)
        n_eval = min(len(mnist.x_test), t.eval_iters * t.batch_size)
        xs, ys = mnist.x_test[:n_eval], mnist.y_test[:n_eval]
        val = [(xs[i:i + t.batch_size], ys[i:i + t.batch_size])
               for i in range(0, n_eval, t.batch_size)]
        return Data(batcher, {"val": val}, None, t.batch_size,
                    steps_per_epoch=batcher.steps_per_epoch, probe=val[0][0],
                    grad_probes=val[:cfg.metrics.grad_probes])
    tokens = wdata.load_tokens(cfg.data)
    block = cfg.model.block_size
    batcher = wdata.TokenBatcher(tokens.train, t.batch_size, block, seed=t.seed, rank=rank,
                                 world_size=world_size)
    val = wdata.eval_batches(tokens.val, t.eval_iters, t.batch_size, block)
    probe_len = min(block, cfg.metrics.probe_len or block, 256)
    probe_x = val[0][0][: cfg.metrics.probe_batch, :probe_len]
    return Data(batcher, {"val": val}, tokens.vocab_size, t.batch_size * block, probe=probe_x,
                grad_probes=val[:cfg.metrics.grad_probes])


def _seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --- evaluation --------------------------------------------------------------------------


@torch.no_grad()
def _evaluate(model: torch.nn.Module, batches: list, device: torch.device, autocast) -> dict:
    was_training = model.training
    model.eval()
    losses, correct, count = [], 0, 0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        with autocast():
            logits, loss = model(x, y)
        losses.append(float(loss))
        if logits.dim() == 2:  # classification: accuracy too
            correct += int((logits.argmax(-1) == y).sum())
            count += len(y)
    model.train(was_training)
    out = {"loss": sum(losses) / max(1, len(losses))}
    if count:
        out["acc"] = correct / count
    return out


# --- the loop ----------------------------------------------------------------------------


def run(cfg: WorkloadConfig, report: Callable[[Report], None] | None = None,
        monitor: StepMonitor | None = None, checkpoint_dir: str | None = None,
        resume: bool = False) -> RunResult:
    """Train ``cfg``. Returns the final numbers; everything else goes through ``report``."""
    # Longer than our ~60-line rule on purpose: like nanoGPT's train.py, the loop reads top to
    # bottom in `# ---` sections (set-up, resume, train, report) that share a dozen locals (model,
    # optimizers, data position, RNG, monitor state); the set-up and eval pieces are helpers above.
    validate(cfg)
    t, o = cfg.train, cfg.optim
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = resolve_device(t.device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)

    # --- data, model, optimizers (same init on every rank: same seed) -------------------
    _seed_everything(t.seed)
    data = build_data(cfg, rank, world)
    from workloads.models import build_model
    from workloads.optim import build_optimizers

    torch.manual_seed(t.seed)
    model = build_model(cfg.model, vocab_size=data.vocab_size).to(device)
    opts = build_optimizers(model, o)
    total_steps = t.steps
    if isinstance(cfg.model, MLPConfig) and t.epochs > 0 and data.steps_per_epoch:
        total_steps = t.epochs * data.steps_per_epoch

    train_model: torch.nn.Module = model
    if distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        train_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if t.compile:
        train_model = torch.compile(train_model)

    use_bf16 = t.dtype == "bf16"

    def autocast():
        if not use_bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    collector = None
    if t.metrics_every > 0 and rank == 0:
        from workloads.metrics.collect import MetricsCollector

        probe = data.probe.to(device) if data.probe is not None else None
        grad_probes = [(x.to(device), y.to(device)) for x, y in data.grad_probes]
        collector = MetricsCollector(model, cfg.metrics, probe_batch=probe, optimizers=opts,
                                     grad_probes=grad_probes)
    svd_every = cfg.metrics.svd_every or t.metrics_every

    # --- resume ----------------------------------------------------------------------------
    start_step, initial_loss, best_val = 0, float("nan"), math.inf
    val_history: list[tuple[int, float]] = []
    wall_offset = 0.0
    if resume and checkpoint_dir and (ckpt := latest_checkpoint(checkpoint_dir)) is not None:
        state = load_checkpoint(ckpt)
        model.load_state_dict(state["model"])
        opts.load_state_dict(state["optim"])
        data.batcher.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        if monitor is not None and state.get("monitor") is not None:
            monitor.load_state_dict(state["monitor"])
        if collector is not None and state.get("collector") is not None:
            collector.load_state_dict(state["collector"])
        start_step = state["step"]
        initial_loss, best_val = state["initial_loss"], state["best_val"]
        val_history = list(state["val_history"])
        wall_offset = state["wall_time"]

    def checkpoint(step: int) -> str | None:
        if not checkpoint_dir or rank != 0:
            return None
        state = {
            "step": step, "config": to_dict(cfg), "model": model.state_dict(),
            "optim": opts.state_dict(), "data": data.batcher.state_dict(), "rng": rng_state(),
            "monitor": monitor.state_dict() if monitor is not None else None,
            "collector": collector.state_dict() if collector is not None else None,
            "initial_loss": initial_loss, "best_val": best_val, "val_history": val_history,
            "wall_time": wall_offset + time.perf_counter() - t0,
        }
        return str(save_checkpoint(checkpoint_dir, step, state))

    # --- train -----------------------------------------------------------------------------
    init_rows = collector.init_rows() if collector is not None and start_step == 0 else []
    params = [p for p in model.parameters() if p.requires_grad]
    signals = None  # health signals for the monitor (workloads/metrics/signals.py)
    if monitor is not None:
        from workloads.metrics.signals import StepSignals

        signals = StepSignals(model, data.probe.to(device) if data.probe is not None else None)
    wants = getattr(monitor, "signals", lambda _step: ())
    check_eval = getattr(monitor, "check_eval", None)
    chance = math.log(data.vocab_size or getattr(cfg.model, "n_classes", 0) or 1) or None
    clip = o.grad_clip if o.grad_clip > 0 else math.inf
    curve: list[CurvePoint] = []
    train_losses: list[float] = []
    window_losses: list[float] = []
    divergence: Divergence | None = None
    # a resumed run that has no step left (its checkpoint is at train.steps) ends at the
    # checkpoint's last evaluation, not at nan
    last_val = val_history[-1][1] if val_history else float("nan")
    t0 = time.perf_counter()
    t_window, items_window = t0, 0
    model.train()
    step = start_step
    # metric rows collected since the last report; first every metric at init (step 0)
    pending_rows: list[dict] = init_rows
    for step in range(start_step, total_steps):
        lr = lr_at(step, o.lr, total_steps, o.warmup_steps, o.schedule, o.min_lr_ratio)
        opts.set_lr(lr)

        loss_sum = torch.zeros((), device=device)
        for micro in range(t.grad_accum):
            x, y = data.batcher.next()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            sync = micro == t.grad_accum - 1 or not distributed
            ctx = contextlib.nullcontext() if sync else train_model.no_sync()
            with ctx, autocast():
                _, loss = train_model(x, y)
                (loss / t.grad_accum).backward()
            loss_sum += loss.detach().float()
        loss_t = loss_sum / t.grad_accum
        if distributed:
            dist.all_reduce(loss_t, op=dist.ReduceOp.AVG if dist.get_backend() != "gloo"
                            else dist.ReduceOp.SUM)
            if dist.get_backend() == "gloo":
                loss_t /= world
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        loss_val = float(loss_t)
        if step == start_step and start_step == 0:
            initial_loss = loss_val
        if collector is not None:
            collector.after_backward(step)
        wanted = wants(step + 1)
        if signals is not None:
            signals.before_step(wanted)
        if math.isfinite(loss_val) and math.isfinite(grad_norm):
            opts.step()
        opts.zero_grad()
        items_window += data.items_per_batch * t.grad_accum * world

        wall = wall_offset + time.perf_counter() - t0
        train_losses.append(loss_val)
        window_losses.append(loss_val)
        if monitor is not None and signals is not None:
            divergence = monitor.check(StepInfo(
                step + 1, loss_val, grad_norm, lr, signals.extras(wanted) if wanted else {},
                param_max=signals.param_max(), chance_loss=chance))

        done = step + 1 == total_steps or divergence is not None
        report_now = done or (t.eval_every and (step + 1) % t.eval_every == 0)
        if report_now or (t.curve_every and (step + 1) % t.curve_every == 0):
            curve += [CurvePoint(step + 1, "train", "loss", loss_val, wall),
                      CurvePoint(step + 1, "train", "grad_norm", grad_norm, wall),
                      CurvePoint(step + 1, "train", "lr", lr, wall)]
        if (collector is not None and divergence is None and not report_now
                and t.metrics_every and (step + 1) % t.metrics_every == 0):
            # metrics_every < eval_every: collect now, send the rows with the next report
            more, _ = collector.collect(step + 1, exact_svd=(step + 1) % svd_every == 0)
            pending_rows += more
        if not report_now:
            continue

        # --- report: eval, metrics, checkpoint ------------------------------------------
        n = step + 1
        scalars: dict[str, float] = {"step": n, "train/lr": lr, "train/grad_norm": grad_norm,
                                     "train/initial_loss": initial_loss, "train/time_s": wall}
        scalars["train/loss"] = sum(window_losses) / len(window_losses)
        now = time.perf_counter()
        rate = items_window / max(1e-9, now - t_window)
        rate_key = "train/tokens_per_s" if data.vocab_size else "train/samples_per_s"
        scalars[rate_key] = rate
        curve.append(CurvePoint(n, "train", rate_key.split("/")[1], rate, wall))
        if divergence is None:
            stream = getattr(model, "stream", None)
            if stream is not None:  # per-sublayer theta/beta summaries over the eval batches
                stream.record_stats = True
            ev = _evaluate(model, data.eval_sets["val"], device, autocast)
            if stream is not None:
                stream.record_stats = False
            last_val = ev["loss"]
            best_val = min(best_val, last_val) if math.isfinite(last_val) else best_val
            val_history.append((n, last_val))
            for k, v in ev.items():
                scalars[f"val/{k}"] = v
                curve.append(CurvePoint(n, "val", k, v, wall))
            if check_eval is not None:  # a non-finite val loss; a final loss far too high
                divergence = check_eval(n, last_val, done)
                done = done or divergence is not None
        scalars["val/best_loss"] = best_val
        rows, pending_rows = pending_rows, []
        if collector is not None and divergence is None and (
                done or n % t.metrics_every == 0 or n - start_step <= t.eval_every):
            more, mscalars = collector.collect(n, exact_svd=(done or n % svd_every == 0))
            rows += more
            scalars.update(mscalars)
        stream = getattr(model, "stream", None)
        if stream is not None and hasattr(stream, "stats"):
            scalars.update({f"stream/{k}": v for k, v in stream.stats().items()})
        if stream is not None and hasattr(stream, "step_rows") and divergence is None:
            rows += stream.step_rows(n)  # beta over training (the saturation control)
        if hasattr(model, "stats"):
            scalars.update({f"model/{k}": v for k, v in model.stats().items()})
        ckpt = None
        if divergence is None and checkpoint_dir and (
                done or (t.checkpoint_every and n % t.checkpoint_every == 0)):
            ckpt = checkpoint(n)
        if report is not None:
            report(Report(step=n, scalars=scalars, curve=curve, rows=rows, checkpoint=ckpt,
                          done=done, divergence=divergence, rank=rank, world_size=world))
        curve, window_losses = [], []
        t_window, items_window = time.perf_counter(), 0
        if divergence is not None:
            break

    train_time = wall_offset + time.perf_counter() - t0
    return RunResult(
        steps=step + 1 if total_steps > start_step else start_step,
        final_train_loss=train_losses[-1] if train_losses else float("nan"),
        final_val_loss=last_val, best_val_loss=best_val, initial_loss=initial_loss,
        train_time_s=train_time, divergence=divergence, val_history=val_history,
        train_losses=train_losses,
    )

