"""``geosweep eval DIR [--trial ID]... [--corpus REF]... [--max-batches N]``: the arguments of
orchestrator/evaluation/sweep_eval.py (which does the work; its docstring says what is scored
and where it is written). Every bad input is one line, exit 2."""

from __future__ import annotations

import argparse
import os
from typing import Any

from orchestrator.cli.errors import UsageError
from orchestrator.evaluation.corpora import HUB_SETS, TEXT_COLUMNS, EvalInputError

__all__ = ["add_eval_command", "cmd_eval", "DEFAULT_MAX_BATCHES"]

DEFAULT_MAX_BATCHES = 50  # as orchestrator.evaluation.sweep_eval (not imported: --help stays fast)


def cmd_eval(args: argparse.Namespace) -> int:
    from orchestrator.cli.failures import CURRENT
    from orchestrator.evaluation.sweep_eval import run_eval

    CURRENT["writing"] = args.dir
    cache = os.environ.get("GEOSWEEP_CACHE")
    if cache:  # the trials' corpora are tokenized into it when not cached yet
        from orchestrator.cli.preflight import check_writable_dir

        check_writable_dir(cache, "GEOSWEEP_CACHE")

    try:
        run_eval(args.dir, trials=args.trial, corpora=args.corpus, max_batches=args.max_batches,
                 device=args.device, no_hub=args.no_hub,
                 printer=lambda s: print(s, flush=True))
    except EvalInputError as e:
        raise UsageError(str(e)) from None  # one line, exit code 2 (orchestrator.cli.main)
    return 0


def add_eval_command(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``eval DIR [--trial ID]... [--corpus REF]... [--max-batches N]``."""
    e = subparsers.add_parser(
        "eval", help="held-out loss/perplexity of a sweep's trials from their final checkpoints")
    e.add_argument("dir", help="the sweep folder")
    e.add_argument("--trial", action="append", metavar="ID",
                   help="evaluate only this trial (repeatable; default: every trial)")
    e.add_argument("--corpus", action="append", metavar="REF",
                   help="also score on a local .txt file, a .parquet file (text column: "
                   f"{' | '.join(TEXT_COLUMNS)}), or {' | '.join(HUB_SETS)} (needs the hub); "
                   "repeatable")
    e.add_argument("--max-batches", type=int, default=DEFAULT_MAX_BATCHES,
                   help="at most N fixed batches of the trial's batch size per corpus "
                   f"(default {DEFAULT_MAX_BATCHES})")
    e.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    e.add_argument("--no-hub", action="store_true",
                   help="do not try WikiText-2/LAMBADA unless named with --corpus")
    e.set_defaults(fn=cmd_eval)
    return e


add = add_eval_command  # the name orchestrator.cli.COMMANDS calls
