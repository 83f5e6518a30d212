"""Finding a sweep's MLflow store and its trials' child runs again, after the sweep ended.

Children carry the tags ``geosweep.sweep`` and ``geosweep.trial_id`` (orchestrator/store/
mlflow.py); the experiment is ``tracking.experiment`` or the sweep name, and when neither is
found every experiment of the store is searched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["sweep_tracking_uri", "store_problem", "store_broken", "trial_runs", "sweep_runs",
           "log_report", "view_experiment"]

_MAX_RUNS = 50000  # the SQL store's search_runs page limit


def sweep_tracking_uri(sweep_dir: str | Path) -> str:
    """The MLflow tracking URI recorded in ``<sweep>/sweep.json`` (sqlite in the folder if none)."""
    root = Path(sweep_dir).expanduser().resolve()
    if not (root / "sweep.json").exists():
        return f"sqlite:///{root / 'mlflow.db'}"
    from orchestrator.store.manifest import read_manifest

    return str(read_manifest(root).get("mlflow_uri") or f"sqlite:///{root / 'mlflow.db'}")


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


def store_broken(uri: str, e: BaseException) -> str | None:
    """Why ``e`` (raised by an MLflow call on ``uri``) says the store itself is unreadable (a
    truncated or corrupt sqlite file), or None for any other failure (a bug: let it raise)."""
    seen: BaseException | None = e
    for _ in range(5):  # MlflowException wraps SQLAlchemy's error, which wraps sqlite3's
        if seen is None:
            break
        text = str(seen).splitlines()[0] if str(seen) else type(seen).__name__
        if "DatabaseError" in type(seen).__name__ or "malformed" in text \
                or "not a database" in text:
            return f"MLflow store {uri} is unreadable ({text[:120]}); restore it from a copy"
        seen = seen.__cause__ or seen.__context__
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


def view_experiment(uri: str, sweep: str) -> str | None:
    """The id of the experiment holding the sweep's shared view (store/summary.py), or None
    (no such store or view: a sweep that ended before the summary was written)."""
    if store_problem(uri):
        return None
    from mlflow import MlflowClient

    from orchestrator.store.mlflow_names import VIEW_TAG_PREFIX, view_key

    tag = VIEW_TAG_PREFIX + view_key(sweep)
    try:
        exps = MlflowClient(tracking_uri=uri).search_experiments()
    except Exception:  # noqa: BLE001 - a broken store: the plain UI link still works
        return None
    return next((e.experiment_id for e in exps if tag in e.tags), None)


def sweep_runs(root: Path, manifest: dict[str, Any], name: str, experiment: str | None = None,
               printer=print) -> tuple[Any, dict[str, str]]:
    """(an MlflowClient on the sweep's store, trial id -> child run id), or (None, {}) with a
    printed reason when the store cannot be used."""
    uri = str(manifest.get("mlflow_uri") or f"sqlite:///{root / 'mlflow.db'}")
    why = store_problem(uri)
    if why:
        printer(f"[geosweep] not logging to MLflow: {why}")
        return None, {}
    from mlflow import MlflowClient

    try:  # the client opens (and migrates) the store: a corrupt one fails here already
        client = MlflowClient(tracking_uri=uri)
        return client, trial_runs(client, name, experiment)
    except Exception as e:  # a corrupt store: the Parquet rows are written all the same
        why = store_broken(uri, e)
        if why is None:
            raise
        printer(f"[geosweep] not logging to MLflow: {why}")
        return None, {}


def log_report(uri: str | None, sweep: str, folder: Path) -> str:
    """Log ``folder`` as artifacts ``report/`` of the sweep's parent run; one-line outcome."""
    if not uri:
        return "not logged: the sweep has no mlflow_uri"
    why = store_problem(str(uri))
    if why:
        return f"not logged: {why}"
    from mlflow.tracking import MlflowClient

    try:
        return _log_report(MlflowClient(tracking_uri=str(uri)), str(uri), sweep, folder)
    except Exception as e:  # a corrupt store: the report is written; say so, do not fail
        why = store_broken(str(uri), e)
        if why is None:
            raise
        return f"not logged: {why}"


def _log_report(client: Any, uri: str, sweep: str, folder: Path) -> str:
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
    client.log_artifacts(run.info.run_id, str(folder), artifact_path="report")
    return f"tables and figures logged to MLflow run {run.info.run_id} (artifacts report/)"
