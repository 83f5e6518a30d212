"""The tiny gpt-debug sweep the CLI tests start from, and the environment they spawn the CLI in.

Every section sits on one line, so ``spec_with`` replaces or adds whole sections by name."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root (cwd of spawned CLIs)

TINY = """\
name: tiny
workload: {preset: gpt-debug}
space: {optim.lr: {grid: [1.0e-3, 3.0e-3]}}
seeds: [0]
search: {algorithm: grid, max_concurrent: 1}
budget: {steps: 4, eval_every: 2, metrics_every: 0}
"""


def spec_with(base: str = TINY, **sections: str) -> str:
    """``base`` with top-level sections replaced or added (value: the section's flow YAML)."""
    lines = {ln.split(":", 1)[0]: ln for ln in base.splitlines()}
    lines.update({k: f"{k}: {v}" for k, v in sections.items()})
    return "\n".join(lines.values()) + "\n"


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a spawned ``geosweep``: this checkout importable, no usage stats,
    unbuffered output (the tests read it line by line while it runs)."""
    return dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1",
                PYTHONPATH=str(ROOT), **extra)
