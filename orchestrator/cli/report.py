"""`geosweep report DIR`: per-arm tables and figures from the Parquet dataset.

Says where it writes first, a line per stage while it works (and at least every 10 s), and at
the end where the report is and what it holds; report.md itself is not printed. The folder
report/ is replaced whole once every output exists (store/staging.py)."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from orchestrator.cli.checks import sweep_dir
from orchestrator.cli.errors import UsageError


def cmd_report(args: argparse.Namespace) -> int:
    root = sweep_dir(args.dir)
    from orchestrator.cli.failures import CURRENT
    from orchestrator.store.manifest import sweep_targets
    from orchestrator.store.targets import FolderError

    try:  # every place report writes, inside the folder (report/, the store's artifacts)
        sweep_targets(root)
    except FolderError as e:
        raise UsageError(str(e)) from None

    CURRENT["writing"] = root / "report"
    from orchestrator.analysis import timing
    from orchestrator.cli.heartbeat import Heartbeat

    timings = os.environ.get(timing.ENV)  # benchmarks/report_scale.py: stage timings
    if timings:
        timing.start()
    t0 = time.monotonic()
    hb = Heartbeat("geosweep", phase="importing the analysis libraries")

    def progress(stage: str) -> None:  # a line per report stage (analysis/timing.py)
        hb.phase = f"report: {stage}"
        hb.say(f"[geosweep] report: {stage} ({time.monotonic() - t0:.0f}s)")

    with hb:
        hb.say(f"[geosweep] report of {root}: tables and figures into {root / 'report'}")
        with timing.stage("imports"):
            from orchestrator.analysis.report import ReportError, write_report

        timing.listen(progress)
        try:
            out = write_report(root, baseline=args.baseline, metric=args.metric)
        except ReportError as e:
            raise UsageError(str(e)) from None
        finally:
            timing.listen(None)
    if timings:
        Path(timings).write_text(json.dumps(timing.recorded()))
    _done(out, time.monotonic() - t0)
    return 0


def _done(md: Path, took: float) -> None:
    """Where the report is, what it holds and what MLflow said (its last section)."""
    folder = md.parent
    figs = sorted(p.name for p in folder.glob("*.png"))
    csvs = sorted(p.name for p in folder.glob("*.csv"))
    text = md.read_text()
    print(f"[geosweep] report written in {took:.0f}s: {md}")
    print(f"[geosweep]   {len(figs)} figures ({', '.join(figs) or 'none'})")
    print(f"[geosweep]   tables: {', '.join(csvs) or 'none'}")
    mlflow = text.rsplit("## MLflow", 1)[1].strip().lstrip("- ") if "## MLflow" in text else ""
    if mlflow:
        print(f"[geosweep]   MLflow: {mlflow}")


def add(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser("report", help="tables and figures from a sweep's Parquet dataset")
    rp.add_argument("dir", help="the sweep folder (<out>/<name>, holds sweep.json)")
    rp.add_argument("--baseline", default=None, help="arm label to compare against")
    rp.add_argument("--metric", default="final_val_loss",
                    help="per-trial value the arm table compares: a trial column "
                    "(final_val_loss, best_val_loss, val/loss) or eval/<corpus>/<metric> "
                    "from `geosweep eval`")
    rp.set_defaults(fn=cmd_report)
