"""The sweep's sqlite stores in WAL mode with synchronous=NORMAL (store/sqlite_durability.py):
what a registered file's connections get, the file a finished writer leaves, and the
durability promise, tested for real: a writer process killed with SIGKILL right after it
acknowledged its commits (MLflow's sink, and the Optuna study's mirror) loses none of them."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from orchestrator.store import sqlite_durability as D

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[3]


def _mode(db: Path) -> str:
    con = sqlite3.connect(db)
    try:
        return con.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        con.close()


def test_registered_file_gets_wal_and_normal_until_released(tmp_path):
    db, other = tmp_path / "a.db", tmp_path / "b.db"
    D.register(db)
    try:
        eng, eng_other = create_engine(f"sqlite:///{db}"), create_engine(f"sqlite:///{other}")
        with eng.begin() as c:
            c.execute(text("create table t (x int)"))
            c.execute(text("insert into t values (1)"))
            # 1 = NORMAL (sqlite's default for a connection is 2 = FULL)
            assert c.execute(text("pragma synchronous")).scalar() == 1
            assert c.execute(text("pragma journal_mode")).scalar() == "wal"
        with eng_other.begin() as c:  # an unregistered file keeps sqlite's defaults
            c.execute(text("create table t (x int)"))
            assert c.execute(text("pragma synchronous")).scalar() == 2
            assert c.execute(text("pragma journal_mode")).scalar() == "delete"
        assert (tmp_path / "a.db-wal").exists()
    finally:
        assert D.release(db) is True
    # the writer's pooled connections are closed, the WAL is in the file: a plain database
    assert _mode(db) == "delete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.db", "b.db"]
    assert sqlite3.connect(db).execute("select x from t").fetchall() == [(1,)]
    with eng.begin() as c:  # released: new connections get sqlite's defaults again
        assert c.execute(text("pragma synchronous")).scalar() == 2


def test_release_leaves_wal_while_another_process_holds_the_file(tmp_path):
    """A reader in another process (a `geosweep ui` on the live sweep) keeps the file open:
    release cannot switch the journal back; the file stays WAL, its WAL checkpointed."""
    db = tmp_path / "a.db"
    D.register(db)
    eng = create_engine(f"sqlite:///{db}")
    with eng.begin() as c:
        c.execute(text("create table t (x int)"))
        c.execute(text("insert into t values (7)"))
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]); "
        "c.execute('select count(*) from t').fetchall(); print('open', flush=True); "
        "time.sleep(60)"), str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        assert D.release(db) is False
        assert _mode(db) == "wal"
    finally:
        holder.kill()
        holder.wait(10)
    assert sqlite3.connect(db).execute("select x from t").fetchall() == [(7,)]


def test_forget_leaves_the_file_untouched(tmp_path):
    db = tmp_path / "a.db"
    con = sqlite3.connect(db)
    con.execute("create table t (x int)")
    con.commit()
    con.close()
    before = db.read_bytes()
    D.register(db)
    D.forget(db)
    eng = create_engine(f"sqlite:///{db}")
    with eng.begin() as c:
        assert c.execute(text("pragma journal_mode")).scalar() == "delete"
    eng.dispose()
    assert db.read_bytes() == before and str(db.resolve()) not in D.registered()


# --- kill -9 after the acknowledgement ----------------------------------------------------

MLFLOW_WRITER = r"""
import sys
from orchestrator.store.mlflow import MlflowSink
uri = sys.argv[1]
ml = MlflowSink(uri, "geosweep", "sw")
ml.start_parent("name: sw\n", {"sweep": "sw"}, {})
ml.start_child("t1", {"optim.lr": 1e-3}, {})
for step in range(1, 100000):
    pts = [{"step": step, "split": "train", "metric": "loss", "value": 1.0 / step,
            "wall_time": 0.01 * step}]
    ml.log_result("t1", pts, [({"val/acc": 2.0 / step}, step)])
    print("acked", step, flush=True)  # log_result returned: the commit is acknowledged
"""

STUDY_WRITER = r"""
import sys, optuna
from orchestrator.store.sqlite_durability import register
from orchestrator.sweep.study_mirror import MirroredStorage
db = sys.argv[1]
register(db)
storage = MirroredStorage(f"sqlite:///{db}", "st")
study = optuna.create_study(study_name="st", storage=storage, load_if_exists=True)
for i in range(100000):
    t = study.ask()
    x = t.suggest_float("x", 0.0, 1.0)
    t.report(x, 1)
    study.tell(t, x)
    storage.flush()  # what Tune's experiment snapshot waits for before it is saved
    print("acked", i, flush=True)
"""


def _kill_after(code: str, arg: str, acks: int) -> int:
    """Run ``code``, SIGKILL it right after its ``acks``-th acknowledgement (while it goes on
    writing); returns the last step it acknowledged."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", code, arg], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    last = None
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                pytest.fail(f"the writer ended first: {proc.stderr.read()[-2000:]}")
            if line.startswith("acked"):
                last = int(line.split()[1])
                if last >= acks:
                    os.kill(proc.pid, signal.SIGKILL)
                    break
        else:
            pytest.fail("the writer never acknowledged enough writes")
    finally:
        proc.kill()
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    return last


def test_kill_9_loses_no_acknowledged_mlflow_write(tmp_path):
    db = tmp_path / "mlflow.db"
    last = _kill_after(MLFLOW_WRITER, f"sqlite:///{db}", 40)
    # the store was written in WAL mode and the killed writer never checkpointed it
    assert (tmp_path / "mlflow.db-wal").exists() and _mode(db) == "wal"
    from orchestrator.store.mlflow_names import mlflow_key

    con = sqlite3.connect(db)
    try:
        steps, vals = (sorted(r[0] for r in con.execute(
            "select step from metrics where key = ?", (mlflow_key(k),)))
            for k in ("train/loss", "val/acc"))
    finally:
        con.close()
    assert steps[:last] == list(range(1, last + 1)), (last, steps[-3:])
    assert vals[:last] == list(range(1, last + 1))
    # and MLflow itself reads them back (the next writer: a resumed sweep)
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    run = client.search_runs([client.get_experiment_by_name("geosweep").experiment_id],
                             "tags.`geosweep.trial_id` = 't1'")[0]
    hist = client.get_metric_history(run.info.run_id, mlflow_key("train/loss"))
    assert {m.step for m in hist} >= set(range(1, last + 1))


def test_kill_9_loses_no_flushed_study_write(tmp_path):
    import optuna

    db = tmp_path / "optuna.db"
    last = _kill_after(STUDY_WRITER, str(db), 15)
    assert _mode(db) == "wal"
    study = optuna.load_study(study_name="st", storage=f"sqlite:///{db}")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) >= last + 1
    for t in done[: last + 1]:  # each acknowledged trial whole: param, value, its report
        assert t.value == t.params["x"] and t.intermediate_values == {1: t.value}
    assert [t.number for t in done[: last + 1]] == list(range(last + 1))
