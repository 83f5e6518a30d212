"""`run --dry-run`'s cost line: total training steps and a wall-time estimate.

The estimate is MEASURED on this machine, not a table: the sweep's base workload (preset +
overrides) is built and three optimizer steps are timed on random batches of the real shapes
(after one warm-up step). It covers the training step only: evaluation, continuity metrics,
data loading and Ray's ~3 s per trial start are not in it (the last is added as a constant),
and concurrent trials are assumed to share the machine perfectly. Treat it as a lower bound.
"""

from __future__ import annotations

import math
import time

__all__ = ["measure_step_s", "estimate_lines", "TRIAL_OVERHEAD_S"]

TRIAL_OVERHEAD_S = 3.0  # Tune's per-trial start, measured (README, sweep_efficiency)


def measure_step_s(cfg, steps: int = 3) -> float:
    """Seconds per optimizer step of ``cfg`` on this machine (random data, CPU or GPU)."""
    import torch

    from workloads.config import MLPConfig
    from workloads.models import build_model
    from workloads.optim.build import build_optimizers
    from workloads.train import resolve_device

    t, m = cfg.train, cfg.model
    device = resolve_device(t.device)
    torch.manual_seed(0)
    if isinstance(m, MLPConfig):
        model = build_model(m).to(device)

        def batch():
            return (torch.randn(t.batch_size, m.d_in, device=device),
                    torch.randint(m.n_classes, (t.batch_size,), device=device))
    else:
        vocab = m.vocab_size or (50304 if cfg.data.tokenizer == "gpt2" else 96)
        model = build_model(m, vocab_size=vocab).to(device)

        def batch():
            x = torch.randint(vocab, (t.batch_size, m.block_size), device=device)
            return x, torch.roll(x, -1, dims=1)
    opts = build_optimizers(model, cfg.optim)
    model.train()

    def step():
        for _ in range(t.grad_accum):
            x, y = batch()
            _, loss = model(x, y)
            loss.backward()
        opts.step()
        opts.zero_grad()

    step()  # warm-up: lazy init, allocator
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def estimate_lines(spec, n_trials: int, step_s: float | None = None) -> list[str]:
    """The dry-run lines: total steps, and the estimate (``step_s`` measured if None)."""
    cfg = spec.base_config()
    steps = cfg.train.steps
    if cfg.train.epochs:
        return [f"total: {n_trials} trials x {cfg.train.epochs} epochs (steps depend on the "
                "data set); no wall-time estimate"]
    total = n_trials * steps
    bound = "at most " if spec.scheduler.type == "asha" else ""
    if step_s is None:
        step_s = measure_step_s(cfg)
    conc = max(1, min(spec.search.max_concurrent, n_trials))
    wall = total * step_s / conc + math.ceil(n_trials / conc) * TRIAL_OVERHEAD_S
    return [f"total: {bound}{total} training steps ({n_trials} trials x {steps} steps)",
            f"estimated wall time: ~{_human(wall)} ({step_s * 1e3:.1f} ms/step measured here "
            f"on {spec.workload.preset}, {conc} trials at a time, + {TRIAL_OVERHEAD_S:.0f} s per "
            "trial start; training steps only: eval, metrics and data loading excluded)"]


def _human(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
