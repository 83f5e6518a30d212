"""`geosweep status DIR`: the trials of a sweep folder and their status."""

from __future__ import annotations

import argparse

from orchestrator.cli.checks import sweep_dir


def cmd_status(args: argparse.Namespace) -> int:
    root = sweep_dir(args.dir)
    from orchestrator.store.manifest import read_manifest

    manifest = read_manifest(root)
    from orchestrator.store.parquet import read_trials

    trials = read_trials(manifest["parquet_root"], sweep=manifest["name"])
    print(f"sweep {manifest['name']}: {manifest['trials']} trials planned, "
          f"{len(trials)} recorded")
    if len(trials):
        counts = trials["status"].value_counts().to_dict()
        print("  " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        cols = [c for c in ("trial", "arm", "status", "final_val_loss", "divergence_reason")
                if c in trials.columns]
        print(trials[cols].to_string(index=False))
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("status", help="trials of a sweep folder")
    s.add_argument("dir")
    s.set_defaults(fn=cmd_status)
