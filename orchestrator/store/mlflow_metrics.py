"""Runs, metric points, params, tags and a run's end into the sweep's own sqlite MLflow store,
the rows MLflow's ``create_run``, ``log_batch`` and ``set_terminated`` write, without its ORM.

Why: a sweep logs every training step's curve (train loss, grad norm, lr: 3 points a step).
Through ``MlflowClient.log_batch`` each point is an ORM object, and the latest value of each
key an ORM read-modify-write: ~0.2 ms of driver CPU a point, ~0.25 CPU-s for a 400-step trial,
the largest part of what a sweep's driver spent per trial. Here the same rows go in with two
``executemany`` calls in one transaction. A trial's run, its params and tags (at its start)
and its final tags with its end (status, end time) cost ~13, ~8 and ~19 CPU-ms through
MLflow's client (measured, 2-core machine), ~1 each here: one transaction each.

The rows are MLflow's own (``SqlAlchemyStore``): ``metrics`` gets one row per point (NaN stored
as 0 with ``is_nan``, +-inf as +-max float; a row equal to one already there is skipped, as
MLflow's primary-key recovery does), ``latest_metrics`` keeps per key the point with the
highest ``(step, timestamp, value)``; ``params`` gets the new keys (a key already there with
another value is refused, as MLflow refuses it; with the same value it is skipped), ``tags``
is set key by key (``mlflow.runName`` renames the run too, as ``set_tag`` does), both
validated and truncated by MLflow's own validation; an end sets ``runs.status`` and
``end_time`` (``update_run_info``). The run must be active (a new one: its experiment).
Used only on a store whose tables have exactly the columns written here (``open``): any other
schema goes through MLflow. tests/orchestrator/store/test_mlflow_metrics.py checks row for row
against MLflow's ``create_run``, ``log_batch`` and ``set_terminated`` on the same input.
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from orchestrator.store.sqlite_durability import PRAGMAS, registered

__all__ = ["SqliteMetrics"]

_COLUMNS = {
    "metrics": ["key", "value", "timestamp", "run_uuid", "step", "is_nan"],
    "latest_metrics": ["key", "value", "timestamp", "step", "is_nan", "run_uuid"],
    "params": ["key", "value", "run_uuid"],
    "tags": ["key", "value", "run_uuid"],
}
# the columns of ``runs`` (exactly these: a run is created here with every one of them)
_RUN_COLUMNS = {"run_uuid", "name", "source_type", "source_name", "entry_point_name", "user_id",
                "status", "start_time", "end_time", "source_version", "lifecycle_stage",
                "artifact_uri", "experiment_id", "deleted_time"}
_RUN_NAME = "mlflow.runName"
_MAX_FLOAT = 1.7976931348623157e308
_CHUNK = 500  # keys per IN (...) query


def _sanitize(value: float) -> tuple[float, int]:
    """(stored value, is_nan) as MLflow's ``sanitize_metric_value``."""
    if math.isnan(value):
        return 0.0, 1
    if math.isinf(value):
        return (_MAX_FLOAT if value > 0 else -_MAX_FLOAT), 0
    return float(value), 0


