"""Finding a sweep's MLflow store and its trials' child runs again, after the sweep ended.

Children carry the tags ``geosweep.sweep`` and ``geosweep.trial_id`` (orchestrator/store/
mlflow.py); the experiment is ``tracking.experiment`` or the sweep name, and when neither is
found every experiment of the store is searched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["sweep_tracking_uri", "store_problem", "trial_runs"]

_MAX_RUNS = 50000  # the SQL store's search_runs page limit


def sweep_tracking_uri(sweep_dir: str | Path) -> str:
    """The MLflow tracking URI recorded in ``<sweep>/sweep.json`` (sqlite in the folder if none)."""
    root = Path(sweep_dir).expanduser().resolve()
    mf = root / "sweep.json"
    uri = json.loads(mf.read_text()).get("mlflow_uri") if mf.exists() else None
    return str(uri or f"sqlite:///{root / 'mlflow.db'}")


def store_problem(uri: str) -> str | None:
    """Why the store cannot be used, or None (checked first: MlflowClient creates an empty
    sqlite file for a missing one and retries for minutes against a dead server)."""
    if uri.startswith(("http://", "https://")):
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=3).read()
        except (urllib.error.URLError, OSError, ValueError) as e:
            return f"MLflow server {uri} unreachable ({e})"
    elif uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        return f"MLflow store {uri} does not exist"
    return None


def trial_runs(client: Any, sweep: str, experiment: str | None = None) -> dict[str, str]:
    """``{trial id: child run id}`` of the sweep's trials."""
    exp = client.get_experiment_by_name(experiment or sweep)
    ids = [exp.experiment_id] if exp else [e.experiment_id for e in client.search_experiments()]
    if not ids:
        return {}
    query = f"tags.`geosweep.sweep` = '{sweep}'"
    runs = client.search_runs(ids, query, max_results=_MAX_RUNS)
    out: dict[str, str] = {}
    for r in sorted(runs, key=lambda r: r.info.start_time or 0):
        tid = r.data.tags.get("geosweep.trial_id")
        if tid and r.data.tags.get("geosweep.role", "child") == "child":
            out[tid] = r.info.run_id
    return out
