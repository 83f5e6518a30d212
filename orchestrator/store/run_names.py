"""How a sweep reads in MLflow's runs table: a child run's name, its status and the reason.

A child run is named by its arm, compactly and deterministically, from the trial's searched
parameters and seed: ``{family: spheret, p: 2, lr: 0.003, seed: 0}`` -> ``spheret p=2 lr=3e-3
s0``. String values stand alone (a family name says what it is), other values are
``<last dotted part>=<value>``; a key whose last part is ambiguous keeps its last two parts;
keys in sorted order, so a trial's name is the same in MLflow (its run name), Parquet
(``trials.name``), ``geosweep status`` and the report. The name is for reading; a trial's
identity is its trial id (MLflow tag ``geosweep.trial_id``).

MLflow's run status tells a trial that went wrong from one that did not: diverged and failed
trials are FAILED, completed trials and trials a scheduler (ASHA) stopped are FINISHED (the
scheduler's decision is the search working, and MLflow 3's UI draws KILLED with FAILED's red
icon); the tag ``geosweep.status`` says which of the four it was, ``geosweep.reason`` why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["run_name", "compact", "END_STATUS", "reason", "EXPERIMENT_KIND", "TAG"]

TAG = "geosweep."  # the prefix of geosweep's MLflow tags (here: importing it needs no MLflow)
SEED_KEY = "train.seed"  # as orchestrator/spec/params.py (store does not import spec)
_MAX_NAME = 250
# geosweep status -> MLflow run status
END_STATUS = {"completed": "FINISHED", "diverged": "FAILED", "stopped": "FINISHED",
              "failed": "FAILED"}
# The experiment's kind, for MLflow's experiment list and older UIs; MLflow 3.17's UI does not
# read it to pick its view (store/mlflow_ui_app.py: what it reads)
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def compact(v: Any) -> str:
    """A value as short as it stays exact enough to tell arms apart: 3e-3, 2, inf, 0.25."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if math.isnan(v):
            return "nan"
        if v == int(v) and abs(v) < 1e6:
            return str(int(v))
        if 0.01 <= abs(v) < 1e4:
            return f"{v:.3g}"
        mant, exp = f"{v:.2e}".split("e")
        mant = mant.rstrip("0").rstrip(".")
        return f"{mant}e{int(exp)}"
    return str(v)


def _short_keys(keys: list[str]) -> dict[str, str]:
    last = [k.split(".")[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else ".".join(k.split(".")[-2:]))
            for k, s in zip(keys, last)}


def run_name(params: Mapping[str, Any], seed: Any = None) -> str:
    """``spheret p=2 lr=3e-3 s0`` from a trial's flat searched params (+ seed)."""
    keys = sorted(k for k in params if k != SEED_KEY)  # the same name from any dict order
    short = _short_keys(keys)
    parts = []
    for k in keys:
        v = params[k]
        parts.append(v if isinstance(v, str) else f"{short[k]}={compact(v)}")
    seed = params.get(SEED_KEY) if seed is None else seed
    if seed is not None:
        parts.append(f"s{seed}")
    return (" ".join(parts) or "base")[:_MAX_NAME]


def reason(rec: Mapping[str, Any], status: str) -> str | None:
    """One line saying why a trial ended as it did (None for a completed trial)."""
    if status == "diverged":
        out = f"diverged: {rec.get('divergence_reason') or 'unknown rule'}"
        if rec.get("divergence_step") is not None:
            out += f" at step {_int(rec['divergence_step'])}"
        return out + (f" ({rec['divergence_detail']})" if rec.get("divergence_detail") else "")
    if status == "stopped":
        step = rec.get("last_step")
        return "stopped early by the scheduler (ASHA)" + (f" at step {_int(step)}" if step else "")
    if status == "failed":
        return f"failed: {rec.get('error') or 'error'}"
    return None


def _int(v: Any) -> Any:
    """A step read back from Parquet through pandas (44.0) as the integer it is."""
    return int(v) if isinstance(v, float) and v.is_integer() else v
