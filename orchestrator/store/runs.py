"""Finding a sweep's MLflow store and its trials' child runs again, after the sweep ended.

Children carry the tags ``geosweep.sweep`` and ``geosweep.trial_id`` (orchestrator/store/
mlflow.py); the experiment is ``tracking.experiment`` or the sweep name, and when neither is
found every experiment of the store is searched.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["sweep_tracking_uri", "store_problem", "store_broken", "trial_runs", "sweep_runs",
           "log_report", "view_experiment"]

_MAX_RUNS = 50000  # the SQL store's search_runs page limit
_FEW = 8  # trial_runs: up to this many trials are looked up one by one


def sweep_tracking_uri(sweep_dir: str | Path) -> str:
    """The MLflow tracking URI recorded in ``<sweep>/sweep.json`` (sqlite in the folder if none)."""
    root = Path(sweep_dir).expanduser().resolve()
    if not (root / "sweep.json").exists():
        return f"sqlite:///{root / 'mlflow.db'}"
    from orchestrator.store.manifest import read_manifest

    return str(read_manifest(root).get("mlflow_uri") or f"sqlite:///{root / 'mlflow.db'}")


def store_problem(uri: str) -> str | None:
    """Why the store cannot be used, or None (store/mlflow_store.py classifies it before
    anything opens it: MlflowClient creates tables in a foreign sqlite file, and retries for
    minutes on a folder, an unreadable file or a dead server)."""
    from orchestrator.store.mlflow_store import probe

    found = probe(uri)
    return found.message if found else None


def store_broken(uri: str, e: BaseException) -> str | None:
    """Why ``e`` (raised by an MLflow call on ``uri``) says the store itself is unusable (a
    corrupt, locked or foreign sqlite file...), or None for any other failure (a bug: let it
    raise)."""
    from orchestrator.store.mlflow_store import classify_error

    found = classify_error(uri, e)
    return f"{found.message}" if found else None


def trial_runs(client: Any, sweep: str, experiment: str | None = None,
               trials: Iterable[str] | None = None) -> dict[str, str]:
    """``{trial id: child run id}`` of the sweep's trials (of ``trials`` only, when given).

    ``trials``: one small search per trial instead of one of the whole sweep: MLflow's
    ``search_runs`` loads every found run's params, tags and latest metrics (measured: 0.28
    CPU-s for 100 runs of 60 params and 24 metrics, 0.011 for one), which a sweep's end paid
    for all its trials to find the one whose weights it keeps."""
    exp = client.get_experiment_by_name(experiment or sweep)
    ids = [exp.experiment_id] if exp else [e.experiment_id for e in client.search_experiments()]
    if not ids:
        return {}
    query = f"tags.`geosweep.sweep` = '{sweep}'"
    wanted = None if trials is None else sorted({str(t) for t in trials})
    if wanted is None or len(wanted) > _FEW or any("'" in t or "\\" in t for t in wanted):
        runs = client.search_runs(ids, query, max_results=_MAX_RUNS)
    else:
        runs = [r for t in wanted for r in client.search_runs(
            ids, f"{query} and tags.`geosweep.trial_id` = '{t}'", max_results=_MAX_RUNS)]
    out: dict[str, str] = {}
    for r in sorted(runs, key=lambda r: r.info.start_time or 0):
        tid = r.data.tags.get("geosweep.trial_id")
        if tid and r.data.tags.get("geosweep.role", "child") == "child":
            out[tid] = r.info.run_id
    if wanted is not None:
        out = {t: out[t] for t in wanted if t in out}
    return out


def view_experiment(uri: str, sweep: str) -> str | None:
    """The id of the experiment holding the sweep's shared view (store/summary.py), or None
    (no such store or view: a sweep that ended before the summary was written)."""
    from orchestrator.store.mlflow_names import VIEW_TAG_PREFIX, view_key
    from orchestrator.store.mlflow_store import StoreError, open_client

    tag = VIEW_TAG_PREFIX + view_key(sweep)
    try:
        exps = open_client(uri).search_experiments()
    except StoreError:
        return None
    except Exception as e:  # a store that breaks while read: the plain UI link still works
        if store_broken(uri, e) is None:
            raise
        return None
    return next((e.experiment_id for e in exps if tag in e.tags), None)


def sweep_runs(root: Path, manifest: dict[str, Any], name: str, experiment: str | None = None,
               printer=print) -> tuple[Any, dict[str, str]]:
    """(an MlflowClient on the sweep's store, trial id -> child run id), or (None, {}) with a
    printed reason when the store cannot be used (decided before anything is written)."""
    from orchestrator.store.mlflow_store import StoreError, open_client

    uri = str(manifest.get("mlflow_uri") or f"sqlite:///{root / 'mlflow.db'}")
    try:
        client = open_client(uri)
        return client, trial_runs(client, name, experiment)
    except StoreError as e:
        printer(f"[geosweep] not logging to MLflow: {e}")
        return None, {}
    except Exception as e:  # a store that fails when read: the Parquet rows are written
        why = store_broken(uri, e)
        if why is None:
            raise
        printer(f"[geosweep] not logging to MLflow: {why}")
        return None, {}


def log_report(uri: str | None, sweep: str, folder: Path, root: Path | None = None) -> str:
    """Log ``folder`` as artifacts ``report/`` of the sweep's parent run; one-line outcome.
    ``root``: the sweep folder; a store inside it keeps its artifacts inside it
    (store/artifact_home.py: a moved folder's locations are pointed back in first)."""
    from orchestrator.store.artifact_home import relocate, store_in_folder
    from orchestrator.store.mlflow_store import StoreError, open_client
    from orchestrator.store.targets import FolderError

    if not uri:
        return "not logged: the sweep has no mlflow_uri"
    db = store_in_folder(str(uri), root) if root is not None else None
    try:
        client = open_client(str(uri))
        moved = relocate(root, db, sweep) if db is not None and root is not None else None
        note = _log_report(client, str(uri), sweep, folder, root if db is not None else None)
        return f"{note} ({moved.removeprefix('[geosweep] ')})" if moved else note
    except (StoreError, FolderError) as e:
        return f"not logged: {e}"
    except Exception as e:  # a store that fails: the report is written; say so, do not fail
        why = store_broken(str(uri), e)
        if why is None:
            raise
        return f"not logged: {why}"


def _log_report(client: Any, uri: str, sweep: str, folder: Path, root: Path | None) -> str:
    query = f"tags.`geosweep.sweep` = '{sweep}'"
    exp = client.get_experiment_by_name(sweep)
    ids = [exp.experiment_id] if exp else []
    runs = client.search_runs(ids, query) if ids else []
    if not runs:  # experiment named otherwise (tracking.experiment): look everywhere
        ids = [e.experiment_id for e in client.search_experiments()]
        runs = client.search_runs(ids, query) if ids else []
    parents = [r for r in runs if r.data.tags.get("geosweep.role") == "parent"] or [
        r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    if not parents:
        return (f"not logged: no parent run tagged geosweep.sweep={sweep!r} in {uri}")
    run = max(parents, key=lambda r: r.info.start_time or 0)
    if root is not None:
        from orchestrator.store.artifact_home import outside_artifacts

        why = outside_artifacts(root, run.info.artifact_uri)
        if why:
            return f"not logged: {why}"
    # the repository of the location just checked, not MLflow's per-process cache of the run's
    # repository (a location read before the folder's store was pointed back into it)
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    get_artifact_repository(run.info.artifact_uri).log_artifacts(str(folder), "report")
    return f"tables and figures logged to MLflow run {run.info.run_id} (artifacts report/)"
