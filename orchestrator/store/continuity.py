"""What ``geosweep continuity`` writes: its rows as Parquet and one MLflow run (experiment
``continuity``) with the summary metrics and the files as artifacts."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from orchestrator.store.mlflow import TAG, default_tracking

__all__ = ["EXPERIMENT", "write_table_atomic", "log_continuity"]

EXPERIMENT = "continuity"


def write_table_atomic(rows: pd.DataFrame, path: Path) -> Path:
    """``rows`` as one Parquet file, written to a temporary name and renamed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    pq.write_table(pa.Table.from_pandas(rows, preserve_index=False), tmp)
    os.replace(tmp, path)
    return path


def log_continuity(uri: str | None, out: Path, analysis, table: pd.DataFrame,
                   artifacts: list[Path], run_name: str) -> tuple[str, str]:
    """One MLflow run in experiment ``continuity``: params, per-role top-1 metrics, artifacts.
    ``uri`` None: the default store under ``out``. Returns (tracking uri, run id)."""
    from orchestrator.store.mlflow_store import open_client

    default_uri, artifact_location = default_tracking(str(out))
    if uri is None:
        uri = default_uri
    else:
        artifact_location = None  # a given store keeps its own artifact root
    client = open_client(uri, create=True)  # classified first: never a foreign file changed
    if uri == default_uri:  # the store in --out keeps its artifacts in --out
        from orchestrator.store.artifact_home import relocate

        line = relocate(out, uri[len("sqlite:///"):], EXPERIMENT)
        if line:
            print(line, flush=True)
    exp = client.get_experiment_by_name(EXPERIMENT)
    exp_id = exp.experiment_id if exp else client.create_experiment(
        EXPERIMENT, artifact_location=artifact_location)
    run = client.create_run(exp_id, run_name=run_name,
                            tags={f"{TAG}kind": "continuity"})
    rid = run.info.run_id
    client.log_param(rid, "checkpoint", analysis.checkpoint)
    client.log_param(rid, "architecture", analysis.architecture)
    client.log_param(rid, "n_layers", analysis.n_layers)
    client.log_param(rid, "shuffled_order", " ".join(map(str, analysis.shuffled)))
    for role, r in table.iterrows():
        client.log_metric(rid, f"{role}/resid_top1", float(r.resid_top1))
        client.log_metric(rid, f"{role}/control_top1", float(r.control_top1))
        client.log_metric(rid, f"{role}/shuffled_top1", float(r.shuffled_top1))
    for a in artifacts:
        client.log_artifact(rid, str(a))
    client.set_terminated(rid)
    return uri, rid