class SqliteMetrics:
    """One sqlite connection that logs metric points of a store's runs."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self._con = con

    @classmethod
    def open(cls, db_path: str) -> SqliteMetrics | None:
        """A writer for the store at ``db_path``, or None when its metric tables are not the
        ones this writes (MLflow's own ``log_batch`` is used then)."""
        try:
            con = sqlite3.connect(db_path, timeout=30.0, isolation_level=None,
                                  check_same_thread=False)
        except sqlite3.Error:
            return None
        try:
            for table, cols in _COLUMNS.items():
                got = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
                if got != cols:
                    con.close()
                    return None
            have = {r[1] for r in con.execute("PRAGMA table_info(runs)")}
            exp = {r[1] for r in con.execute("PRAGMA table_info(experiments)")}
            if not (have == _RUN_COLUMNS and {"experiment_id", "artifact_location",
                                               "lifecycle_stage"} <= exp):
                con.close()
                return None
            # the sweep's writer: the same settings as MLflow's connections to this file
            # (store/sqlite_durability.py)
            if os.path.realpath(db_path) in registered():
                for name, value in PRAGMAS:
                    con.execute(f"PRAGMA {name}={value}")
        except sqlite3.Error:
            con.close()
            return None
        return cls(con)

    def close(self) -> None:
        self._con.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed when the block ends, rolled back if it raises."""
        con = self._con
        con.execute("BEGIN IMMEDIATE")
        try:
            yield con
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def create_run(self, experiment_id: str, run_name: str, tags: dict[str, str],
                   start_time: int | None = None) -> tuple[str, int]:
        """A RUNNING run of the active experiment ``experiment_id`` with ``tags`` (plus
        ``mlflow.runName``), the row MLflow's ``create_run`` makes (its artifact URI under the
        experiment's artifact location, user from ``mlflow.user`` or "unknown", source
        UNKNOWN); returns (run id, start time in ms)."""
        import uuid

        from mlflow.entities import RunTag
        from mlflow.exceptions import MlflowException
        from mlflow.utils.uri import append_to_uri_path
        from mlflow.utils.validation import _validate_batch_log_data

        tags = {**tags, _RUN_NAME: tags.get(_RUN_NAME, run_name)}
        _, _, checked = _validate_batch_log_data([], [], [RunTag(k, v) for k, v in tags.items()])
        run_id = uuid.uuid4().hex
        start = int(time.time() * 1000) if start_time is None else int(start_time)
        with self._transaction() as con:
            exp = con.execute("SELECT artifact_location, lifecycle_stage FROM experiments "
                              "WHERE experiment_id = ?", (int(experiment_id),)).fetchone()
            if exp is None or exp[1] != "active":
                raise MlflowException(f"The experiment {experiment_id} must be in the "
                                      f"'active' state.")
            con.execute(
                "INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, "
                "user_id, status, start_time, end_time, source_version, lifecycle_stage, "
                "artifact_uri, experiment_id, deleted_time) VALUES (?, ?, 'UNKNOWN', '', '', "
                "?, 'RUNNING', ?, NULL, '', 'active', ?, ?, NULL)",
                (run_id, tags[_RUN_NAME], tags.get("mlflow.user", "unknown"), start,
                 append_to_uri_path(exp[0], run_id, "artifacts"), int(experiment_id)))
            con.executemany("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)",
                            [(t.key, t.value, run_id) for t in checked])
        return run_id, start

    def write(self, run_id: str, metrics: Iterable[Any] = (), params: Iterable[Any] = (),
              tags: Iterable[Any] = (), end: tuple[str, int] | None = None) -> None:
        """Log ``metrics`` (``mlflow.entities.Metric`` or (key, value, timestamp, step)),
        ``params`` (``Param``) and ``tags`` (``RunTag``) of the run ``run_id``, and with
        ``end`` = (status, end time in ms) terminate it, in one transaction."""
        # MLflow's own checks (names, lengths, truncation, one value per param key)
        from mlflow.utils.validation import _validate_batch_log_data, _validate_param_keys_unique

        _, params, tags = _validate_batch_log_data([], list(params), list(tags))
        _validate_param_keys_unique(params)
        rows: dict[tuple, None] = {}  # MLflow drops equal points of one batch
        for m in metrics:
            key, value, ts, step = m if isinstance(m, tuple) else (m.key, m.value, m.timestamp,
                                                                    m.step)
            value = float(value)
            if value - value == 0.0:  # finite (the common case: no call)
                rows[(key, value, int(ts), run_id, int(step), 0)] = None
            else:
                value, is_nan = _sanitize(value)
                rows[(key, value, int(ts), run_id, int(step), is_nan)] = None
        if not (rows or params or tags or end):
            return
        with self._transaction() as con:
            stage = con.execute("SELECT lifecycle_stage FROM runs WHERE run_uuid = ?",
                                (run_id,)).fetchone()
            if stage is None or stage[0] != "active":
                raise RuntimeError(f"MLflow run {run_id}: not an active run "
                                   f"({stage[0] if stage else 'not found'})")
            if params:
                self._params(run_id, params)
            if rows:
                con.executemany("INSERT OR IGNORE INTO metrics (key, value, timestamp, "
                                "run_uuid, step, is_nan) VALUES (?, ?, ?, ?, ?, ?)", list(rows))
                con.executemany("INSERT OR REPLACE INTO latest_metrics (key, value, "
                                "timestamp, step, is_nan, run_uuid) VALUES (?, ?, ?, ?, ?, ?)",
                                self._latest(run_id, rows))
            last = {t.key: t.value for t in tags}  # the last value of a repeated key wins
            con.executemany("INSERT OR REPLACE INTO tags (key, value, run_uuid) VALUES (?, ?, ?)",
                            [(k, v, run_id) for k, v in last.items()])
            if _RUN_NAME in last:
                con.execute("UPDATE runs SET name = ? WHERE run_uuid = ?",
                            (last[_RUN_NAME], run_id))
            if end is not None:
                con.execute("UPDATE runs SET status = ?, end_time = ? WHERE run_uuid = ?",
                            (end[0], int(end[1]), run_id))

    def _params(self, run_id: str, params: list[Any]) -> None:
        """Insert the new ``params``; one already there with another value: MLflow's error."""
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

        new = {p.key: p.value for p in params}  # unique keys (write checked)
        keys = sorted(new)
        have: dict[str, str] = {}
        for i in range(0, len(keys), _CHUNK):
            part = keys[i:i + _CHUNK]
            marks = ",".join("?" * len(part))
            have.update(self._con.execute(
                f"SELECT key, value FROM params WHERE run_uuid = ? AND key IN ({marks})",
                (run_id, *part)).fetchall())
        clash = [{"key": k, "old_value": have[k], "new_value": new[k]}
                 for k in keys if k in have and have[k] != new[k]]
        if clash:
            raise MlflowException("Changing param values is not allowed. Params were already"
                                  f" logged='{clash}' for run ID='{run_id}'.",
                                  INVALID_PARAMETER_VALUE)
        self._con.executemany("INSERT INTO params (key, value, run_uuid) VALUES (?, ?, ?)",
                              [(k, new[k], run_id) for k in keys if k not in have])

    def _latest(self, run_id: str, rows: dict[tuple, None]) -> list[tuple]:
        """The ``latest_metrics`` rows that change: per key the newest point by ``(step,
        timestamp, value)``, where it is newer than the stored one."""
        best: dict[str, tuple] = {}
        for key, value, ts, _, step, is_nan in rows:
            cand = (step, ts, value, is_nan)
            if key not in best or cand[:3] > best[key][:3]:
                best[key] = cand
        keys = sorted(best)
        stored: dict[str, tuple] = {}
        for i in range(0, len(keys), _CHUNK):
            part = keys[i:i + _CHUNK]
            marks = ",".join("?" * len(part))
            for key, value, ts, step in self._con.execute(
                    f"SELECT key, value, timestamp, step FROM latest_metrics WHERE run_uuid = ? "
                    f"AND key IN ({marks})", (run_id, *part)):
                stored[key] = (step, -1 if ts is None else ts, value)
        out = []
        for key in keys:
            step, ts, value, is_nan = best[key]
            old = stored.get(key)
            if old is None or (step, ts, value) > old:
                out.append((key, value, ts, step, is_nan, run_id))
        return out
