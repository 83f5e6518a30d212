"""Sweep folders written before the spec language moved to ``orchestrator/spec/`` (issue 30).

Tune pickles the search space and the searcher into the sweep's experiment state (``Param`` in
the Optuna define-by-run space and in the conditional draws of orchestrator/sweep/space.py), so
a pickle from before the move names ``orchestrator.sweep.params``. ``alias_moved_modules``
makes those names resolve to the modules that now hold the classes; ``geosweep resume`` calls
it before Tune unpickles anything, so an older sweep resumes instead of failing on an import.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["MOVED", "alias_moved_modules"]

# old module -> new module (the README's "path of one sweep" names the new ones)
MOVED = {
    "orchestrator.sweep.spec_yaml": "orchestrator.spec.yaml_reader",
    "orchestrator.sweep.spec": "orchestrator.spec.sweep_spec",
    "orchestrator.sweep.spec_parts": "orchestrator.spec.sections",
    "orchestrator.sweep.spec_report": "orchestrator.spec.report_seeds",
    "orchestrator.sweep.params": "orchestrator.spec.params",
    "orchestrator.sweep.claims": "orchestrator.spec.claims",
    "orchestrator.sweep.spec_set": "orchestrator.spec.sets",
}


def alias_moved_modules() -> list[str]:
    """Register every old name that is not importable as an alias of its new module; the old
    names it registered (none when called twice)."""
    added = []
    for old, new in MOVED.items():
        if old not in sys.modules:
            sys.modules[old] = importlib.import_module(new)
            added.append(old)
    return added
