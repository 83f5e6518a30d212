"""``geosweep search-p [SPEC]``: the automatic optimal-p search (``orchestrator.sweep.search_p``).

``add_search_p_command(subparsers)`` registers the subcommand on geosweep's parser;
``python -m orchestrator.cli.search_p [SPEC] [options]`` runs it on its own. User errors are
``orchestrator.cli.UsageError`` (one line, exit code 2), raised before Ray starts.
``orchestrator.cli`` is imported inside the functions, so ``cli.py`` may import this module
at its top without a cycle.
"""

from __future__ import annotations

import argparse
import sys

from orchestrator.cli.checks import DEFAULT_OUT, check_address, check_out_dir, prepare_sweep_folder
from orchestrator.cli.errors import UsageError
from orchestrator.cli.sets import add_spec_set_argument

__all__ = ["add_search_p_command", "cmd_search_p", "main"]

DEFAULT_SPEC = "spheret_p_search"


def _positive(name: str, low: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{name} must be >= {low}, got {v}")
        return v

    return parse


def add_search_p_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:

    sp = subparsers.add_parser(
        "search-p", help="find the best p: Optuna + ASHA search, then top-k x seeds confirmation")
    sp.add_argument("spec", nargs="?", default=DEFAULT_SPEC,
                    help=f"a shipped spec name or a YAML path (default: {DEFAULT_SPEC})")
    sp.add_argument("--out", default=DEFAULT_OUT, help="parent folder of the sweep folder")
    sp.add_argument("--address", default=None, help="Ray cluster address (default: local Ray)")
    sp.add_argument("--top-k", type=_positive("--top-k", 1), default=3,
                    help="configurations to confirm (default 3)")
    sp.add_argument("--confirm-seeds", type=_positive("--confirm-seeds", 2), default=3,
                    help="seeds per confirmed configuration (default 3)")
    sp.add_argument("--sampler", choices=("tpe", "gp"), default=None,
                    help="Optuna sampler (default: the spec's, else tpe)")
    sp.add_argument("--dry-run", action="store_true",
                    help="print both stages' trials, steps and a wall-time estimate (a "
                         "15-step training run measured here); start nothing")
    sp.add_argument("--resume", action="store_true", help="continue an interrupted search")
    sp.add_argument("--overwrite", action="store_true", help="delete an existing sweep folder")
    add_spec_set_argument(sp)
    sp.set_defaults(fn=cmd_search_p)
    return sp


def cmd_search_p(args: argparse.Namespace) -> int:
    from orchestrator.spec.sets import load_spec_with_sets
    from orchestrator.spec.sweep_spec import SpecError
    from orchestrator.store.layout import sweep_paths
    from orchestrator.sweep.search_p import SearchPError, search_p, stage1_spec

    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite are mutually exclusive")
    try:
        spec = stage1_spec(load_spec_with_sets(args.spec, args.set), args.sampler)
    except (SpecError, SearchPError) as e:
        raise UsageError(str(e)) from None
    if args.dry_run:
        return _dry_run(spec, args.top_k, args.confirm_seeds)
    out = check_out_dir(args.out)
    root = sweep_paths(spec, out).root
    if args.resume and (root / "sweep.json").is_file():
        from orchestrator.cli.resume_checks import folder_targets

        folder_targets(root)  # where a resumed search writes: inside its folder
    from orchestrator.cli.preflight import check_tracking

    check_tracking(spec, root)  # the spec's own stores and folders before the Ray address
    check_address(args.address)
    prepare_sweep_folder(root, resume=args.resume, overwrite=args.overwrite)
    try:
        res = search_p(spec, out, address=args.address, top_k=args.top_k,
                       confirm_seeds=args.confirm_seeds, sampler=args.sampler,
                       resume=args.resume, printer=lambda s: print(s, flush=True))
    except SearchPError as e:
        raise UsageError(str(e)) from None
    print(f"[search-p] report: {res.files['markdown']}")
    print(f"[search-p] study:   optuna-dashboard sqlite:///{res.files['optuna_db']}")
    return 0 if res.best is not None else 1


def _dry_run(s1, top_k: int, confirm_seeds: int) -> int:
    """What search-p would run, and for how long, without Ray or a folder."""
    from orchestrator.cli.estimate import (
        estimate_lines,
        human,
        measure_costs,
        trial_threads,
        wall_estimate,
    )
    from orchestrator.sweep.search_p import SearchPError, confirm_specs

    n1 = s1.search.num_samples
    print(f"search-p {s1.name}: stage 1, {n1} trials by {s1.search.algorithm} over "
          f"{', '.join(s1.space)}, scheduler {s1.scheduler.type}")
    costs = measure_costs(s1.base_config(), trial_threads(s1))
    lines = estimate_lines(s1, n1, costs)
    for line in lines:
        print(f"  {line}")
    try:  # the confirmation sweeps: the top k configurations and p = inf, full budget
        cs = confirm_specs(s1, [{}], confirm_seeds)[0]
    except SearchPError as e:
        raise UsageError(str(e)) from None
    n_conf = top_k + 1
    steps = cs.base_config().train.steps
    print(f"search-p {s1.name}: stage 2, up to {n_conf} configurations (the top {top_k} "
          f"distinct p at their best lr, and p = inf when stage 1 tried it) x {confirm_seeds} "
          f"seeds = up to {n_conf * confirm_seeds} trials of {steps} steps (no ASHA), one "
          "sweep each")
    w1, _ = wall_estimate(s1, n1, costs)
    w2, _ = wall_estimate(cs, confirm_seeds, costs)
    print(f"  estimated wall time: ~{human(n_conf * w2)} ({n_conf} x ~{human(w2)})")
    print(f"estimated total: ~{human(w1 + n_conf * w2)}; nothing was started or written")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrator.cli.search_p ...``: ``geosweep search-p ...`` (the same one
    redacted error line)."""
    from orchestrator.cli import main as geosweep_main

    return geosweep_main(["search-p", *(sys.argv[1:] if argv is None else argv)])


add = add_search_p_command  # the name orchestrator.cli.COMMANDS calls

if __name__ == "__main__":
    sys.exit(main())
