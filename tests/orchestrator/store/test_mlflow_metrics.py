"""Metric points written straight into the sqlite tables (store/mlflow_metrics.py) are the
rows MLflow's own log_batch writes for the same points, batch after batch: NaN and infinities,
equal points in a batch and across batches, several points of a key in one batch, ties of
the latest value broken by timestamp and value, an older step after a newer one."""

from __future__ import annotations

import math
import shutil
import sqlite3

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from orchestrator.store.mlflow_metrics import SqliteMetrics

pytestmark = pytest.mark.timeout(120)

BATCHES = [
    [Metric("a", 1.0, 1000, 1), Metric("a", 0.5, 1001, 2), Metric("b", math.nan, 1000, 1)],
    [Metric("a", 0.25, 1002, 3), Metric("a", 0.25, 1002, 3),  # equal points in one batch
     Metric("b", math.inf, 1003, 2), Metric("c", -math.inf, 1003, 5)],
    [Metric("a", 0.25, 1002, 3),  # a point already logged: skipped, as MLflow skips it
     Metric("a", 9.0, 900, 1),  # an older step: the latest value stays
     Metric("c", 2.0, 1003, 5), Metric("c", 1.0, 1003, 5),  # a tie on step and time: value
     Metric("d", 3.0, 2000, 7), Metric("d", 4.0, 1999, 7)],  # a tie on step: time
    [Metric("b", 7.0, 5, 2), Metric("e", -0.0, 0, 0)],  # same step as b's inf, older time
]


def _store(tmp_path, template, name):
    db = tmp_path / f"{name}.db"
    shutil.copy(template, db)
    client = MlflowClient(f"sqlite:///{db}")
    exp = client.create_experiment("x")
    return db, client, client.create_run(exp).info.run_id


@pytest.fixture()
def template(tmp_path_factory):
    path = tmp_path_factory.getbasetemp() / "metrics-template.db"
    if not path.exists():
        MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


def _rows(db, run_id):
    con = sqlite3.connect(db)
    try:
        m = sorted(con.execute("SELECT key, value, timestamp, step, is_nan FROM metrics "
                               "WHERE run_uuid = ?", (run_id,)))
        latest = sorted(con.execute("SELECT key, value, timestamp, step, is_nan FROM "
                                    "latest_metrics WHERE run_uuid = ?", (run_id,)))
    finally:
        con.close()
    return m, latest


@pytest.mark.parametrize("form", ["entities", "tuples"])
def test_rows_are_mlflows_batch_after_batch(tmp_path, template, form):
    """The same rows as MLflow's ``log_batch``, whether the points come as MLflow's entities
    or as the (key, value, timestamp, step) tuples the sweep's sink sends (NaN and inf too)."""
    db_a, client, run_a = _store(tmp_path, template, "mlflow")
    db_b, _, run_b = _store(tmp_path, template, "direct")
    direct = SqliteMetrics.open(str(db_b))
    assert direct is not None
    try:
        for batch in BATCHES:
            client.log_batch(run_a, metrics=batch)
            direct.write(run_b, batch if form == "entities" else
                         [(m.key, m.value, m.timestamp, m.step) for m in batch])
            assert _rows(db_b, run_b) == _rows(db_a, run_a)
    finally:
        direct.close()
    metrics, latest = _rows(db_b, run_b)
    assert len(metrics) == 13  # 15 points, 2 of them equal to one already there
    assert dict((k, (v, s)) for k, v, _, s, _ in latest)["c"] == (2.0, 5)
    # and MLflow reads them as its own
    reader = MlflowClient(f"sqlite:///{db_b}")
    hist = reader.get_metric_history(run_b, "b")
    assert [(m.step, m.value) for m in sorted(hist, key=lambda m: m.timestamp)][0][1] == 7.0
    assert math.isnan(next(m.value for m in hist if m.step == 1))
    assert reader.get_run(run_b).data.metrics == client.get_run(run_a).data.metrics


def test_a_store_of_other_columns_is_left_to_mlflow(tmp_path):
    db = tmp_path / "other.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE metrics (key TEXT, value REAL, timestamp INT, run_uuid TEXT, "
                "step INT, is_nan INT, model_id TEXT)")
    con.execute("CREATE TABLE latest_metrics (key TEXT, value REAL, timestamp INT, step INT, "
                "is_nan INT, run_uuid TEXT)")
    con.commit()
    con.close()
    assert SqliteMetrics.open(str(db)) is None


def test_a_run_that_is_not_active_is_refused_and_nothing_written(tmp_path, template):
    db, client, run = _store(tmp_path, template, "deleted")
    client.delete_run(run)
    direct = SqliteMetrics.open(str(db))
    try:
        with pytest.raises(RuntimeError, match="not an active run"):
            direct.write(run, BATCHES[0])
        with pytest.raises(RuntimeError, match="not found"):
            direct.write("0" * 32, BATCHES[0])
    finally:
        direct.close()
    assert _rows(db, run) == ([], [])


def _run_rows(db, run_id):
    con = sqlite3.connect(db)
    try:
        params = sorted(con.execute("SELECT key, value FROM params WHERE run_uuid = ?",
                                    (run_id,)))
        tags = sorted(con.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,)))
        run = con.execute("SELECT name, status, end_time, lifecycle_stage FROM runs "
                          "WHERE run_uuid = ?", (run_id,)).fetchone()
    finally:
        con.close()
    return params, tags, run


