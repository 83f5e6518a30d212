"""A new sqlite MLflow store copied from the migrated empty template (store/mlflow_template.py)."""

from __future__ import annotations

import os
import sqlite3

import pytest
from mlflow import MlflowClient

from orchestrator.store.mlflow import MlflowSink
from orchestrator.store.mlflow_template import seed_sqlite_store, template_path

pytestmark = pytest.mark.timeout(120)


def _schema(db) -> tuple:
    """Tables and indexes with their DDL, lines sorted: MLflow's own migrations order a
    table's CHECK constraints differently from one new store to the next."""
    con = sqlite3.connect(db)
    try:
        tables = [(t, n, sorted(line.strip().rstrip(",") for line in (sql or "").splitlines()))
                  for t, n, sql in con.execute(
                      "SELECT type, name, sql FROM sqlite_master ORDER BY name")]
        version = con.execute("SELECT version_num FROM alembic_version").fetchall()
        exps = con.execute("SELECT experiment_id, name, artifact_location FROM experiments"
                           ).fetchall()
    finally:
        con.close()
    return tables, version, exps


def test_template_store_is_mlflows_own_new_store(tmp_path, monkeypatch):
    monkeypatch.setenv("GEOSWEEP_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    own = tmp_path / "own.db"
    MlflowClient(f"sqlite:///{own}").search_experiments()  # MLflow's migrations
    assert seed_sqlite_store(tmp_path / "a" / "mlflow.db")
    assert template_path().exists()
    made = template_path().stat().st_mtime_ns
    assert seed_sqlite_store(tmp_path / "b" / "mlflow.db")
    assert template_path().stat().st_mtime_ns == made  # made once, then only copied
    assert _schema(tmp_path / "b" / "mlflow.db") == _schema(own)
    assert not [p for p in os.listdir(tmp_path / "b") if p.endswith(".tmp")]


def test_sink_on_a_template_store_writes_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("GEOSWEEP_CACHE", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path / 'sw' / 'mlflow.db'}"
    sink = MlflowSink(uri, "geosweep", "sw")
    assert template_path().exists()
    parent = sink.start_parent("name: sw\n", {"sweep": "sw"}, {"git": {"sha": "x"}})
    sink.start_child("t1", {"optim.lr": 0.1})
    sink.log_scalars("t1", {"val/loss": 1.5}, step=3)
    sink.end_child("t1", "completed")
    run = MlflowClient(uri).get_run(sink.run_id("t1"))
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.info.status == "FINISHED" and run.data.metrics


def test_existing_store_is_left_alone_and_no_cache_falls_back(tmp_path, monkeypatch):
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"not a template")
    assert not seed_sqlite_store(db)
    assert db.read_bytes() == b"not a template"
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("GEOSWEEP_CACHE", str(blocker / "cache"))  # cannot be made
    assert not seed_sqlite_store(tmp_path / "new" / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'new2' / 'mlflow.db'}"
    MlflowSink(uri, "geosweep", "sw")  # MLflow builds the store itself
    assert MlflowClient(uri).get_experiment_by_name("geosweep") is not None
