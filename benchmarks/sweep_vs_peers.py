"""geosweep against its peers on one machine: the same trainings, four ways (issues 16, 32).

Arms (each a fresh process tree; wall time = what a user waits, process start to exit):
- ideal:   the trials run back to back in 2 plain Python processes (no orchestration at all);
- optuna:  plain Optuna, TPE, RDB (sqlite) storage shared by 2 processes;
- raytune: raw Ray Tune + OptunaSearch, a local Ray, 2 concurrent trials of 1 CPU;
- geosweep: ``geosweep run`` of the equivalent spec (optuna-tpe, 2 concurrent), cold Ray;
- geosweep_lean: the same with ``budget.curve_every: 0``: the per-step train curve stored at
  reports only, the data raw Tune's trainable keeps (its 2 reports), where geosweep stores
  3 points a step by default: what geosweep's orchestration costs beside what its curve does.
Every arm trains the same gpt-debug trainable (1 thread per trial, lr sampled log-uniformly),
with the step count calibrated so that one training takes ~5 s or ~1 s here. Sizes: 8 x 5 s and
32 x 1 s (``--quick``: 4 x 5 s and 8 x 1 s, one round), and ``reports``: raw Tune and geosweep
only, 4 x ~3 s trials that report 20 times each (every second report of geosweep's carries
its default checkpoint), for the time a report blocks training. Arms are interleaved round by
round so that load from other processes hits them alike; the load average is printed with the
results.

    python benchmarks/sweep_vs_peers.py [--quick] [--rounds N] [--no-warm-ray]

Measured per raw Tune and geosweep run, by the same definitions (driver-side trial start and
end events: geosweep's trial records, a 3-hook callback in the raw Tune arm):
- time to the first trial: process start to the first trial's start event;
- teardown: the last trial's end event to the process's exit;
- driver CPU per extra trial: the driver process's own CPU time (all its threads, read from
  /proc every 50 ms) from the end of the middle trial to the end of the last one, over the
  trials that ended in between (start-up costs stay out); and of its main thread alone
  (Tune's event loop: what a result waits for);
- report blocking: how long each ``tune.report`` call of a trial took, timed inside the trial
  (geosweep: ``report_block_ms`` / ``checkpoint_report_ms`` of its timing; a trial's last
  report is not counted in either arm);
- warm (unless ``--no-warm-ray``): both once more per round on a warm local Ray (``geosweep ray
  start``; raw Tune joins it with ``ray.init(address=...)``), 2 x 1 s trials, order alternating.

Last line: JSON with every arm's ratio to the ideal (``<arm>_vs_ideal_<size>``),
``geosweep_vs_raytune_5s``/``_1s``, ``report_block_ms_median``, ``checkpoint_report_ms_median``,
``driver_cpu_s_per_trial``, ``time_to_first_trial_s`` (cold), ``time_to_first_trial_warm_s``,
``teardown_s`` (warm Ray), ``teardown_cold_s``, raw Tune's figure of each beside it
(``raytune_*``), the lean arm's ``geosweep_lean_vs_raytune_5s``/``_1s`` and
``geosweep_lean_driver_cpu_s_per_trial``, and ``load_avg``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESET = "gpt-debug"
LR = (3e-4, 3e-2)


# --- the trainable (every arm) ------------------------------------------------------------
def _eval_every(steps: int, reports: int) -> int:
    return max(1, steps // reports)


def _cfg(steps: int, lr: float, seed: int = 0, reports: int = 2):
    from workloads.config import apply_overrides, preset

    return apply_overrides(preset(PRESET), {
        "train.steps": steps, "train.eval_every": _eval_every(steps, reports),
        "train.metrics_every": 0, "optim.lr": lr, "train.seed": seed})


def train_once(steps: int, lr: float, report=None, reports: int = 2) -> float:
    """One training; returns its final val loss (``report``: called at every eval)."""
    import torch

    from workloads.train import run

    torch.set_num_threads(1)
    res = run(_cfg(steps, lr, reports=reports), report=report)
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


def arm_raytune(n: int, steps: int, tmp: str, reports: int = 2,
                address: str | None = None) -> None:
    """Raw Ray Tune as a user writes it; ``_Times`` only notes the trials' start and end
    times (three dict writes per trial) and each trial writes its report times at its end."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    if address:
        ray.init(address=address, _node_ip_address="127.0.0.1", log_to_driver=False)
    else:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    blocks_dir = os.path.join(tmp, "blocks")
    os.makedirs(blocks_dir, exist_ok=True)

    def trainable(config):
        blocks: list[float] = []

        def report(rep):
            t = time.perf_counter()
            tune.report({"loss": rep.scalars.get("val/loss", 0.0)})
            blocks.append(1000 * (time.perf_counter() - t))

        train_once(steps, config["lr"], report=report, reports=reports)
        name = tune.get_context().get_trial_id()
        with open(os.path.join(blocks_dir, f"{name}.json"), "w") as f:
            json.dump(blocks[:-1], f)  # the last report: not counted (as in geosweep)

    class _Times(tune.Callback):
        def __init__(self):
            self.times: dict[str, list] = {}

        def on_trial_start(self, iteration, trials, trial, **info):
            self.times[trial.trial_id] = [time.time(), None]

        def on_trial_complete(self, iteration, trials, trial, **info):
            self.times[trial.trial_id][1] = time.time()

        on_trial_error = on_trial_complete

        def on_experiment_end(self, trials, **info):
            with open(os.path.join(tmp, "times.json"), "w") as f:
                json.dump(self.times, f)

    tuner = tune.Tuner(
        tune.with_resources(trainable, {"CPU": 1}),
        param_space={"lr": tune.loguniform(*LR)},
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=n,
                                    search_alg=OptunaSearch(seed=0), max_concurrent_trials=2,
                                    reuse_actors=True),
        run_config=tune.RunConfig(storage_path=os.path.join(tmp, "results"), verbose=0,
                                  callbacks=[_Times()]))
    tuner.fit()


