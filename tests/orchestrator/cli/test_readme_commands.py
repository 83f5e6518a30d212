"""Every `geosweep ...` command README.md and docs/cluster.md show parses, and every `--set` in
them applies: `train --set` to its preset (validated), `run`/`search-p` `--set` to their spec
(validated). Nothing is run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

import orchestrator.cli as ocli

ROOT = Path(__file__).resolve().parents[3]


def shown_commands(path: Path) -> list[list[str]]:
    """argv lists of the `geosweep` lines inside ```bash blocks (comments and ``\\`` joins
    handled; ``<placeholders>`` filled with a word)."""
    text = path.read_text()
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            m = re.match(r"^(?:\.venv/bin/)?geosweep\s", line)
            if not m:
                continue
            argv = shlex.split(line, comments=True)[1:]
            cmds.append([re.sub(r"^<[^>]+>$", "x", a) for a in argv])
    return cmds


README = shown_commands(ROOT / "README.md")
CLUSTER = shown_commands(ROOT / "docs" / "cluster.md")


def test_the_docs_show_commands():
    assert len(README) >= 20 and len(CLUSTER) >= 4
    assert any(a[:1] == ["train"] and "optim.lr=3e-3" in a for a in README)


@pytest.mark.parametrize("argv", README + CLUSTER, ids=lambda a: " ".join(a)[:60])
def test_shown_command_parses(argv):
    args = ocli.build_parser().parse_args(argv)  # a UsageError fails the test
    assert callable(args.fn)
    sets = getattr(args, "set", None) or []
    if args.command == "train":
        from workloads.config import apply_overrides, parse_value, preset
        from workloads.validate import validate

        overrides = {k: parse_value(v) for k, v in (s.split("=", 1) for s in sets)}
        validate(apply_overrides(preset(args.preset), overrides))
    elif sets:
        from orchestrator.spec.sets import load_spec_with_sets

        load_spec_with_sets(args.spec, sets)
