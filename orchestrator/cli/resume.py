"""`geosweep resume DIR [--more-seeds N | --num-samples N | --until-decided]`: finish or
extend a sweep."""

from __future__ import annotations

import argparse

from orchestrator.cli.checks import check_address, load_cli_spec, sweep_dir
from orchestrator.cli.decided import run_until_decided
from orchestrator.cli.errors import UsageError
from orchestrator.cli.run import execute


def cmd_resume(args: argparse.Namespace) -> int:
    from orchestrator.sweep.experiments import Extension

    for flag in ("more_seeds", "num_samples"):
        n = getattr(args, flag)
        if n is not None and n < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1, got {n}")
    if sum(map(bool, (args.more_seeds, args.num_samples, args.until_decided))) > 1:
        raise UsageError("--more-seeds, --num-samples and --until-decided: give one of them "
                         "per resume")
    from orchestrator.cli.preflight import check_local_resources, check_tracking
    from orchestrator.cli.resume_checks import (
        check_resume_checkpoints,
        folder_targets,
        home_artifacts,
        spec_with_folder_tracking,
    )
    from orchestrator.store.lock import lock_sweep

    for flag, cap in (("more_seeds", 10_000), ("num_samples", 100_000)):
        n = getattr(args, flag)
        if n is not None and n > cap:
            raise UsageError(f"--{flag.replace('_', '-')} must be <= {cap}, got {n}")
    root = sweep_dir(args.dir)
    targets = folder_targets(root)  # every place it writes, inside the folder (store/targets)
    manifest = targets.manifest
    if not (root / "spec.yaml").is_file():
        raise UsageError(f"{root}: no spec.yaml; this sweep folder is incomplete")
    spec = load_cli_spec(str(root / "spec.yaml"))
    # the folder decides where results go: a spec of another name would write a sibling folder
    if spec.name != root.name or manifest["name"] != root.name:
        raise UsageError(f"{root}: its sweep is named {spec.name!r} but the folder is "
                         f"{root.name!r}; rename the folder back to {spec.name!r} to resume it")
    spec = spec_with_folder_tracking(spec, targets)  # sweep.json's places, not cwd-relative
    check_tracking(spec, root)  # the spec's own fields before the Ray address
    check_address(args.address)
    check_local_resources(spec, args.address)
    lock_sweep(root)
    check_resume_checkpoints(targets)
    home_artifacts(targets, spec)
    if args.until_decided:
        return run_until_decided(root, spec, args.address, execute)
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
    rs.add_argument("--until-decided", action="store_true",
                    help="add seeds to the arms whose comparison with the baseline is still "
                         "undecided, until decided or the seed budget (seeds: auto) is spent")
    rs.set_defaults(fn=cmd_resume)
