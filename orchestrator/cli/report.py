"""`geosweep report DIR`: per-arm tables and figures from the Parquet dataset."""

from __future__ import annotations

import argparse
import json
import os
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

    timings = os.environ.get(timing.ENV)  # benchmarks/report_scale.py: stage timings
    if timings:
        timing.start()
    with timing.stage("imports"):
        from orchestrator.analysis.report import ReportError, write_report

    try:
        out = write_report(root, baseline=args.baseline, metric=args.metric)
    except ReportError as e:
        raise UsageError(str(e)) from None
    if timings:
        Path(timings).write_text(json.dumps(timing.recorded()))
    print(out.read_text() if out.suffix == ".md" else out)
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser("report", help="tables and figures from a sweep's Parquet dataset")
    rp.add_argument("dir", help="the sweep folder (<out>/<name>, holds sweep.json)")
    rp.add_argument("--baseline", default=None, help="arm label to compare against")
    rp.add_argument("--metric", default="final_val_loss",
                    help="per-trial value the arm table compares: a trial column "
                    "(final_val_loss, best_val_loss, val/loss) or eval/<corpus>/<metric> "
                    "from `geosweep eval`")
    rp.set_defaults(fn=cmd_report)
