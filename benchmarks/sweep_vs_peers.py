"""geosweep against its peers on one machine: the same trainings, four ways (issue 16 §2).

Arms (each a fresh process tree; wall time = what a user waits, process start to exit):
- ideal:   the trials run back to back in 2 plain Python processes (no orchestration at all);
- optuna:  plain Optuna, TPE, RDB (sqlite) storage shared by 2 processes;
- raytune: raw Ray Tune + OptunaSearch, a local Ray, 2 concurrent trials of 1 CPU;
- geosweep: ``geosweep run`` of the equivalent spec (optuna-tpe, 2 concurrent), cold Ray.
Every arm trains the same gpt-debug trainable (1 thread per trial, lr sampled log-uniformly),
with the step count calibrated so that one training takes ~5 s or ~1 s here. Sizes: 8 x 5 s and
32 x 1 s (``--quick``: 4 x 5 s and 8 x 1 s, one round). Arms are interleaved round by round so
that load from other processes hits them alike; the load average is printed with the results.

    python benchmarks/sweep_vs_peers.py [--quick] [--rounds N] [--warm-ray]

Last line: JSON with ``geosweep_vs_ideal_5s``, ``raytune_vs_ideal_5s``, ``optuna_vs_ideal_5s``,
``geosweep_vs_raytune_1s``, ``time_to_first_trial_s`` (geosweep: process start to the first
trial's start event; cold Ray, and warm with ``--warm-ray``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESET = "gpt-debug"
LR = (3e-4, 3e-2)


# --- the trainable (every arm) ------------------------------------------------------------
def _cfg(steps: int, lr: float, seed: int = 0):
    from workloads.config import apply_overrides, preset

    return apply_overrides(preset(PRESET), {
        "train.steps": steps, "train.eval_every": max(1, steps // 2), "train.metrics_every": 0,
        "optim.lr": lr, "train.seed": seed})


def train_once(steps: int, lr: float, report=None) -> float:
    """One training; returns its final val loss (``report``: called at every eval)."""
    import torch

    from workloads.train import run

    torch.set_num_threads(1)
    res = run(_cfg(steps, lr), report=report)
    return float(res.final_val_loss)


def calibrate() -> float:
    """Training steps per second of the trainable here (1 thread, includes eval)."""
    import torch

    from workloads.config import apply_overrides, preset
    from workloads.train import run

    torch.set_num_threads(1)
    cfg = apply_overrides(preset(PRESET), {"train.steps": 40, "train.eval_every": 0,
                                           "train.metrics_every": 0})
    run(apply_overrides(cfg, {"train.steps": 4}))  # warm-up (first-call costs)
    return 40 / run(cfg).train_time_s


# --- arms, each run as `python sweep_vs_peers.py --arm NAME ...` in a child process ---------
def arm_ideal(n: int, steps: int, rank: int) -> None:
    import math

    for i in range(rank, n, 2):
        lr = math.exp(math.log(LR[0]) + (i + 0.5) / n * (math.log(LR[1]) - math.log(LR[0])))
        train_once(steps, lr)


def arm_optuna(n: int, steps: int, storage: str) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="peers", storage=storage, load_if_exists=True,
                                sampler=optuna.samplers.TPESampler(seed=0))
    study.optimize(lambda t: train_once(steps, t.suggest_float("lr", *LR, log=True)),
                   n_trials=n // 2)


def arm_raytune(n: int, steps: int, tmp: str) -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    def trainable(config):
        train_once(steps, config["lr"],
                   report=lambda rep: tune.report({"loss": rep.scalars.get("val/loss", 0.0)}))

    tuner = tune.Tuner(
        tune.with_resources(trainable, {"CPU": 1}),
        param_space={"lr": tune.loguniform(*LR)},
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=n,
                                    search_alg=OptunaSearch(seed=0), max_concurrent_trials=2,
                                    reuse_actors=True),
        run_config=tune.RunConfig(storage_path=os.path.join(tmp, "results"), verbose=0))
    tuner.fit()


def geosweep_spec(n: int, steps: int, name: str) -> dict:
    return {
        "name": name,
        "workload": {"preset": PRESET},
        "space": {"optim.lr": {"loguniform": list(LR)}},
        "seeds": [0],
        "search": {"algorithm": "optuna-tpe", "num_samples": n, "max_concurrent": 2},
        "budget": {"steps": steps, "eval_every": max(1, steps // 2), "metrics_every": 0},
        "resources": {"workers_per_trial": 1, "cpus_per_worker": 1.0},
    }


# --- the driver ---------------------------------------------------------------------------
def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0",
                "PYTHONPATH": f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"})
    return env


def _spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait(procs: list[subprocess.Popen], what: str, timeout: float) -> None:
    deadline = time.time() + timeout
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            raise RuntimeError(f"{what}: timed out after {timeout:.0f} s") from None
        if p.returncode != 0:
            raise RuntimeError(f"{what} failed (rc {p.returncode}): {err[-2000:]}")


def run_arm(arm: str, n: int, steps: int, tmp: str, timeout: float,
            warm: bool = False) -> dict:
    me = str(Path(__file__).resolve())
    common = ["--n", str(n), "--steps", str(steps)]
    t0 = time.time()
    if arm == "ideal":
        procs = [_spawn([me, "--arm", "ideal", *common, "--rank", str(r)]) for r in (0, 1)]
    elif arm == "optuna":
        db = os.path.join(tmp, f"optuna-{time.time_ns()}.db")
        import optuna  # the study exists before two processes race to create it

        optuna.create_study(study_name="peers", storage=f"sqlite:///{db}")
        procs = [_spawn([me, "--arm", "optuna", *common, "--storage", f"sqlite:///{db}"])
                 for _ in (0, 1)]
    elif arm == "raytune":
        procs = [_spawn([me, "--arm", "raytune", *common, "--tmp", tempfile.mkdtemp(dir=tmp)])]
    elif arm == "geosweep":
        import yaml

        from cluster.warm import current

        warm = warm or current() is not None  # `geosweep run` joins a running warm Ray

        name = f"peers{time.time_ns()}"
        spec = Path(tmp) / f"{name}.yaml"
        spec.write_text(yaml.safe_dump(geosweep_spec(n, steps, name)))
        args = ["-m", "orchestrator.cli", "run", str(spec), "--out", os.path.join(tmp, "gs")]
        procs = [_spawn(args)]
    else:
        raise ValueError(arm)
    _wait(procs, arm, timeout)
    row = {"arm": arm, "n": n, "steps": steps, "wall_s": time.time() - t0}
    if arm == "geosweep":
        from orchestrator.store.parquet import read_trial_records

        recs = read_trial_records(os.path.join(tmp, "gs", name, "parquet"), name)
        row["time_to_first_trial_s"] = min(r["started_at"] for r in recs) - t0
        row["completed"] = sum(r["status"] == "completed" for r in recs)
        row["warm"] = warm
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="4 x 5 s and 8 x 1 s, one round")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--arms", default="ideal,optuna,raytune,geosweep")
    ap.add_argument("--sizes", default="5s,1s", help="which sizes to run (e.g. 1s)")
    ap.add_argument("--warm-ray", action="store_true",
                    help="also time geosweep's first trial with a warm `geosweep ray start`")
    # child-process modes
    ap.add_argument("--arm", default=None)
    ap.add_argument("--n", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--storage", default=None)
    ap.add_argument("--tmp", default=None)
    args = ap.parse_args()
    if args.arm == "ideal":
        return arm_ideal(args.n, args.steps, args.rank)
    if args.arm == "optuna":
        return arm_optuna(args.n, args.steps, args.storage)
    if args.arm == "raytune":
        return arm_raytune(args.n, args.steps, args.tmp)

    os.environ.update({"OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"})
    sps = calibrate()
    sizes = [("5s", 4 if args.quick else 8, 5.0), ("1s", 8 if args.quick else 32, 1.0)]
    want = args.sizes.split(",")
    sizes = [s for s in sizes if s[0] in want]
    if not sizes:
        raise SystemExit(f"--sizes: none of {want} is one of 5s,1s")
    rounds = args.rounds or (1 if args.quick else 2)
    arms = args.arms.split(",")
    tmp = tempfile.mkdtemp(prefix="geosweep-peers-")
    rows: list[dict] = []
    load0 = os.getloadavg()[0]
    for rnd in range(rounds):
        for label, n, secs in sizes:
            steps = max(4, round(secs * sps))
            # rotate the order every round: no arm always runs first (or last)
            order = arms[rnd % len(arms):] + arms[:rnd % len(arms)]
            for arm in order:
                row = run_arm(arm, n, steps, tmp, timeout=60 + 12 * n * secs)
                row.update(size=label, round=rnd, load=os.getloadavg()[0])
                rows.append(row)
                print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                  for k, v in row.items()}), flush=True)
    warm_ttf = None
    if args.warm_ray and "geosweep" in arms:
        warm_ttf = _warm_first_trial(tmp, sps)
    load1 = os.getloadavg()[0]

    def med(arm: str, size: str) -> float | None:
        w = [r["wall_s"] for r in rows if r["arm"] == arm and r["size"] == size]
        return statistics.median(w) if w else None

    def ratios(arm: str, size: str, base: str) -> list[float]:
        """Per-round ratios (each round's arms ran side by side under the same load)."""
        out = []
        for rnd in range(rounds):
            a = [r["wall_s"] for r in rows if (r["arm"], r["size"], r["round"]) == (arm, size, rnd)]
            b = [r["wall_s"] for r in rows
                 if (r["arm"], r["size"], r["round"]) == (base, size, rnd)]
            if a and b:
                out.append(a[0] / b[0])
        return out

    print(f"\n{PRESET}: {sps:.1f} steps/s calibrated on 1 thread; 2 slots; {rounds} round(s); "
          f"load average {load0:.1f} -> {load1:.1f} on {os.cpu_count()} cores")
    print("wall time (process start to exit) as a multiple of ideal, median over rounds")
    print(f"{'trials':<12}{'ideal s':>9}" + "".join(f"{a:>11}" for a in arms if a != "ideal"))
    for label, n, secs in sizes:
        steps = max(4, round(secs * sps))
        cells = [f"{n} x ~{secs:.0f} s".ljust(12), f"{(med('ideal', label) or 0):9.1f}"]
        for a in arms:
            if a != "ideal":
                r = ratios(a, label, "ideal")
                cells.append(f"{statistics.median(r):11.2f}" if r else f"{'-':>11}")
        print("".join(cells) + f"   ({steps} steps/trial)")
    ttf = [r["time_to_first_trial_s"] for r in rows if r["arm"] == "geosweep"]

    def mr(arm, size, base):
        r = ratios(arm, size, base)
        return round(statistics.median(r), 3) if r else None

    out = {
        "geosweep_vs_ideal_5s": mr("geosweep", "5s", "ideal"),
        "raytune_vs_ideal_5s": mr("raytune", "5s", "ideal"),
        "optuna_vs_ideal_5s": mr("optuna", "5s", "ideal"),
        "geosweep_vs_raytune_5s": mr("geosweep", "5s", "raytune"),
        "geosweep_vs_raytune_1s": mr("geosweep", "1s", "raytune"),
        "geosweep_vs_ideal_1s": mr("geosweep", "1s", "ideal"),
        "raytune_vs_ideal_1s": mr("raytune", "1s", "ideal"),
        "time_to_first_trial_s": round(statistics.median(ttf), 2) if ttf else None,
        "time_to_first_trial_warm_s": round(warm_ttf, 2) if warm_ttf is not None else None,
        "load_avg": [round(load0, 2), round(load1, 2)],
        "quick": args.quick,
    }
    print(json.dumps(out))


def _warm_first_trial(tmp: str, sps: float) -> float:
    """geosweep's time to first trial with a warm local Ray (`geosweep ray start`)."""
    me = ["-m", "orchestrator.cli", "ray"]
    _wait([_spawn([*me, "start"])], "geosweep ray start", 120)
    try:
        row = run_arm("geosweep", 2, max(4, round(sps)), tmp, timeout=120, warm=True)
    finally:
        _wait([_spawn([*me, "stop"])], "geosweep ray stop", 60)
    print(json.dumps({"warm_time_to_first_trial_s": round(row["time_to_first_trial_s"], 3),
                      "wall_s": round(row["wall_s"], 3)}), flush=True)
    return row["time_to_first_trial_s"]


if __name__ == "__main__":
    main()
