"""Does ``geosweep report`` stay fast on a big search? (issue 14 section 2, target <= 10 s)

Builds a synthetic sweep in the real layout (orchestrator/store/parquet.py: hive-partitioned
``curves/`` part files in CURVE_SCHEMA, one ``trials/`` file per trial written by
``ParquetSink.write_trial``, a ``sweep.json``) and times ``geosweep report`` on it as a user
runs it (a fresh ``python -m orchestrator.cli report`` process, imports included).

Default: 1,000 trials of a (family, p, lr) search with one seed each, 10,000 steps: a train
loss and grad norm every step, a val loss every 100 steps; 70% completed, 15% stopped early by
ASHA (at 2,500 or 5,000 steps), 15% diverged (between 5% and 90% of the budget). ``--trials`` and
``--steps`` make it smaller. No MLflow store (the report says it did not log), no metric rows.

Prints a table (with the report's stage timings: wall and CPU seconds each, written by the
report command to the file named by ``GEOSWEEP_REPORT_TIMINGS``; and the report process's
CPU time, steadier than its wall time on a loaded machine), then as the last line one JSON
object with ``report_s``, ``report_cpu_s``, ``trials`` and ``stages``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.analysis.fast_spikes import recorded_spikes  # noqa: E402
from orchestrator.store.parquet import CURVE_SCHEMA, ParquetSink  # noqa: E402

SWEEP = "scale"


def _trial(i: int, steps: int, rng: np.random.Generator) -> tuple[dict, pa.Table]:
    family = "spheret" if i % 4 else "pre_ln"
    params = {"model.residual.family": family, "optim.lr": float(10 ** rng.uniform(-4, -2)),
              "train.seed": 0}
    if family == "spheret":
        params["model.residual.p"] = math.inf if i % 10 == 1 else float(2 ** rng.uniform(-1, 5))
    u = rng.uniform()
    status, last = "completed", steps
    if u < 0.15:
        status, last = "diverged", int(rng.integers(steps // 20, int(0.9 * steps)))
    elif u < 0.30:
        status, last = "stopped", steps // 4 if u < 0.22 else steps // 2
    s = np.arange(1, last + 1, dtype=np.int64)
    floor = 1.5 + abs(math.log10(params["optim.lr"]) + 3) * 0.3
    train = floor + 3.0 * np.exp(-s / (0.1 * steps)) + rng.normal(0, 0.05, last)
    if status == "diverged":
        train[-20:] = np.linspace(train[-21], 40.0, 20)
    gnorm = np.abs(rng.normal(1.0, 0.2, last))
    vs = s[s % 100 == 0]
    val = floor + 0.05 + 3.0 * np.exp(-vs / (0.1 * steps))
    wall = s * 0.01
    table = pa.table({
        "step": np.concatenate([s, s, vs]),
        "split": pa.array(["train"] * (2 * last) + ["val"] * len(vs)),
        "metric": pa.array(["loss"] * last + ["grad_norm"] * last + ["loss"] * len(vs)),
        "value": np.concatenate([train, gnorm, val]),
        "wall_time": np.concatenate([wall, wall, vs * 0.01]),
    }, schema=CURVE_SCHEMA)
    final_val = float(val[-1]) if len(val) else None
    rec = {"trial": f"t{i:05d}", "sweep": SWEEP, "status": status, "last_step": last,
           "arm": ",".join(f"{k}={v}" for k, v in params.items() if k != "train.seed"),
           "seed": 0, "params": params,
           "objective": 10.8 if status == "diverged" else final_val,
           "final_train_loss": float(train[-100:].mean()),
           "final_val_loss": final_val, "best_val_loss": float(val.min()) if len(val) else None,
           "scalars": {"val/loss": final_val, "train/loss": float(train[-100:].mean())}}
    if status == "diverged":
        rec.update(divergence_reason="loss_vs_best", divergence_step=last,
                   divergence_detail="loss 40 > 4 x best")
    return rec, table


def build(root: Path, trials: int, steps: int, seed: int = 0) -> int:
    """Write the synthetic sweep under ``root``; returns the number of curve rows."""
    rng = np.random.default_rng(seed)
    proot = root / "parquet"
    sink = ParquetSink(str(proot), SWEEP)
    rows = 0
    for i in range(trials):
        rec, table = _trial(i, steps, rng)
        folder = proot / "curves" / f"sweep={SWEEP}" / f"trial={rec['trial']}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, folder / f"part-{1:08d}-{rec['last_step']:08d}.parquet")
        # as the sweep's callback does when a trial ends: its spike count from its curve
        rec["spikes"], rec["spikes_rule"] = recorded_spikes(sink.train_losses(rec["trial"]))
        sink.write_trial(rec)
        rows += table.num_rows
    (root / "sweep.json").write_text(json.dumps({
        "name": SWEEP, "trials": trials, "mlflow_uri": None, "parquet_root": str(proot)}))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--dir", default=None, help="build here (default: a temporary folder)")
    ap.add_argument("--reuse", action="store_true",
                    help="with --dir: report on the sweep built there before (same sizes)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.dir or tmp) / SWEEP
        root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        if args.reuse and (root / "sweep.json").exists():
            import pyarrow.dataset as ds

            rows = ds.dataset(root / "parquet" / "curves", format="parquet").count_rows()
        else:
            rows = build(root, args.trials, args.steps)
        build_s = time.perf_counter() - t0
        report_s, cpu_s, stages = _run_report(root)
        figures = sorted(p.name for p in (root / "report").glob("*.png"))
    print(f"{'trials':>8} {'steps':>7} {'curve rows':>11} {'build s':>8} {'report s':>9}"
          f" {'report cpu s':>13} {'target s':>9}")
    print(f"{args.trials:>8} {args.steps:>7} {rows:>11,} {build_s:>8.1f} {report_s:>9.2f}"
          f" {cpu_s:>13.2f} {10:>9}")
    _print_stages(stages, report_s)
    print("figures:", ", ".join(figures))
    print(json.dumps({"trials": args.trials, "steps": args.steps, "curve_rows": rows,
                      "build_s": round(build_s, 2), "report_s": round(report_s, 2),
                      "report_cpu_s": round(cpu_s, 2), "target_s": 10, "figures": figures,
                      "stages": stages}))


def _run_report(root: Path) -> tuple[float, float, dict]:
    """Wall seconds, CPU seconds (user + system, the report process and its children) and
    stage timings of one ``geosweep report`` run as a user runs it (a fresh process). CPU
    time is given because this machine is shared: its wall time depends on the load."""
    import resource

    timings = root / "report_timings.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), GEOSWEEP_REPORT_TIMINGS=str(timings))
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "report", str(root)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    report_s = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"geosweep report failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    stages = json.loads(timings.read_text()) if timings.exists() else {}
    return report_s, cpu_s, stages


def _print_stages(stages: dict, report_s: float) -> None:
    """The report's stages, slowest first, and what is left: interpreter start, the CLI's
    own imports and writing files outside any stage."""
    if not stages:
        return
    print(f"{'stage':<34} {'wall s':>8} {'cpu s':>8}")
    for name, t in sorted(stages.items(), key=lambda kv: -kv[1]["wall_s"]):
        print(f"{name:<34} {t['wall_s']:>8.2f} {t['cpu_s']:>8.2f}")
    rest = report_s - sum(t["wall_s"] for t in stages.values())
    print(f"{'(interpreter start, CLI imports)':<34} {rest:>8.2f} {'':>8}")

if __name__ == "__main__":
    main()
