"""The sweep's parent run as a summary: the objective's best, counts by status, the best
trial's run (id, name and a link the UI opens), written when a sweep ends.

Parent metrics (one value, step 0): ``sweep/best_objective``, ``sweep/n_trials`` and
``sweep/n_<status>`` for every final status; tags ``geosweep.objective`` (the metric's name),
``geosweep.best.{trial, run_id, run_name, link}`` and the run's description
(``mlflow.note.content``, the first thing its page shows): the counts by status, the best
trial by name with its value and a link to it; and on the experiment the sweep's shared view
(store/mlflow_names.py: every trial a row sorted by the objective, with its status, reason,
searched parameters and losses as columns, and every trial's loss curve on one chart), which
``geosweep ui`` links to.
"""

from __future__ import annotations

import math
from typing import Any

from orchestrator.store.mlflow import NOTE_TAG, TAG, MlflowSink
from orchestrator.store.mlflow_names import (
    VIEW_TAG_PREFIX,
    mlflow_key,
    run_link,
    view_key,
    view_state,
    view_url,
)

__all__ = ["log_sweep_summary", "best_record", "summary_note", "STATUSES", "NOTE_TAG"]

STATUSES = ("completed", "diverged", "stopped", "failed", "running")
_SAID = {"completed": "completed", "stopped": "stopped early by the scheduler",
         "diverged": "diverged", "failed": "failed", "running": "still running"}


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
    tags: dict[str, Any] = {f"{TAG}objective": metric, f"{TAG}objective_key": mlflow_key(metric),
                            f"{TAG}mode": mode}
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
            tags[f"{TAG}best.link"] = run_link(sink.experiment_id, run_id)
    view = view_url("", sink.experiment_id, sink.sweep).lstrip("/")  # relative: "#/..."
    tags[NOTE_TAG] = summary_note(sink.sweep, counts, metric, best, tags, view)
    sink.log_scalars(None, metrics, step=0)
    sink.set_tags(None, tags)
    sink.client.set_experiment_tag(sink.experiment_id, VIEW_TAG_PREFIX + view_key(sink.sweep),
                                   view_state(_param_keys(records), sink.parent_id, metric,
                                              mode))
    return {"metrics": metrics, "tags": tags}


def _param_keys(records: list[dict[str, Any]]) -> list[str]:
    """The searched parameters of the sweep (first-seen order), the seed last."""
    keys = dict.fromkeys(k for r in records for k in (r.get("params") or {}))
    seed = [k for k in keys if k == "train.seed"]
    return [k for k in keys if k != "train.seed"] + seed


def summary_note(sweep: str, counts: dict[str, int], metric: str, best: dict[str, Any] | None,
                 tags: dict[str, Any], view: str | None = None) -> str:
    """The parent run's description: what the sweep did and which trial won (markdown)."""
    n = sum(counts.values())
    parts = ", ".join(f"{k} {_SAID[s]}" for s, k in counts.items() if k)
    lines = [f"**Sweep `{sweep}`**: {n} trials ({parts or 'none recorded'})."]
    if best is None:
        lines.append(f"No trial completed with a finite `{metric}`: no best trial.")
    else:
        name = tags.get(f"{TAG}best.run_name") or best["trial"]
        link = tags.get(f"{TAG}best.link")
        shown = f"[{name}]({link})" if link else f"`{name}`"
        lines.append(f"Best trial: {shown} (trial `{best['trial']}`), `{metric}` = "
                     f"{float(best['objective']):.4g}.")
    if view:
        lines.append(f"Every trial, sorted by `{metric}`: [the sweep's runs]({view}), "
                     f"[their curves on one chart]({view}&compareRunsMode=CHART).")
    lines.append("Every trial is a run of this experiment, named by its searched parameters "
                 "and seed; `geosweep.status` says completed, stopped, diverged or failed and "
                 "`geosweep.reason` why.")
    return "\n\n".join(lines)