def test_params_tags_and_end_are_mlflows(tmp_path, template):
    """Params (new keys; an equal one again is skipped), tags (set again, a repeated key's last
    value, a value past MLflow's limit truncated as MLflow truncates it, mlflow.runName also
    renaming the run) and the end (status, end time) are the rows of MLflow's log_batch and
    set_terminated, batch after batch."""
    from mlflow.entities import Param, RunTag

    db_a, client, run_a = _store(tmp_path, template, "mlflow")
    db_b, client_b, run_b = _store(tmp_path, template, "direct")
    for c, r in ((client, run_a), (client_b, run_b)):  # the same name to start from
        c.set_tag(r, "mlflow.runName", "r0")
    direct = SqliteMetrics.open(str(db_b))
    batches = [
        ([Param("lr", "0.1"), Param("seed", "0")], [RunTag("a", "1"), RunTag("b", "x" * 9000)]),
        ([Param("lr", "0.1"), Param("depth", "4")],
         [RunTag("a", "2"), RunTag("c", "3"), RunTag("c", "4"), RunTag("mlflow.runName", "r1")]),
        ([], [RunTag("b", "short")]),
    ]
    try:
        for params, tags in batches:
            client.log_batch(run_a, params=params, tags=tags)
            direct.write(run_b, params=params, tags=tags)
            assert _run_rows(db_b, run_b) == _run_rows(db_a, run_a)
        client.set_terminated(run_a, status="FAILED", end_time=123456)
        direct.write(run_b, [Metric("m", 1.0, 5, 0)], tags=[RunTag("d", "e")],
                     end=("FAILED", 123456))
        client.log_batch(run_a, metrics=[Metric("m", 1.0, 5, 0)], tags=[RunTag("d", "e")])
        assert _run_rows(db_b, run_b) == _run_rows(db_a, run_a)
        assert _rows(db_b, run_b) == _rows(db_a, run_a)
    finally:
        direct.close()
    params, tags, run = _run_rows(db_b, run_b)
    assert ("depth", "4") in params and dict(tags)["c"] == "4" and run[:3] == ("r1", "FAILED",
                                                                              123456)
    # MLflow reads it as its own
    got, want = MlflowClient(f"sqlite:///{db_b}").get_run(run_b), client.get_run(run_a)
    assert got.data.params == want.data.params and got.data.tags == want.data.tags
    assert (got.info.status, got.info.end_time, got.info.run_name) == (
        want.info.status, want.info.end_time, want.info.run_name)


def test_param_changes_and_duplicates_are_refused_as_mlflow_refuses_them(tmp_path, template):
    from mlflow.entities import Param
    from mlflow.exceptions import MlflowException

    db, client, run = _store(tmp_path, template, "direct")
    direct = SqliteMetrics.open(str(db))
    try:
        direct.write(run, params=[Param("lr", "0.1")])
        before = _run_rows(db, run)
        with pytest.raises(MlflowException, match="Changing param values is not allowed"):
            direct.write(run, [Metric("m", 1.0, 5, 0)], params=[Param("lr", "0.2")])
        with pytest.raises(MlflowException, match="Duplicate parameter keys"):
            direct.write(run, params=[Param("x", "1"), Param("x", "1")])
        with pytest.raises(MlflowException, match="Changing param values is not allowed"):
            client.log_batch(run, params=[Param("lr", "0.2")])
        assert _run_rows(db, run) == before and _rows(db, run) == ([], [])  # nothing written
        client.set_terminated(run)
        client.delete_run(run)
        with pytest.raises(RuntimeError, match="not an active run"):
            direct.write(run, end=("FINISHED", 1))
    finally:
        direct.close()


def test_a_created_run_is_mlflows(tmp_path, template):
    """A run made here is the row MLflow's create_run makes for the same experiment, name and
    tags (but its id, start time and the id in its artifact URI), and MLflow reads it."""
    db, client, _ = _store(tmp_path, template, "direct")
    exp = client.get_experiment_by_name("x").experiment_id
    tags = {"geosweep.sweep": "sw", "mlflow.parentRunId": "p" * 32}
    want = client.create_run(exp, run_name="trial-1", tags=tags).info.run_id
    direct = SqliteMetrics.open(str(db))
    try:
        got, start = direct.create_run(exp, "trial-1", tags, start_time=1234)
    finally:
        direct.close()
    con = sqlite3.connect(db)
    try:
        cols = [r[1] for r in con.execute("PRAGMA table_info(runs)")]
        rows = {r: dict(zip(cols, con.execute("SELECT * FROM runs WHERE run_uuid = ?",
                                              (r,)).fetchone())) for r in (want, got)}
        tag_rows = {r: sorted(con.execute("SELECT key, value FROM tags WHERE run_uuid = ?",
                                          (r,))) for r in (want, got)}
    finally:
        con.close()
    a, b = rows[want], rows[got]
    assert b["start_time"] == start == 1234
    assert b["artifact_uri"] == a["artifact_uri"].replace(want, got)
    skip = {"run_uuid", "start_time", "artifact_uri"}
    assert {k: v for k, v in b.items() if k not in skip} == {
        k: v for k, v in a.items() if k not in skip}
    assert tag_rows[got] == tag_rows[want]
    run = MlflowClient(f"sqlite:///{db}").get_run(got)
    assert (run.info.status, run.info.run_name, run.info.lifecycle_stage) == (
        "RUNNING", "trial-1", "active")
    assert run.data.tags == client.get_run(want).data.tags
