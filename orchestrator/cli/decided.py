"""The command-line side of seeds until decided (``resume --until-decided``, ``seeds: auto``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.cli.checks import load_cli_spec
from orchestrator.cli.errors import UsageError

__all__ = ["run_until_decided"]


def run_until_decided(root: Path, spec: Any, address: str | None,
                      execute: Callable[..., int]) -> int:
    """Rounds of seeds for the undecided arms (orchestrator/sweep/until_decided.py);
    ``execute``: cli/run.py's (passed in: run.py and resume.py both call this)."""
    from orchestrator.analysis.load import ReportError
    from orchestrator.sweep.until_decided import until_decided

    def one_round(ext) -> int:  # each round re-reads spec.yaml: the last round added seeds
        # every round on the Ray the first one started or joined: no start and stop per round
        return execute(load_cli_spec(str(root / "spec.yaml")), root.parent, address,
                       resume=True, extend=ext, keep_ray=True)

    try:
        return until_decided(root, spec, one_round, lambda s: print(s, flush=True))
    except ReportError as e:
        raise UsageError(str(e)) from None
    finally:
        from cluster.local import shutdown

        shutdown()  # the Ray the rounds started, if they started one
