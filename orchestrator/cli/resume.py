"""`geosweep resume DIR [--more-seeds N | --num-samples N]`: finish or extend a sweep."""

from __future__ import annotations

import argparse

from orchestrator.cli.checks import check_address, load_cli_spec, sweep_dir
from orchestrator.cli.errors import UsageError
from orchestrator.cli.run import execute


def cmd_resume(args: argparse.Namespace) -> int:
    from orchestrator.sweep.experiments import Extension

    for flag in ("more_seeds", "num_samples"):
        n = getattr(args, flag)
        if n is not None and n < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1, got {n}")
    if args.more_seeds and args.num_samples:
        raise UsageError("--more-seeds and --num-samples: give one of them per resume")
    root = sweep_dir(args.dir)
    spec = load_cli_spec(str(root / "spec.yaml"))
    check_address(args.address)
    ext = Extension(more_seeds=args.more_seeds or 0, num_samples=args.num_samples or 0)
    return execute(spec, root.parent, args.address, resume=True, extend=ext or None)


def add(sub: argparse._SubParsersAction) -> None:
    rs = sub.add_parser("resume", help="finish an interrupted sweep, or extend a finished one")
    rs.add_argument("dir", help="the sweep folder (<out>/<name>, holds sweep.json)")
    rs.add_argument("--address", default=None,
                    help="Ray cluster address (default: local Ray)")
    rs.add_argument("--more-seeds", type=int, default=None, metavar="N",
                    help="add N seeds: every grid arm (or completed search trial) again")
    rs.add_argument("--num-samples", type=int, default=None, metavar="N",
                    help="add N trials to a random/Optuna search (the study continues)")
    rs.set_defaults(fn=cmd_resume)
