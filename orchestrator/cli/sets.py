"""The ``--set KEY=VALUE`` option of ``run`` and ``search-p``
(grammar: orchestrator/spec/sets.py)."""

from __future__ import annotations

import argparse

__all__ = ["SPEC_SET_HELP", "add_spec_set_argument"]

SPEC_SET_HELP = (
    "change a spec field before validation (repeatable). KEY is the field's dotted path in the "
    "spec YAML (budget.steps=50, search.num_samples=4, seeds=2); under workload.overrides and "
    "space the rest of the path is one config key (workload.overrides.optim.lr=3e-3, "
    "space.optim.lr.grid=[1e-3,3e-3]). VALUE is a number when it reads as one (3e-3, inf), "
    "else YAML")


def add_spec_set_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=SPEC_SET_HELP)
