"""The TorchTrainer executor against the in-trial one: what a Ray Train trial costs (issue 16 §5).

The same gpt-debug trainable (~1 s of training, 1 thread) as a 4-trial grid sweep, three arms
run side by side on one local Ray, alternated round by round so that load from other
processes hits them alike:
- ``in_trial``: the single-worker path (the trial trains inside its Tune actor);
- ``train1``:   ``resources.executor: train``, a TorchTrainer of 1 worker per trial;
- ``train2``:   the same with 2 workers per trial (DDP over gloo), unless ``--no-ddp``;
- ``auto_gpu``: ``executor: auto`` with ``gpus_per_worker: 1`` on a Ray that has one logical GPU
  (``num_gpus=1``; the training stays on the CPU): the path a single-GPU trial takes, which
  ``auto`` now runs in the trial (before, a 1-worker GPU trial took ``train1``'s path).
Every arm runs ONE trial at a time (``max_concurrent: 1``): on a 2-core machine a 2-worker
trial fills both cores, so the only fair comparison is one slot for every arm.

Figures per arm (medians over rounds): per-trial overhead = the trial's wall time seen by the
sweep's callback minus its training time (model/data build, Ray Train start and stop,
reports), over all trials and over the trials after the first of each sweep (``after first``:
what a warm sweep pays per trial, once the Tune actor and Ray Train's coordinator exist);
sweep wall time (``run_sweep``, Ray already up) as a multiple of the ideal (the trials'
training times back to back). ``train_vs_in_trial``: the sweep wall time of ``train1``
over that of ``in_trial`` in the same round (target <= 1.5; per-trial overhead target <= 5 s).

    python benchmarks/train_executor.py [--rounds N] [--trials N] [--seconds S] [--no-ddp]

Last line: JSON with ``train_vs_in_trial``, ``train2_vs_in_trial``,
``train_vs_in_trial_fit`` (the same for the Tune phase alone: without the sweep's start and
end, which both arms share), ``train_overhead_per_trial_s``, ``train2_overhead_per_trial_s``,
``in_trial_overhead_per_trial_s``, ``auto_gpu_overhead_per_trial_s``, the same
``*_after_first_s`` (trials after each sweep's first), ``train_vs_ideal``,
``in_trial_vs_ideal``, ``<arm>_gap_per_trial_s`` ((fit s - training) / trials: Tune's time
around the trials too), and the CPU seconds per trial of each arm (``train_cpu_per_trial_s``,
``in_trial_cpu_per_trial_s``, ``train_cpu_overhead_per_trial_s``: their difference), a figure
that load from other processes barely moves.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

ARMS = {  # label: (executor, workers_per_trial, cpus_per_worker, gpus_per_worker)
    "in_trial": ("in_trial", 1, 1.0, 0.0),
    "train1": ("train", 1, 1.0, 0.0),
    "train2": ("train", 2, 0.49, 0.0),  # 2 x 0.49 + the driver's 0.01 fit on one 2-core node
    "auto_gpu": ("auto", 1, 1.0, 1.0),  # one logical GPU: in the trial since issue 31
}


def _steps_per_second() -> float:
    """Training steps per second of gpt-debug here (1 thread; after a warm-up run)."""
    import torch

    from workloads.config import apply_overrides, preset
    from workloads.train import run

    torch.set_num_threads(1)
    cfg = apply_overrides(preset("gpt-debug"), {"train.steps": 30, "train.eval_every": 0,
                                                "train.metrics_every": 0})
    run(apply_overrides(cfg, {"train.steps": 3}))
    return 30 / run(cfg).train_time_s


def _spec(name: str, arm: str, steps: int, trials: int):
    from orchestrator.spec.yaml_reader import spec_from_dict

    executor, workers, cpus, gpus = ARMS[arm]
    return spec_from_dict({
        "name": name,
        "workload": {"preset": "gpt-debug"},
        "space": {"optim.lr": {"grid": [1e-3 * (1 + i / 10) for i in range(trials)]}},
        "seeds": [0],
        "search": {"algorithm": "grid", "max_concurrent": 1},
        "budget": {"steps": steps, "eval_every": max(1, steps // 2), "metrics_every": 0},
        "resources": {"workers_per_trial": workers, "cpus_per_worker": cpus,
                      "gpus_per_worker": gpus, "executor": executor},
    })


class _TreeCpu:
    """CPU seconds used by this driver and every process under it: the local Ray it started
    (GCS, raylet, workers), ended processes included. A parent's reaped-children times do not
    count them: the raylet ignores SIGCHLD (``SigIgn`` in its /proc status), so the kernel
    reaps the worker processes it started and their CPU time reaches no parent. A thread reads
    every process's own CPU time every ``interval`` s and keeps each one's last reading: an
    ended process loses at most its last interval. The thread's own CPU is left out. Unlike
    wall time, the figure barely moves with the load from other processes."""

    def __init__(self, interval: float = 0.25) -> None:
        import threading

        import ray  # noqa: F401 - puts its vendored psutil on the path

        # isort: split
        import psutil

        self._psutil, self._me = psutil, psutil.Process()
        self._last: dict[tuple[int, float], float] = {}  # (pid, start time) -> CPU s
        self._own = 0.0  # the sampling thread's CPU seconds
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, name="tree-cpu", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        t0 = time.thread_time()
        readings = {}
        for p in [self._me, *self._me.children(recursive=True)]:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    readings[(p.pid, p.create_time())] = t.user + t.system
            except self._psutil.Error:  # ended meanwhile: its last reading stays
                continue
        with self._lock:
            self._last.update(readings)
            self._own += time.thread_time() - t0

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def total(self) -> float:
        self._sample()
        with self._lock:
            return sum(self._last.values()) - self._own

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _cluster_cpu() -> float:
    """CPU seconds so far of the driver and every process under it (``_TreeCpu``)."""
    if not _METER:
        _METER.append(_TreeCpu())
    return _METER[0].total()


_METER: list[_TreeCpu] = []


def _measure(spec, out: str) -> dict:
    from orchestrator.sweep.tuner import run_sweep

    cpu0, t0 = _cluster_cpu(), time.time()
    res = run_sweep(spec, out, printer=lambda s: None)
    wall = time.time() - t0
    cpu = _cluster_cpu() - cpu0
    done = [r for r in res.records if r["status"] == "completed"]
    train = [r["train_s"] for r in done if r.get("train_s") is not None]
    over = [r["overhead_s"] for r in done if r.get("overhead_s") is not None]
    later = [r["overhead_s"] for r in sorted(done, key=lambda r: r["started_at"])[1:]
             if r.get("overhead_s") is not None]
    setup = [r["setup_s"] for r in done if r.get("setup_s") is not None]
    ideal = sum(train)
    return {"trials": len(res.records), "completed": len(done), "sweep_s": wall,
            "cpu_per_trial_s": cpu / max(1, len(res.records)),
            "fit_s": res.fit_s, "ideal_s": ideal, "train_s": statistics.median(train),
            "overhead_s": statistics.median(over), "setup_s": statistics.median(setup),
            "later_overhead_s": statistics.median(later) if later else float("nan"),
            "vs_ideal": wall / ideal if ideal else float("nan"),
            # one trial at a time: the Tune phase's time per trial not spent training
            "gap_s": (res.fit_s - ideal) / max(1, len(res.records))}


def _start_ray(cpus: int) -> None:
    """A local Ray as cluster.local.connect starts one, plus one logical GPU (``auto_gpu``)."""
    from cluster.local import ray_env, worker_env
    from cluster.ray_loopback import loopback_env

    ray_env()
    loopback_env()
    import ray

    ray.init(num_cpus=cpus, num_gpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": worker_env()})


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=1.0, help="training time per trial")
    ap.add_argument("--no-ddp", action="store_true", help="skip the 2-worker arm")
    ap.add_argument("--arms", default="", help="comma-separated arms (default: all)")
    args = ap.parse_args()
    if args.rounds < 1 or args.trials < 1 or args.seconds <= 0:
        raise SystemExit("train_executor: --rounds, --trials and --seconds must be positive")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # a loaded machine starts Ray's worker processes slowly; Ray's 60 s would fail trials
    os.environ.setdefault("RAY_worker_register_timeout_seconds", "600")
    from cluster.local import shutdown

    sps = _steps_per_second()
    steps = max(4, round(args.seconds * sps))
    arms = [a for a in ARMS if not (args.no_ddp and a == "train2")
            and (not args.arms or a in args.arms.split(","))]
    if "in_trial" not in arms:
        arms.insert(0, "in_trial")  # the reference of every ratio
    out = tempfile.mkdtemp(prefix="geosweep-train-exec-")
    runs: dict[str, list[dict]] = {a: [] for a in arms}
    loads = [_load()]
    _start_ray(os.cpu_count() or 2)  # a local Ray of its own: its CPU is counted
    try:
        for rnd in range(args.rounds):
            # alternate the order too: the first sweep of a round is not always the same arm
            order = arms if rnd % 2 == 0 else arms[::-1]
            for arm in order:
                name = f"texec-{arm.replace('_', '-')}-r{rnd}"
                r = _measure(_spec(name, arm, steps, args.trials), out)
                runs[arm].append(r)
                print(f"[round {rnd}] {arm:<9} sweep {r['sweep_s']:6.1f} s  "
                      f"fit {r['fit_s']:6.1f} s  cpu/trial {r['cpu_per_trial_s']:5.1f} s  "
                      f"overhead/trial {r['overhead_s']:5.2f} s  "
                      f"({r['completed']}/{r['trials']} completed)", flush=True)
            loads.append(_load())
    finally:
        shutdown(force=True)  # its own ray.init (_start_ray)
        shutil.rmtree(out, ignore_errors=True)
        for m in _METER:
            m.close()
    _table(runs, arms, steps, sps, args, loads)


def _table(runs: dict[str, list[dict]], arms: list[str], steps: int, sps: float,
           args: argparse.Namespace, loads: list[str]) -> None:
    def med(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[arm])

    def ratio(arm: str, key: str = "sweep_s") -> float:  # paired by round: the same load
        return statistics.median(a[key] / b[key]
                                 for a, b in zip(runs[arm], runs["in_trial"], strict=True))

    print(f"\ngpt-debug: {sps:.1f} steps/s calibrated (1 thread), {steps} steps per trial; "
          f"{args.trials} trials per sweep, 1 at a time; {args.rounds} round(s); "
          f"load averages {' | '.join(loads)}")
    print(f"{'arm':<10}{'workers':>8}{'train s':>9}{'setup s':>9}{'overhead/trial s':>18}"
          f"{'after first':>13}{'gap/trial s':>13}{'fit s':>8}{'sweep s':>9}{'x ideal':>9}"
          f"{'x in_trial':>12}{'fit x in_trial':>16}{'CPU-s/trial':>13}")
    for a in arms:
        print(f"{a:<10}{ARMS[a][1]:>8}{med(a, 'train_s'):>9.2f}{med(a, 'setup_s'):>9.2f}"
              f"{med(a, 'overhead_s'):>18.2f}{med(a, 'later_overhead_s'):>13.2f}"
              f"{med(a, 'gap_s'):>13.2f}"
              f"{med(a, 'fit_s'):>8.1f}{med(a, 'sweep_s'):>9.1f}"
              f"{med(a, 'vs_ideal'):>9.2f}{ratio(a):>12.2f}{ratio(a, 'fit_s'):>16.2f}"
              f"{med(a, 'cpu_per_trial_s'):>13.1f}")
    print("overhead/trial: a trial's wall (its start to its end, seen by the sweep's callback) "
          "minus its training time; gap/trial: (fit s - the trials' training times) / trials, "
          "what Tune spends per trial around them too; "
          "sweep s: run_sweep with Ray already up (MLflow store, Tune, records); fit s: the "
          "Tune phase alone; x ideal: sweep s / the trials' training times back to back; "
          "CPU-s/trial: CPU time of the Ray node and the driver per trial (training included)")
    out: dict[str, float] = {
        "in_trial_overhead_after_first_s": med("in_trial", "later_overhead_s")}
    out.update({f"{a}_gap_per_trial_s": med(a, "gap_s") for a in arms})
    if "train1" not in arms:  # the arms asked for, without the Ray Train one
        out.update({f"{a}_overhead_per_trial_s": med(a, "overhead_s") for a in arms})
        out.update({f"{a}_overhead_after_first_s": med(a, "later_overhead_s") for a in arms})
        print(json.dumps({k: round(v, 3) for k, v in out.items()}))
        return
    out |= {
        "train_vs_in_trial": ratio("train1"),
        "train_vs_in_trial_fit": ratio("train1", "fit_s"),
        "train_overhead_per_trial_s": med("train1", "overhead_s"),
        "in_trial_overhead_per_trial_s": med("in_trial", "overhead_s"),
        "train_vs_ideal": med("train1", "vs_ideal"),
        "in_trial_vs_ideal": med("in_trial", "vs_ideal"),
        "train_setup_s": med("train1", "setup_s"),
        "train_cpu_per_trial_s": med("train1", "cpu_per_trial_s"),
        "in_trial_cpu_per_trial_s": med("in_trial", "cpu_per_trial_s"),
        "train_cpu_overhead_per_trial_s": med("train1", "cpu_per_trial_s")
        - med("in_trial", "cpu_per_trial_s"),
    }
    out["train_overhead_after_first_s"] = med("train1", "later_overhead_s")
    if "auto_gpu" in arms:
        out["auto_gpu_overhead_per_trial_s"] = med("auto_gpu", "overhead_s")
        out["auto_gpu_overhead_after_first_s"] = med("auto_gpu", "later_overhead_s")
    if "train2" in arms:
        out["train2_overhead_after_first_s"] = med("train2", "later_overhead_s")
        out["train2_vs_in_trial"] = ratio("train2")
        out["train2_vs_in_trial_fit"] = ratio("train2", "fit_s")
        out["train2_overhead_per_trial_s"] = med("train2", "overhead_s")
        out["train2_vs_ideal"] = med("train2", "vs_ideal")
    print(json.dumps({k: round(v, 3) for k, v in out.items()}))


if __name__ == "__main__":
    main()
