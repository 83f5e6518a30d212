"""`geosweep run SPEC`: validate, refuse what would fail, then run the sweep on Ray."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from orchestrator.cli.checks import (
    DEFAULT_OUT,
    check_address,
    check_out_dir,
    check_spec_corpora,
    load_cli_spec,
    prepare_sweep_folder,
)
from orchestrator.cli.errors import UsageError
from orchestrator.cli.preflight import check_local_resources, check_tracking
from orchestrator.cli.resume_checks import (
    check_resume_checkpoints,
    folder_targets,
    home_artifacts,
)
from orchestrator.cli.sets import add_spec_set_argument


def cmd_run(args: argparse.Namespace) -> int:
    spec = load_cli_spec(args.spec, args)
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite are mutually exclusive")
    check_spec_corpora(spec)
    if args.dry_run:
        return _dry_run(spec)
    out = check_out_dir(args.out)
    root = out / spec.name
    resuming = args.resume and (root / "sweep.json").is_file()
    targets = folder_targets(root) if resuming else None  # where a resume writes: inside
    check_tracking(spec, root)  # the spec's own fields (stores, folders) before the address
    check_address(args.address)
    check_local_resources(spec, args.address)
    prepare_sweep_folder(root, resume=args.resume, overwrite=args.overwrite)
    if targets is not None:
        check_resume_checkpoints(targets)
        home_artifacts(targets, spec)
    auto = spec.seed_budget is not None  # seeds: auto: race until decided, on this Ray
    rc = execute(spec, out, args.address, resume=args.resume, keep_ray=auto)
    if rc == 0 and auto:
        from orchestrator.cli.decided import run_until_decided

        return run_until_decided(out / spec.name, spec, args.address, execute)
    return rc


def execute(spec, out: Path, address: str | None, resume: bool, extend=None,
            keep_ray: bool = False) -> int:
    """One sweep (or resume/extension) on Ray; ``keep_ray``: a round of seeds until decided
    follows, on the same Ray (its last round, or the process's exit, shuts it down)."""
    from cluster.local import RayStartError, shutdown, started_here
    from orchestrator.cli.failures import CURRENT, INTERRUPTED
    from orchestrator.cli.heartbeat import Heartbeat
    from orchestrator.spec.sweep_spec import SpecError
    from orchestrator.store.lock import lock_sweep
    from orchestrator.sweep.interrupt import SweepInterrupted
    from orchestrator.sweep.tuner import run_sweep

    root = out / spec.name
    lock_sweep(root)  # a no-op when prepare_sweep_folder took it
    CURRENT["sweep"] = root
    hb = Heartbeat("geosweep", phase="starting Ray and the first trials", every=10.0)
    hb.say(f"[geosweep] sweep {spec.name!r}: results in {root}")

    def printer(line: str) -> None:
        hb.say(line)
        if line.endswith("..."):  # a phase after the trials: the heartbeat repeats it
            hb.phase = line.removeprefix("[geosweep] ").rstrip(".")

    try:
        with hb:
            result = run_sweep(spec, out, address=address, resume=resume, printer=printer,
                               extend=extend)
            if started_here() and not keep_ray:  # a warm Ray or a cluster stays as it is
                printer("[geosweep] closing Ray...")
                shutdown()  # here, under the heartbeat, not silently at interpreter exit
    except RayStartError as e:
        print(f"geosweep: error: {e}", file=sys.stderr)
        return 1
    except SpecError as e:  # an extension that does not apply (checked before Ray starts)
        raise UsageError(str(e)) from None
    except KeyboardInterrupt:  # a second Ctrl-C; the parent run is KILLED already
        raise SweepInterrupted(root) from None
    except SystemExit as e:
        # SIGTERM before the trials start: ray.init's own handler turns it into
        # sys.exit(15) (the sweep's handler takes over at Tune's fit). Same ending as a
        # SIGTERM during the trials; a sweep folder the failed start removed needs a new run.
        if e.code != signal.SIGTERM:
            raise
        from orchestrator.store.lock import LOCK_FILE

        if root.is_dir() and any(p.name != LOCK_FILE for p in root.iterdir()):
            raise SweepInterrupted(root) from None
        print("geosweep: error: terminated (SIGTERM) while starting; nothing was written",
              file=sys.stderr)
        return INTERRUPTED
    c = result.counts
    summary = ", ".join(f"{v} {k}" for k, v in sorted(c.items())) or "no trials"
    if result.interrupted:
        print(f"[geosweep] interrupted after {result.wall_s:.0f}s: {summary}")
        raise SweepInterrupted(root)
    lost = result.lost  # crash orphans of a resumed sweep: re-run, kept as failed records
    failed = c.get("failed", 0) - lost
    if failed and failed == sum(c.values()) - lost:
        print(f"geosweep: error: every trial failed ({summary}); see geosweep status {root}",
              file=sys.stderr)
        return 1
    print(f"[geosweep] finished in {result.wall_s:.0f}s: {summary}")
    if result.best:
        from orchestrator.store.run_names import run_name

        b = result.best  # named as in MLflow, status and the report (store/run_names.py)
        print(f"[geosweep] best trial {run_name(b.get('params') or {})} (trial {b['trial']}): "
              f"{spec.search.metric} = {b['final_val_loss']:.4f}")
    p = result.paths
    print(f"[geosweep] Parquet dataset: {p.parquet_root}")
    print(f"[geosweep] MLflow store:    {p.mlflow_uri}")
    print(f"[geosweep] browse:          geosweep ui {p.root}")
    print(f"[geosweep] tables:          geosweep report {p.root}")
    if lost:
        print(f"[geosweep] {lost} failed record(s) are trials the earlier driver crash lost; "
              "their slots ran again")
    if failed:
        print(f"geosweep: error: {failed} of {sum(c.values())} trials failed; see geosweep "
              f"status {root}", file=sys.stderr)
        return 1
    return 0


def _dry_run(spec) -> int:
    from orchestrator.sweep.space import count_trials, grid_trials
    from orchestrator.sweep.trial import resolve_executor, trial_resources

    n = count_trials(spec)
    ex = resolve_executor(spec.resources)
    r = spec.resources
    print(f"sweep {spec.name}: {n} trials, search={spec.search.algorithm}, "
          f"scheduler={spec.scheduler.type}, max_concurrent={spec.search.max_concurrent}")
    print(f"executor={ex}, workers/trial={r.workers_per_trial}, cpus/worker={r.cpus_per_worker}, "
          f"gpus/worker={r.gpus_per_worker}, trial resources={trial_resources(r)}")
    if spec.search.algorithm == "grid":
        for i, flat in enumerate(grid_trials(spec)):
            print(f"  [{i:3d}] " + " ".join(f"{k}={v}" for k, v in flat.items()))
    else:
        print(f"  {n} samples drawn by {spec.search.algorithm} over: {', '.join(spec.space)}")
    from orchestrator.cli.estimate import estimate_lines

    for line in estimate_lines(spec, n):
        print(line)
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("run", help="run a sweep spec (a shipped name or a YAML path)")
    r.add_argument("spec", help="a shipped spec name (geosweep list specs) or a YAML path")
    r.add_argument("--out", default=DEFAULT_OUT, help="parent folder of the sweep folder")
    r.add_argument("--address", default=None, help="Ray cluster address (default: local Ray)")
    r.add_argument("--dry-run", action="store_true",
                   help="print trials, resources, total steps and a wall-time estimate "
                        "(a 15-step training run measured here); start nothing")
    r.add_argument("--resume", action="store_true", help="continue an existing sweep folder")
    r.add_argument("--overwrite", action="store_true", help="delete an existing sweep folder")
    r.add_argument("--mlflow-uri", default=None, help="MLflow tracking URI (default: sqlite)")
    r.add_argument("--parquet-root", default=None, help="Parquet root (path or fs URI)")
    add_spec_set_argument(r)
    r.set_defaults(fn=cmd_run)
