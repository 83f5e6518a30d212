"""`geosweep status DIR`: the trials of a sweep folder and their status."""

from __future__ import annotations

import argparse

from orchestrator.cli.checks import sweep_dir


def cmd_status(args: argparse.Namespace) -> int:
    root = sweep_dir(args.dir)
    from orchestrator.store.manifest import read_manifest

    manifest = read_manifest(root)
    if args.watch is not None:
        import sys

        from orchestrator.cli.watch import watch

        return watch(root, manifest, args.watch, printer=lambda s: print(s, flush=True),
                     clear=sys.stdout.isatty())
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


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text!r}")
    return v


def add(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("status", help="trials of a sweep folder")
    s.add_argument("dir", help="the sweep folder (<out>/<name>, holds sweep.json)")
    s.add_argument("--watch", type=_seconds, default=None, metavar="SECONDS",
                   help="refresh a live table ranked by the objective (step reached, time) "
                        "every SECONDS until the sweep ends or Ctrl-C")
    s.set_defaults(fn=cmd_status)
