"""`geosweep status DIR`: the trials of a sweep folder, ranked by the objective, with their
status and the reason a trial ended early (cli/watch.py's table, printed once)."""

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
    from orchestrator.cli.watch import live_table, objective_of, render_table
    from orchestrator.store.parquet import read_curves, read_trials

    trials = read_trials(manifest["parquet_root"], sweep=manifest["name"])
    print(f"sweep {manifest['name']}: {manifest['trials']} trials planned, "
          f"{len(trials)} recorded")
    if len(trials):
        counts = trials["status"].value_counts().to_dict()
        print("  " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        metric, mode = objective_of(root)
        # trials still running have their latest value in curves/ only
        running = trials.loc[trials["status"] == "running", "trial"].astype(str).tolist()
        curves = (read_curves(manifest["parquet_root"], sweep=manifest["name"],
                              trials=running) if running else trials.iloc[0:0])
        print(f"  ranked by {metric} ({'lowest' if mode == 'min' else 'highest'} first; "
              "diverged and failed last)")
        print(render_table(live_table(trials, curves, metric, mode)))
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
