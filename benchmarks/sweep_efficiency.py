"""Orchestration efficiency of a sweep on the local Ray: how much of the slots' time trains.

efficiency = sum of trial training time / (wall time x concurrent slots), for 8 trials of
~5 s and of ~60 s of training each (issue 4 targets: >= 0.75 and >= 0.90). Wall time is the
Tune phase (``Tuner.fit``); the fixed start cost of a sweep (Ray start, MLflow store creation)
is printed separately. Also compares the two executors on the same short trials: the
in-trial path (the default for single-worker CPU trials) vs a ``TorchTrainer`` per trial.

    python benchmarks/sweep_efficiency.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import torch


def _steps_per_second(preset: str) -> float:
    """Calibrate: training steps per second of ``preset`` in this process (1 thread)."""
    from workloads.config import apply_overrides
    from workloads.config import preset as get
    from workloads.train import run

    torch.set_num_threads(1)
    cfg = apply_overrides(get(preset), {"train.steps": 40, "train.eval_every": 0,
                                        "train.metrics_every": 0})
    res = run(cfg)
    return 40 / res.train_time_s


def _spec(name: str, steps: int, executor: str, slots: int, trials: int = 8,
          checkpoint_every: int | None = None):
    from orchestrator.spec.yaml_reader import spec_from_dict

    return spec_from_dict({
        "name": name,
        "workload": {"preset": "gpt-debug"},
        "space": {"optim.lr": {"grid": [1e-3 * (1 + i / 10) for i in range(trials)]}},
        "seeds": [0],
        "search": {"algorithm": "grid", "max_concurrent": slots},
        "budget": {"steps": steps, "eval_every": max(1, steps // 4), "metrics_every": 0,
                   "checkpoint_every": checkpoint_every},
        "resources": {"workers_per_trial": 1,
                      "cpus_per_worker": 1.0 if executor == "in_trial" else 0.9,
                      "executor": executor},
    })


def _measure(spec, out: str, slots: int) -> dict:
    from orchestrator.sweep.tuner import run_sweep

    t0 = time.time()
    res = run_sweep(spec, out, printer=lambda s: None)
    total = time.time() - t0
    train = [r.get("train_s") or 0.0 for r in res.records]
    overhead = [r.get("overhead_s") for r in res.records if r.get("overhead_s") is not None]
    setup = [r.get("setup_s") for r in res.records if r.get("setup_s") is not None]
    return {
        "trials": len(res.records),
        "completed": sum(r["status"] == "completed" for r in res.records),
        "train_s_sum": sum(train),
        "train_s_mean": statistics.mean(train) if train else 0.0,
        "fit_s": res.fit_s,
        "sweep_s": total,
        "start_cost_s": total - res.fit_s,
        "efficiency": sum(train) / (res.fit_s * slots),
        "overhead_per_trial_s": statistics.median(overhead) if overhead else float("nan"),
        "setup_per_trial_s": statistics.median(setup) if setup else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only the 5 s trials (no 60 s run)")
    ap.add_argument("--slots", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from cluster.local import connect

    sps = _steps_per_second("gpt-debug")
    out = tempfile.mkdtemp(prefix="geosweep-bench-")
    connect()
    rows = {}
    try:
        # 5s: the default checkpoints (~every 10% of a trial, at reports); 5s_nockpt: only
        # the final one. Their fit-time ratio is what crash safety costs on short trials.
        plans = [("5s", 5.0, "in_trial", None), ("5s_nockpt", 5.0, "in_trial", 0),
                 ("5s_train", 5.0, "train", None)]
        if not args.quick:
            plans.append(("60s", 60.0, "in_trial", None))
        for label, secs, executor, ckpt in plans:
            steps = max(8, int(secs * sps))
            rows[label] = _measure(_spec(f"eff-{label.replace('_', '-')}", steps, executor,
                                         args.slots, checkpoint_every=ckpt), out, args.slots)
            rows[label]["executor"] = executor
            rows[label]["steps"] = steps
    finally:
        from cluster.local import shutdown

        shutdown()
        shutil.rmtree(out, ignore_errors=True)

    print(f"gpt-debug: {sps:.1f} steps/s calibrated; {args.slots} concurrent slots; "
          f"8 trials per sweep; wall = Tuner.fit")
    print(f"{'sweep':<11}{'executor':<10}{'steps':>6}{'train s/trial':>14}{'fit s':>8}"
          f"{'efficiency':>11}{'overhead/trial':>15}{'setup/trial':>12}{'start cost':>11}")
    for k, r in rows.items():
        print(f"{k:<11}{r['executor']:<10}{r['steps']:>6}{r['train_s_mean']:>14.2f}"
              f"{r['fit_s']:>8.1f}{r['efficiency']:>11.3f}{r['overhead_per_trial_s']:>15.2f}"
              f"{r['setup_per_trial_s']:>12.2f}{r['start_cost_s']:>11.1f}")
    out_json = {
        "efficiency_5s": rows["5s"]["efficiency"],
        "efficiency_5s_torchtrainer": rows["5s_train"]["efficiency"],
        "overhead_per_trial_s_in_trial": rows["5s"]["overhead_per_trial_s"],
        "overhead_per_trial_s_torchtrainer": rows["5s_train"]["overhead_per_trial_s"],
        "sweep_start_cost_s": rows["5s"]["start_cost_s"],
        "efficiency_5s_final_checkpoint_only": rows["5s_nockpt"]["efficiency"],
        "fit_ratio_checkpoints_vs_final_only": rows["5s"]["fit_s"] / rows["5s_nockpt"]["fit_s"],
    }
    if "60s" in rows:
        out_json["efficiency_60s"] = rows["60s"]["efficiency"]
    print(json.dumps({k: round(v, 4) for k, v in out_json.items()}))


if __name__ == "__main__":
    main()
