"""The sweep's parent run as a summary: the objective's best, counts by status, the best
trial's run (id, name and a link the UI opens), written when a sweep ends.

Parent metrics (one value, step 0): ``sweep/best_objective``, ``sweep/n_trials`` and
``sweep/n_<status>`` for every final status; tags ``geosweep.objective`` (the metric's name),
``geosweep.best.{trial, run_id, run_name, link}``.
"""

from __future__ import annotations

import math
from typing import Any

from orchestrator.store.mlflow import TAG, MlflowSink

__all__ = ["log_sweep_summary", "best_record", "STATUSES"]

STATUSES = ("completed", "diverged", "stopped", "failed", "running")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def best_record(records: list[dict[str, Any]], mode: str = "min") -> dict[str, Any] | None:
    """The completed trial with the best finite objective (ties: the first trial id)."""
    ok = [r for r in records if r.get("status") == "completed" and _finite(r.get("objective"))]
    if not ok:
        return None
    sign = 1.0 if mode == "min" else -1.0
    return min(sorted(ok, key=lambda r: str(r["trial"])), key=lambda r: sign * r["objective"])


def log_sweep_summary(sink: MlflowSink, records: list[dict[str, Any]], metric: str,
                      mode: str = "min") -> dict[str, Any]:
    """Log the summary on the parent run; returns what was logged (metrics and tags)."""
    counts = {s: sum(r.get("status") == s for r in records) for s in STATUSES}
    metrics: dict[str, float] = {f"sweep/n_{s}": float(n) for s, n in counts.items()}
    metrics["sweep/n_trials"] = float(len(records))
    tags: dict[str, Any] = {f"{TAG}objective": metric, f"{TAG}mode": mode}
    best = best_record(records, mode)
    if best is not None:
        metrics["sweep/best_objective"] = float(best["objective"])
        tags[f"{TAG}best.trial"] = best["trial"]
        try:
            run_id = sink.run_id(str(best["trial"]))
        except KeyError:  # a preloaded trial this driver never touched
            run_id = sink.find_child(str(best["trial"]))
        if run_id:
            run = sink.client.get_run(run_id)
            tags[f"{TAG}best.run_id"] = run_id
            tags[f"{TAG}best.run_name"] = run.info.run_name
            tags[f"{TAG}best.link"] = f"#/experiments/{sink.experiment_id}/runs/{run_id}"
    sink.log_scalars(None, metrics, step=0)
    sink.set_tags(None, tags)
    return {"metrics": metrics, "tags": tags}