def geosweep_spec(n: int, steps: int, name: str, reports: int = 2, lean: bool = False) -> dict:
    budget = {"steps": steps, "eval_every": _eval_every(steps, reports), "metrics_every": 0}
    if lean:
        budget["curve_every"] = 0
    return {
        "name": name,
        "workload": {"preset": PRESET},
        "space": {"optim.lr": {"loguniform": list(LR)}},
        "seeds": [0],
        "search": {"algorithm": "optuna-tpe", "num_samples": n, "max_concurrent": 2},
        "budget": budget,
        "resources": {"workers_per_trial": 1, "cpus_per_worker": 1.0},
    }


# --- the driver ---------------------------------------------------------------------------
def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0",
                "PYTHONPATH": f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"})
    return env


def _spawn(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env={**_env(), **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


class _CpuTrace:
    """(time, CPU seconds of the process, of its main thread) every 50 ms, user + system.
    The main thread of a Tune driver is Tune's event loop; the others are the sinks' writer
    threads (geosweep) and Ray's own."""

    def __init__(self, pid: int, every: float = 0.05) -> None:
        self.pid, self.every, self.points = pid, every, []
        self._tick = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _cpu(self, path: str) -> float:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self._tick

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.points.append((time.time(), self._cpu(f"/proc/{self.pid}/stat"),
                                    self._cpu(f"/proc/{self.pid}/task/{self.pid}/stat")))
            except (OSError, IndexError, ValueError):
                return  # the process is gone (or a zombie without stats)
            self._stop.wait(self.every)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, t: float, main: bool = False) -> float | None:
        """CPU seconds at time ``t`` (the last sample at or before it); ``main``: the main
        thread's."""
        before = [p[2 if main else 1] for p in self.points if p[0] <= t]
        return before[-1] if before else None


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


def _trial_figures(row: dict, t0: float, t_exit: float, spans: list[tuple[float, float]],
                   cpu: _CpuTrace) -> None:
    """Time to the first trial, teardown and driver CPU per trial from the trials' start/end
    event times (unix seconds)."""
    first, last = min(a for a, _ in spans), max(b for _, b in spans)
    row["time_to_first_trial_s"] = first - t0
    row["teardown_s"] = t_exit - last
    # per extra trial: from the end of the middle trial to the end of the last one (the
    # start-up's one-off costs, an MLflow store still being built, stay out)
    ends = sorted(b for _, b in spans)
    mid = ends[(len(ends) - 1) // 2]
    extra = len(ends) - 1 - (len(ends) - 1) // 2
    for key, main in (("driver_cpu_s_per_trial", False), ("driver_loop_cpu_s_per_trial", True)):
        c0, c1 = cpu.at(mid, main), cpu.at(last, main)
        if c0 is not None and c1 is not None and extra:
            row[key] = (c1 - c0) / extra


def run_arm(arm: str, n: int, steps: int, tmp: str, timeout: float,
            warm: dict | None = None, reports: int = 2) -> dict:
    """One arm's run. ``warm``: the warm Ray's record (raw Tune joins it; geosweep joins any
    warm Ray by itself)."""
    me = str(Path(__file__).resolve())
    common = ["--n", str(n), "--steps", str(steps), "--reports", str(reports)]
    t0 = time.time()
    cpu = None
    if arm == "ideal":
        procs = [_spawn([me, "--arm", "ideal", *common, "--rank", str(r)]) for r in (0, 1)]
    elif arm == "optuna":
        db = os.path.join(tmp, f"optuna-{time.time_ns()}.db")
        import optuna  # the study exists before two processes race to create it

        optuna.create_study(study_name="peers", storage=f"sqlite:///{db}")
        procs = [_spawn([me, "--arm", "optuna", *common, "--storage", f"sqlite:///{db}"])
                 for _ in (0, 1)]
    elif arm == "raytune":
        rtmp = tempfile.mkdtemp(dir=tmp)
        extra, env = [], None
        if warm is not None:
            from cluster.ray_loopback import LOOPBACK_VAR
            from cluster.warm import join_env

            # what a user exports to join it: its token, and 127.0.0.1 kept as the node IP
            extra = ["--address", warm["address"]]
            env = {**join_env(warm), LOOPBACK_VAR: "0"}
        procs = [_spawn([me, "--arm", "raytune", *common, "--tmp", rtmp, *extra], env)]
        cpu = _CpuTrace(procs[0].pid)
    elif arm in ("geosweep", "geosweep_lean"):
        import yaml

        name = f"peers{time.time_ns()}"
        spec = Path(tmp) / f"{name}.yaml"
        spec.write_text(yaml.safe_dump(geosweep_spec(n, steps, name, reports,
                                                     lean=arm == "geosweep_lean")))
        args = ["-m", "orchestrator.cli", "run", str(spec), "--out", os.path.join(tmp, "gs")]
        procs = [_spawn(args)]
        cpu = _CpuTrace(procs[0].pid)
    else:
        raise ValueError(arm)
    try:
        _wait(procs, arm, timeout)
    finally:
        if cpu is not None:
            cpu.close()
    t_exit = time.time()
    row = {"arm": arm, "n": n, "steps": steps, "wall_s": t_exit - t0, "warm": warm is not None}
    if arm == "raytune":
        times = json.loads(Path(rtmp, "times.json").read_text())
        _trial_figures(row, t0, t_exit, [tuple(v) for v in times.values()], cpu)
        row["report_block_ms"] = [b for f in Path(rtmp, "blocks").glob("*.json")
                                  for b in json.loads(f.read_text())]
    if arm in ("geosweep", "geosweep_lean"):
        from orchestrator.store.parquet import read_trial_records

        recs = read_trial_records(os.path.join(tmp, "gs", name, "parquet"), name)
        _trial_figures(row, t0, t_exit, [(r["started_at"], r["ended_at"]) for r in recs], cpu)
        row["completed"] = sum(r["status"] == "completed" for r in recs)
        timing = [r.get("timing") or {} for r in recs]
        row["report_block_ms"] = [b for t in timing for b in t.get("report_block_ms", [])]
        row["checkpoint_report_ms"] = [b for t in timing
                                       for b in t.get("checkpoint_report_ms", [])]
    return row


def _printable(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        if isinstance(v, list):
            out[k + "_median"] = round(statistics.median(v), 2) if v else None
            out[k + "_n"] = len(v)
        else:
            out[k] = round(v, 3) if isinstance(v, float) else v
    return out


SIZES = {  # label: (trials, trials with --quick, seconds per training, reports per trial)
    "5s": (8, 4, 5.0, 2),
    "1s": (32, 8, 1.0, 2),
    "reports": (4, 4, 3.0, 20),
}
REPORT_ARMS = ("raytune", "geosweep")  # the reports size: the two that go through tune.report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="4 x 5 s and 8 x 1 s, one round")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--arms", default="ideal,optuna,raytune,geosweep,geosweep_lean")
    ap.add_argument("--sizes", default="5s,1s,reports",
                    help="which sizes to run (of 5s, 1s, reports)")
    ap.add_argument("--no-warm-ray", action="store_true",
                    help="skip the runs on a warm `geosweep ray start`")
    # child-process modes
    ap.add_argument("--arm", default=None)
    ap.add_argument("--n", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--reports", type=int, default=2)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--storage", default=None)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--address", default=None)
    args = ap.parse_args()
    if args.arm == "ideal":
        return arm_ideal(args.n, args.steps, args.rank)
    if args.arm == "optuna":
        return arm_optuna(args.n, args.steps, args.storage)
    if args.arm == "raytune":
        return arm_raytune(args.n, args.steps, args.tmp, args.reports, args.address)

    os.environ.update({"OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"})
    want = args.sizes.split(",")
    bad = [w for w in want if w not in SIZES]
    if bad:
        raise SystemExit(f"--sizes: {bad} not among {', '.join(SIZES)}")
    sps = calibrate()
    rounds = args.rounds or (1 if args.quick else 2)
    arms = args.arms.split(",")
    tmp = tempfile.mkdtemp(prefix="geosweep-peers-")
    rows: list[dict] = []
    load0 = os.getloadavg()
    for rnd in range(rounds):
        for label in want:
            full, quick, secs, reports = SIZES[label]
            n = quick if args.quick else full
            steps = max(4, round(secs * sps))
            here = [a for a in arms if label != "reports" or a in REPORT_ARMS]
            # rotate the order every round: no arm always runs first (or last)
            order = here[rnd % len(here):] + here[:rnd % len(here)]
            for arm in order:
                row = run_arm(arm, n, steps, tmp, timeout=90 + 12 * n * secs, reports=reports)
                row.update(size=label, round=rnd, load=os.getloadavg()[0])
                rows.append(row)
                print(json.dumps(_printable(row)), flush=True)
    if not args.no_warm_ray and "geosweep" in arms:
        rows += _warm_runs(tmp, sps, [a for a in arms if a in REPORT_ARMS], rounds)
    load1 = os.getloadavg()
    shutil.rmtree(tmp, ignore_errors=True)
    _summary(rows, arms, want, rounds, sps, load0, load1, args.quick)


def _summary(rows: list[dict], arms: list[str], sizes: list[str], rounds: int, sps: float,
             load0: tuple, load1: tuple, quick: bool) -> None:
    cold = [r for r in rows if not r["warm"]]

    def ratios(arm: str, size: str, base: str) -> list[float]:
        """Per-round ratios (each round's arms ran side by side under the same load)."""
        out = []
        for rnd in range(rounds):
            a = [r["wall_s"] for r in cold if (r["arm"], r["size"], r["round"]) == (arm, size, rnd)]
            b = [r["wall_s"] for r in cold
                 if (r["arm"], r["size"], r["round"]) == (base, size, rnd)]
            if a and b:
                out.append(a[0] / b[0])
        return out

    def mr(arm: str, size: str, base: str) -> float | None:
        r = ratios(arm, size, base)
        return round(statistics.median(r), 3) if r else None

    def med(key: str, arm: str, warm: bool = False, sizes_: tuple = ("5s", "1s")) -> float | None:
        v = [r[key] for r in rows if r["arm"] == arm and r["warm"] == warm
             and (warm or r["size"] in sizes_) and r.get(key) is not None]
        return round(statistics.median(v), 3) if v else None

    def pooled(key: str, arm: str, size: str | None = None) -> float | None:
        v = [b for r in rows if r["arm"] == arm and (size is None or r["size"] == size)
             for b in r.get(key) or []]
        return round(statistics.median(v), 2) if v else None

    def cpu(arm: str, key: str = "driver_cpu_s_per_trial") -> float | None:
        """The dearer of the two sizes' medians."""
        v = [med(key, arm, sizes_=(s,)) for s in ("5s", "1s")]
        v = [x for x in v if x is not None]
        return max(v) if v else None

    la0, la1 = (", ".join(f"{x:.1f}" for x in la) for la in (load0, load1))
    print(f"\n{PRESET}: {sps:.1f} steps/s calibrated on 1 thread; 2 slots; {rounds} round(s); "
          f"load average (1, 5, 15 min) {la0} -> {la1} on {os.cpu_count()} cores")
    print("wall time (process start to exit) as a multiple of ideal, median over rounds")
    print(f"{'trials':<14}{'ideal s':>9}" + "".join(f"{a:>11}" for a in arms if a != "ideal")
          + f"{'geo/raw':>9}")
    for label in sizes:
        if label == "reports":
            continue
        full, quick_n, secs, _ = SIZES[label]
        n = quick_n if quick else full
        ideal = [r["wall_s"] for r in cold if r["arm"] == "ideal" and r["size"] == label]
        cells = [f"{n} x ~{secs:.0f} s".ljust(14),
                 f"{statistics.median(ideal):9.1f}" if ideal else f"{'-':>9}"]
        for a in arms:
            if a != "ideal":
                v = mr(a, label, "ideal")
                cells.append(f"{v:11.2f}" if v is not None else f"{'-':>11}")
        g = mr("geosweep", label, "raytune")
        cells.append(f"{g:9.2f}" if g is not None else f"{'-':>9}")
        print("".join(cells) + f"   ({max(4, round(secs * sps))} steps/trial)")

    print("\nper trial and per run (medians), raw Ray Tune beside geosweep:")
    lines = [
        ("report blocks training, ms", pooled("report_block_ms", "raytune", "reports"),
         pooled("report_block_ms", "geosweep", "reports"), "<= 10"),
        ("  a report with a checkpoint, ms", None, pooled("checkpoint_report_ms", "geosweep"),
         ""),
        ("driver CPU per trial, CPU-s", cpu("raytune"), cpu("geosweep"), "<= 0.07"),
        ("  of it Tune's event loop, CPU-s", cpu("raytune", "driver_loop_cpu_s_per_trial"),
         cpu("geosweep", "driver_loop_cpu_s_per_trial"), ""),
        ("  curve at reports only (lean), CPU-s", None, cpu("geosweep_lean"), ""),
        ("time to first trial, cold, s", med("time_to_first_trial_s", "raytune"),
         med("time_to_first_trial_s", "geosweep"), "<= 7"),
        ("time to first trial, warm, s", med("time_to_first_trial_s", "raytune", True),
         med("time_to_first_trial_s", "geosweep", True), "<= 4.5"),
        ("teardown, cold Ray, s", med("teardown_s", "raytune"), med("teardown_s", "geosweep"),
         ""),
        ("teardown, warm Ray, s", med("teardown_s", "raytune", True),
         med("teardown_s", "geosweep", True), "<= 1"),
    ]
    print(f"{'':<34}{'raw Tune':>10}{'geosweep':>10}{'target':>9}")
    for what, raw, geo, target in lines:
        cells = [f"{v:10.3f}" if v is not None else f"{'-':>10}" for v in (raw, geo)]
        print(f"{what:<34}{''.join(cells)}{target:>9}")

    out = {}
    for size in ("5s", "1s"):
        for a in ("raytune", "optuna", "geosweep", "geosweep_lean"):
            out[f"{a}_vs_ideal_{size}"] = mr(a, size, "ideal")
        out[f"geosweep_vs_raytune_{size}"] = mr("geosweep", size, "raytune")
        out[f"geosweep_lean_vs_raytune_{size}"] = mr("geosweep_lean", size, "raytune")
    out.update({
        "report_block_ms_median": pooled("report_block_ms", "geosweep", "reports"),
        "raytune_report_block_ms_median": pooled("report_block_ms", "raytune", "reports"),
        "checkpoint_report_ms_median": pooled("checkpoint_report_ms", "geosweep"),
        "driver_cpu_s_per_trial": cpu("geosweep"),
        "raytune_driver_cpu_s_per_trial": cpu("raytune"),
        "geosweep_lean_driver_cpu_s_per_trial": cpu("geosweep_lean"),
        "driver_loop_cpu_s_per_trial": cpu("geosweep", "driver_loop_cpu_s_per_trial"),
        "raytune_driver_loop_cpu_s_per_trial": cpu("raytune", "driver_loop_cpu_s_per_trial"),
        "driver_cpu_s_per_trial_5s": med("driver_cpu_s_per_trial", "geosweep", sizes_=("5s",)),
        "driver_cpu_s_per_trial_1s": med("driver_cpu_s_per_trial", "geosweep", sizes_=("1s",)),
        "time_to_first_trial_s": med("time_to_first_trial_s", "geosweep"),
        "raytune_time_to_first_trial_s": med("time_to_first_trial_s", "raytune"),
        "time_to_first_trial_warm_s": med("time_to_first_trial_s", "geosweep", True),
        "raytune_time_to_first_trial_warm_s": med("time_to_first_trial_s", "raytune", True),
        "teardown_s": med("teardown_s", "geosweep", True),
        "raytune_teardown_s": med("teardown_s", "raytune", True),
        "teardown_cold_s": med("teardown_s", "geosweep"),
        "raytune_teardown_cold_s": med("teardown_s", "raytune"),
        "load_avg": [round(load0[0], 2), round(load1[0], 2)],
        "load_avg_5min": [round(load0[1], 2), round(load1[1], 2)],
        "quick": quick,
    })
    print(json.dumps(out))


def _warm_runs(tmp: str, sps: float, arms: list[str], rounds: int = 1) -> list[dict]:
    """geosweep (and raw Tune) ``rounds`` times each on a warm local Ray (`geosweep ray
    start`), 2 x 1 s trials, the order alternating: time to the first trial and teardown with
    Ray already up (one run each was as noisy as the gap it measured: the first run on a fresh
    warm Ray pays more than the next)."""
    from cluster.warm import current

    me = ["-m", "orchestrator.cli", "ray"]
    started = current() is None  # a warm Ray someone else keeps is used, not stopped
    if started:
        _wait([_spawn([*me, "start"])], "geosweep ray start", 180)
    rows = []
    try:
        warm = current()
        if warm is None:
            raise RuntimeError("geosweep ray start: no warm Ray found after it")
        for rnd in range(rounds):
            for arm in arms[rnd % len(arms):] + arms[:rnd % len(arms)]:
                row = run_arm(arm, 2, max(4, round(sps)), tmp, timeout=180, warm=warm)
                row.update(size="warm", round=rnd, load=os.getloadavg()[0])
                rows.append(row)
                print(json.dumps(_printable(row)), flush=True)
    finally:
        if started:
            _wait([_spawn([*me, "stop"])], "geosweep ray stop", 60)
    return rows


if __name__ == "__main__":
    main()
