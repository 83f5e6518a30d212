"""geosweep's orchestrator: one subpackage per job.

- ``orchestrator.spec``: the declarative sweep language (YAML reader, ``SweepSpec`` and its
  sections, params and arm labels, claims, ``--set``); no Ray. Every other room looks down at it.
- ``orchestrator.sweep``: runs a spec on Ray: the search space, the divergence monitor and the
  Ray functions (worker, trial, tuner); the only importer of ``ray.tune`` / ``ray.train``.
- ``orchestrator.store``: Parquet, MLflow, the eval table, weights, the sweep folder layout; the
  only writer of MLflow and Parquet.
- ``orchestrator.analysis``: tables and figures from a sweep's dataset.
- ``orchestrator.evaluation``: held-out evaluation of trained trials.
- ``orchestrator.cli``: the ``geosweep`` command.

The public entry points, importable from here without importing torch or Ray until used::

    from orchestrator import load_spec, run_sweep, load_model, load_sweep, write_report
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["load_spec", "run_sweep", "load_model", "load_sweep", "write_report", "run_eval"]

# name -> the module that defines it; imported on first use (PEP 562), so `import orchestrator`
# stays cheap (the CLI's --help and input errors are instant).
_PUBLIC = {
    "load_spec": "orchestrator.spec.yaml_reader",
    "run_sweep": "orchestrator.sweep.tuner",
    "load_model": "orchestrator.store.weights",
    "load_sweep": "orchestrator.analysis.load",
    "write_report": "orchestrator.analysis.report",
    "run_eval": "orchestrator.evaluation.sweep_eval",
}


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
