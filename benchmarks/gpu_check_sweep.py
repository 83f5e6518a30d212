"""Check (a) of benchmarks/gpu_check.py: a real ``geosweep run`` of search_spaces/
gpu_smoke.yaml against the same trainings back to back in this process.

The sweep runs as the CLI (its own local Ray, MLflow, Parquet), timed from outside; its
records give each trial's wall and training time (trial wall - training time = the per-trial
overhead, target <= 2 s) and the GPU it ran on (the ``node`` label). Back to back, the same
trial configs train one after another with ``workloads.train.run`` in this process, as many as
the check's budget leaves time for; the total for all of them is their mean times the count
(``solo_n`` says how many ran). The token cache is built first, so neither side pays for it.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from gpu_checks import Ctx, Result, _show

ROOT = Path(__file__).resolve().parents[1]


def _spec_data(ctx: Ctx) -> dict:
    from orchestrator.spec.yaml_reader import load_spec_data

    data = load_spec_data("gpu_smoke")
    for k, v in ctx.profile["a_sets"].items():  # --cpu: tiny sizes, no GPU
        data[k] = {**data[k], **v} if isinstance(v, dict) and k in ("resources",) else v
    return data


def _run_cli(spec_path: Path, out: Path, timeout: float) -> tuple[int, float, str]:
    """``geosweep run`` in its own session, so that a stop ends it and the Ray it started."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0",
               PYTHONUNBUFFERED="1")
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", str(spec_path),
                             "--out", str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=max(1.0, timeout))
    except BaseException:  # the budget's alarm or our own timeout: end the sweep's session
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc.returncode, time.perf_counter() - t, text


def check_a(ctx: Ctx, rows: list[Result]) -> None:
    from orchestrator.spec.yaml_reader import spec_from_dict
    from orchestrator.store.layout import sweep_paths
    from orchestrator.store.parquet import read_trial_records
    from orchestrator.sweep.space import grid_trials
    from workloads.data import load_tokens

    data = _spec_data(ctx)
    spec = spec_from_dict(data)
    load_tokens(spec.base_config().data)  # the token cache, before either side times anything
    if ctx.out:
        Path(ctx.out).mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=ctx.out or None))
    spec_path = out / "gpu_smoke.yaml"
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    sweep = Result("a", "sweep")
    rows.append(sweep)
    rc, wall, text = _run_cli(spec_path, out, ctx.left() - 10)
    if rc != 0:
        tail = " | ".join(text.strip().splitlines()[-3:])[-300:]
        raise RuntimeError(f"geosweep run exited {rc}: {tail}")
    recs = read_trial_records(sweep_paths(spec, out).parquet_root, spec.name)
    done = [r for r in recs if r["status"] == "completed"]
    over = [r["wall_s"] - r["train_s"] for r in done if r.get("train_s") is not None]
    phase = max(r["ended_at"] for r in recs) - min(r["started_at"] for r in recs)
    # the first wave starts a Tune trial process each (Python, Ray, torch, CUDA); the trials
    # after it reuse those processes (reuse_actors)
    first_end = min(r["ended_at"] for r in recs)
    wave = [r for r in done if r["started_at"] < first_end and r.get("train_s") is not None]
    later = [r for r in done if r["started_at"] >= first_end and r.get("train_s") is not None]
    gpus = collections.Counter(str(r.get("node") or "").partition(" gpu ")[2] or "none"
                               for r in recs)
    sweep.values = {"trials": len(recs), "completed": len(done), "sweep_s": wall,
                    "trials_phase_s": phase,
                    "train_s_mean": statistics.mean(r["train_s"] for r in done),
                    "overhead_per_trial_s": statistics.median(over) if over else float("nan"),
                    "overhead_first_wave_s": _median_over(wave),
                    "overhead_later_s": _median_over(later),
                    "overhead_max_s": max(over) if over else float("nan")}
    sweep.note = "trials per GPU: " + json.dumps(dict(sorted(gpus.items())))
    sweep.status = "ok" if len(done) == len(recs) else "error"
    _show(sweep, list(sweep.values))
    _back_to_back(ctx, rows, spec, grid_trials(spec), sweep)


def _median_over(recs: list[dict]) -> float:
    return statistics.median(r["wall_s"] - r["train_s"] for r in recs) if recs else float("nan")


def _back_to_back(ctx: Ctx, rows: list[Result], spec, flats: list[dict], sweep: Result) -> None:
    from workloads.train import run

    solo = Result("a", "back to back")
    rows.append(solo)
    threads = torch.get_num_threads()
    if ctx.device.type == "cpu":  # the sweep's trials had cpus_per_worker threads each
        torch.set_num_threads(max(1, int(spec.resources.cpus_per_worker)))
    walls, trains = [], []
    try:
        for flat in flats:
            # the next one must fit: the mean so far (or a trial's own training time) + 10 s
            need = (statistics.mean(walls) if walls else sweep.values["train_s_mean"]) + 10
            if walls and ctx.left() < need:
                break
            t = time.perf_counter()
            res = run(spec.trial_config(flat))
            walls.append(time.perf_counter() - t)
            trains.append(res.train_time_s)
    finally:
        torch.set_num_threads(threads)
    total = statistics.mean(walls) * len(flats)
    sv = sweep.values
    solo.values = {"solo_n": len(walls), "solo_wall_s_mean": statistics.mean(walls),
                   "solo_train_s_mean": statistics.mean(trains), "back_to_back_s": total,
                   "sweep_vs_back_to_back": sv["sweep_s"] / total,
                   "trials_phase_vs_back_to_back": sv["trials_phase_s"] / total,
                   "packed_train_vs_solo": sv["train_s_mean"] / statistics.mean(trains)}
    solo.status = "ok"
    solo.note = (f"{len(walls)} of {len(flats)} run; the total is their mean x {len(flats)}"
                 if len(walls) < len(flats) else "")
    _show(solo, list(solo.values))
