"""`run --dry-run`'s cost line: total training steps and a wall-time estimate.

The estimate is MEASURED on this machine, not a table: the sweep's base workload (preset +
overrides, its real data) is trained for a few steps through the real loop
(``workloads.train.run``) with the trial's CPU share as torch's thread count (Ray gives a
1-CPU trial one thread), so what a trial pays is in it: the step time once warm (the median;
the first steps, seconds on a loaded machine, were what the old 3-step timing measured), one
evaluation, one pass of the continuity metrics, and building data and model. A trial's time
is then setup + steps x step + evaluations x eval + metric passes x metrics. ASHA stops most
trials at a rung: the expected steps per trial (the share reaching each rung) replace the
budget, with the budget as the bound. Concurrent trials share the machine (no more at once
than ``max_concurrent`` or the CPUs allow), plus Ray's start, each worker's first start
(imports), each trial's start and the sweep's end, as measured constants. Diverged trials end
early and are not predicted: for a sweep with many, the estimate is high.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, replace

__all__ = ["measure_costs", "TrialCosts", "estimate_lines", "asha_expected_steps",
           "expected_steps", "wall_estimate", "trial_threads", "human",
           "RAY_START_S", "WORKER_START_S", "TRIAL_START_S", "SWEEP_END_S"]

# Measured on the 2-core CI machine (the README's quickstart: 60 s, of which 39 s of trials)
RAY_START_S = 10.0  # local Ray and the first trial actors up
WORKER_START_S = 8.0  # a fresh trial worker's imports (torch, workloads), once per slot
TRIAL_START_S = {"in_trial": 1.0, "train": 10.0}  # per trial: Tune (actor reuse) / TorchTrainer
SWEEP_END_S = 10.0  # records, the best trial's weights, the MLflow parent, Ray's shutdown
PROBE_EVERY = 5  # the probe's report interval: steps 5, 10, 15


@dataclass(frozen=True)
class TrialCosts:
    """Seconds a trial of the workload spends: per step (warm), per evaluation, per metrics
    pass, and once (data and model)."""

    step_s: float
    eval_s: float
    metrics_s: float
    setup_s: float


def measure_costs(cfg, threads: int = 1) -> TrialCosts:
    """Train ``cfg`` for 15 steps (reports at 5, 10, 15: eval each time, metrics at 5 and 15)
    through workloads.train.run with ``threads`` torch threads; the costs it paid."""
    import torch

    from workloads.train import run

    t = cfg.train
    metrics = t.metrics_every > 0
    probe = replace(cfg, train=replace(t, steps=3 * PROBE_EVERY, eval_every=PROBE_EVERY,
                                       metrics_every=3 * PROBE_EVERY if metrics else 0,
                                       checkpoint_every=0, epochs=0))
    walls: dict[int, float] = {}  # step -> the loop's wall clock at its end
    first: list[tuple[float, float]] = []  # (wall of the first report's step, clock then)
    t_start = time.perf_counter()

    def report(rep) -> None:
        if not first:
            first.append((float(rep.scalars["train/time_s"]), time.perf_counter()))
        walls.update({p.step: p.wall_time for p in rep.curve
                      if p.split == "train" and p.metric == "loss"})

    old = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        run(probe, report=report)
    finally:
        torch.set_num_threads(old)
    w = [walls[k] for k in sorted(walls)]
    dts = sorted(b - a for a, b in zip(w[1:], w[2:]))  # step 1 (warm-up) left out
    step_s = dts[len(dts) // 2] if dts else 0.0
    # the gap after a report's step is that report's cost plus one step: after step 5 an
    # evaluation and a metrics pass, after step 10 an evaluation alone
    gap = {k: max(0.0, walls[k + 1] - walls[k] - step_s) for k in (PROBE_EVERY, 2 * PROBE_EVERY)
           if k in walls and k + 1 in walls}
    eval_s = gap.get(2 * PROBE_EVERY, 0.0)
    metrics_s = max(0.0, gap.get(PROBE_EVERY, 0.0) - eval_s) if metrics else 0.0
    setup_s = 0.0
    if first:  # the loop started at clock - wall - that report's cost; before it: data, model
        wall5, clock5 = first[0]
        loop_t0 = clock5 - wall5 - gap.get(PROBE_EVERY, 0.0)
        setup_s = max(0.0, loop_t0 - t_start) + max(0.0, (w[0] if w else 0.0) - step_s)
    return TrialCosts(step_s, eval_s, metrics_s, setup_s)


def asha_expected_steps(steps: int, grace: int, rf: float, max_t: int) -> float:
    """Expected steps per trial under ASHA: every trial runs to the first rung, a 1/rf share
    of those past each rung to the next, up to ``min(steps, max_t)``."""
    end = min(steps, max_t)
    rungs = []
    r = float(grace)
    while r < end:
        rungs.append(r)
        r *= rf
    if not rungs:
        return float(end)
    total, share = rungs[0], 1.0
    for a, b in zip(rungs, rungs[1:] + [float(end)]):
        share /= rf
        total += (b - a) * share
    return total


def expected_steps(spec) -> float:
    """Training steps a trial of ``spec`` is expected to run (ASHA: ``asha_expected_steps``)."""
    steps = spec.base_config().train.steps
    if spec.scheduler.type != "asha":
        return float(steps)
    s = spec.scheduler
    return asha_expected_steps(steps, s.grace_period, s.reduction_factor, s.max_t or steps)


def wall_estimate(spec, n_trials: int, costs: TrialCosts) -> tuple[float, int]:
    """(seconds, trials at a time) of a sweep of ``n_trials`` trials of ``spec``."""
    t, r = spec.base_config().train, spec.resources
    from orchestrator.sweep.trial import resolve_executor

    ex = resolve_executor(r)
    expected = expected_steps(spec)
    n_eval = expected / t.eval_every if t.eval_every else 0.0
    n_metrics = (expected / t.metrics_every + 1) if t.metrics_every else 0.0
    per_trial = (costs.setup_s + expected * costs.step_s + n_eval * costs.eval_s
                 + n_metrics * costs.metrics_s + TRIAL_START_S[ex])
    trial_cpus = r.workers_per_trial * r.cpus_per_worker
    fit = ((os.cpu_count() or 1) // max(1, math.ceil(trial_cpus)) if not r.gpus_per_worker
           else n_trials)  # GPU trials: the packing check decides (sweep/gpu_fit.py)
    conc = max(1, min(spec.search.max_concurrent, n_trials, max(1, fit)))
    return RAY_START_S + WORKER_START_S + n_trials * per_trial / conc + SWEEP_END_S, conc


def trial_threads(spec) -> int:
    """torch threads a trial of ``spec`` gets (Ray: its whole CPUs per worker)."""
    return max(1, int(spec.resources.cpus_per_worker))


def estimate_lines(spec, n_trials: int, costs: TrialCosts | None = None) -> list[str]:
    """The dry-run lines: total steps, and the estimate (``costs`` measured if None)."""
    cfg = spec.base_config()
    t, r = cfg.train, spec.resources
    if t.epochs:
        return [f"total: {n_trials} trials x {t.epochs} epochs (steps depend on the "
                "data set); no wall-time estimate"]
    steps = t.steps
    total = n_trials * steps
    expected = expected_steps(spec)
    if spec.scheduler.type == "asha":
        lines = [f"total: at most {total} training steps ({n_trials} trials x {steps} "
                 f"steps); ASHA stops most trials early: ~{expected * n_trials:.0f} "
                 f"expected ({expected:.0f} per trial)"]
    else:
        lines = [f"total: {total} training steps ({n_trials} trials x {steps} steps)"]
    threads = trial_threads(spec)
    if costs is None:
        costs = measure_costs(cfg, threads)
    from orchestrator.sweep.trial import resolve_executor

    ex = resolve_executor(r)
    wall, conc = wall_estimate(spec, n_trials, costs)
    lines.append(
        f"estimated wall time: ~{human(wall)} (measured here on {spec.workload.preset} with "
        f"{threads} thread(s) per trial: {costs.step_s * 1e3:.1f} ms/step, "
        f"{costs.eval_s:.2f} s/eval, {costs.metrics_s:.2f} s/metrics pass, "
        f"{costs.setup_s:.1f} s setup; {conc} trials at a time; + Ray start, worker start, "
        f"{TRIAL_START_S[ex]:.0f} s per trial start and the sweep's end: "
        f"{RAY_START_S + WORKER_START_S + SWEEP_END_S:.0f} s; diverged trials end sooner)")
    return lines


def human(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
