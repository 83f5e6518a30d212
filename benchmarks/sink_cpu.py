"""What the sweep driver's result sink costs per trial, in-process, split by writer.

The sink (orchestrator/sweep/callback.py ``SinkCallback``) is fed what a trial of
``sweep_vs_peers.py`` sends it: a start, two results carrying the per-step curve (train loss,
grad norm, lr per step, val loss at each report; packed as worker.py packs it, before the
timing starts) with a checkpoint-free payload as worker.py builds it, a final result and the
end. The curve sizes are the benchmark's 1 s and 5 s trials (141 and 705 steps on gpt-debug).
CPU time of this process per trial (all threads; the first trial untimed) with the sink as a
sweep runs it (``background``: its writer thread, a running trial's record refreshed at most
every 2 s), and from a second, foreground pass (every write on this thread, every refresh
written), cProfile's cumulative share of the three writers: Parquet parts, Parquet trial
records, MLflow (points, params, tags, the run).
Not a timed test: these machines are noisy, and the figure to read beside it is
``sweep_vs_peers.py``'s driver CPU per trial, where raw Ray Tune's stands next to ours.

    python benchmarks/sink_cpu.py [--trials 20]

Then MLflow's points alone as one sweep's store grows (blocks of 16 trials of 705 steps).
Prints a table; the last line is one JSON object: ``sink_cpu_ms_per_trial_<steps>``, the
writers' shares ``<writer>_share_<steps>`` and ``mlflow_points_ms_per_trial_by_16``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.sweep.curve_codec import pack_curve  # noqa: E402 - after the path

SIZES = (141, 705)  # steps of sweep_vs_peers' 1 s and 5 s trials on gpt-debug
# writer -> the function whose cumulative time is its share
WRITERS = {"parquet_parts": "write_curve", "parquet_records": "write_trial",
           "mlflow": "log_results"}


def _payload(a: int, b: int, status: str = "running") -> dict:
    curve = [{"step": s, "split": "train", "metric": m, "value": v, "wall_time": 0.01 * s}
             for s in range(a, b + 1)
             for m, v in (("loss", 4.0 - 1e-3 * s), ("grad_norm", 1.3), ("lr", 1e-3))]
    curve.append({"step": b, "split": "val", "metric": "loss", "value": 3.0,
                  "wall_time": 0.01 * b})
    out = {"train/loss": 3.9, "val/loss": 3.0, "val/best_loss": 3.0, "train/lr": 1e-3,
           "train/grad_norm": 1.2, "train/tokens_per_s": 1e4, "train/time_s": 1.0,
           "train/initial_loss": 4.4, "step": b, "objective": 3.0}
    out.update(_curve=pack_curve(curve), _rows=[], _status=status, _divergence=None, _node="n",
               _timing={"setup_s": 1.0, "wall_s": 2.0, "train_s": 1.0,
                        "report_block_ms": [1.0] * 5, "checkpoint_report_ms": []},
               _trial_params={"optim.lr": 1e-3, "train.seed": 0}, _arm="a", _seed=0)
    return out


def measure(steps: int, trials: int, background: bool) -> dict:
    from mlflow import MlflowClient

    from orchestrator.store.mlflow import MlflowSink, default_tracking
    from orchestrator.store.parquet import ParquetSink
    from orchestrator.sweep.callback import SinkCallback

    tmp = tempfile.mkdtemp(prefix="geosweep-sink-")
    try:
        os.makedirs(f"{tmp}/sw")
        MlflowClient(f"sqlite:///{tmp}/sw/mlflow.db").search_experiments()
        uri, _ = default_tracking(f"{tmp}/sw")
        ml = MlflowSink(uri, "geosweep", "sw")
        ml.start_parent("name: sw\n", {"sweep": "sw"}, {"git": {"sha": "x"}})
        cb = SinkCallback(parquet=ParquetSink(f"{tmp}/sw/parquet", "sw"), mlflow=ml,
                          metric="val/loss", background=background)

        half = steps // 2
        # what the trials send, built (and packed) before the clock starts: the workers' work
        payloads = [(_payload(1, half), _payload(half + 1, steps),
                     _payload(steps + 1, steps + 1, "completed")) for _ in range(trials + 1)]

        def one(i: int) -> None:
            t = SimpleNamespace(trial_id=f"t{i:05d}",
                                config={"optim.lr": 1e-3 * (1 + i), "train.seed": 0})
            cb.on_trial_start(0, [], t)
            for result in payloads[i]:
                cb.on_trial_result(0, [], t, result)
            cb.on_trial_complete(0, [], t)

        one(0)
        cb.flush()
        prof = cProfile.Profile()
        c0 = time.process_time()
        prof.enable()
        for i in range(1, trials + 1):
            one(i)
        cb.flush()
        prof.disable()
        cpu = time.process_time() - c0
        stats = pstats.Stats(prof).stats
        total = sum(tt for _, _, tt, _, _ in stats.values())
        shares = {}
        for writer, fn in WRITERS.items():
            cum = sum(ct for (_, _, name), (_, _, _, ct, _) in stats.items() if name == fn)
            shares[writer] = cum / total if total else float("nan")
        ml.close()
        return {"ms_per_trial": 1e3 * cpu / trials, **shares}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def store_growth(steps: int = 705, blocks: int = 4, per_block: int = 16) -> list[float]:
    """CPU-ms per trial of MLflow's points alone (``SqliteMetrics.write``: a trial's curve in
    three results, as the sink writes it) for each block of ``per_block`` trials as one sweep's
    store grows (the three indexes MLflow keeps on ``metrics``; with wall-clock timestamps a
    point's cost stays flat, measured 2026-12-08)."""
    from mlflow import MlflowClient

    from orchestrator.store.mlflow_metrics import SqliteMetrics
    from orchestrator.store.sqlite_durability import forget, register

    tmp = tempfile.mkdtemp(prefix="geosweep-growth-")
    db = f"{tmp}/mlflow.db"
    try:
        client = MlflowClient(f"sqlite:///{db}")
        register(db)
        exp = client.create_experiment("growth")
        sink = SqliteMetrics.open(db)
        third = steps // 3
        keys = ("train/loss", "train/grad_norm", "train/lr")
        out = []
        for b in range(blocks):
            runs = [sink.create_run(exp, f"t{b}-{i}", {})[0] for i in range(per_block)]
            c0 = time.process_time()
            for i, run in enumerate(runs):
                # timestamps as a sweep's (ms; 2 concurrent 5 s trials: each starts 2.5 s
                # after the one before and overlaps only it). MLflow's primary key starts
                # (key, timestamp): with every trial's timestamps the same (as this had them
                # until 2026-12-08), each new curve went in the middle of all the old ones and
                # a point's cost grew with the store; as a sweep writes them it does not
                t0 = 1_800_000_000_000 + 2500 * (b * per_block + i)
                for h in range(3):
                    sink.write(run, [(k, 4.0 - 1e-3 * s, t0 + 7 * s, s) for s in
                                     range(h * third, (h + 1) * third) for k in keys])
            out.append(1e3 * (time.process_time() - c0) / per_block)
        sink.close()
        forget(db)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args()
    growth = store_growth()
    rows = {}
    for steps in SIZES:
        rows[steps] = measure(steps, args.trials, background=False)  # the shares
        rows[steps]["ms_per_trial"] = measure(steps, args.trials, True)["ms_per_trial"]
    load = os.getloadavg()
    print(f"sink CPU per trial, in-process, {args.trials} trials each; load {load[0]:.1f}")
    print(f"{'steps':>6}{'CPU ms':>9}" + "".join(f"{w:>17}" for w in WRITERS))
    for steps, r in rows.items():
        print(f"{steps:>6}{r['ms_per_trial']:>9.1f}"
              + "".join(f"{r[w]:>17.0%}" for w in WRITERS))
    print("(CPU: all threads, the sink in background as a sweep runs it; shares: cProfile's "
          "cumulative time of each writer, foreground, every record refresh written)")
    print("MLflow's points alone (705 steps, 3 points a step) as one store grows, CPU ms per "
          "trial by block of 16 trials: " + ", ".join(f"{g:.1f}" for g in growth))
    js = {"load_avg": round(load[0], 2),
          "mlflow_points_ms_per_trial_by_16": [round(g, 2) for g in growth]}
    for steps, r in rows.items():
        js[f"sink_cpu_ms_per_trial_{steps}"] = round(r["ms_per_trial"], 2)
        js.update({f"{w}_share_{steps}": round(r[w], 3) for w in WRITERS})
    print(json.dumps(js))


if __name__ == "__main__":
    main()
