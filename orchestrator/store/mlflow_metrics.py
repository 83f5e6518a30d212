"""Metric points into the sweep's own sqlite MLflow store, the rows MLflow's ``log_batch``
writes, without its ORM.

Why: a sweep logs every training step's curve (train loss, grad norm, lr: 3 points a step).
Through ``MlflowClient.log_batch`` each point is an ORM object, and the latest value of each
key an ORM read-modify-write: ~0.2 ms of driver CPU a point, ~0.25 CPU-s for a 400-step trial,
the largest part of what a sweep's driver spent per trial. Here the same rows go in with two
``executemany`` calls in one transaction.

The rows are MLflow's own (``SqlAlchemyStore._log_metrics``): ``metrics`` gets one row per
point (NaN stored as 0 with ``is_nan``, +-inf as +-max float; a row equal to one already there
is skipped, as MLflow's primary-key recovery does), ``latest_metrics`` keeps per key the point
with the highest ``(step, timestamp, value)``; the run must be active. Used only on a store
whose two tables have exactly the columns written here (``open``): any other schema goes
through MLflow. tests/orchestrator/store/test_mlflow_metrics.py checks row for row against
MLflow's ``log_batch`` on the same points.
"""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Iterable
from typing import Any

from orchestrator.store.sqlite_durability import PRAGMAS, registered

__all__ = ["SqliteMetrics"]

_COLUMNS = {
    "metrics": ["key", "value", "timestamp", "run_uuid", "step", "is_nan"],
    "latest_metrics": ["key", "value", "timestamp", "step", "is_nan", "run_uuid"],
}
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

    def write(self, run_id: str, metrics: Iterable[Any]) -> None:
        """Log ``metrics`` (``mlflow.entities.Metric``: key, value, timestamp, step) of the run
        ``run_id`` in one transaction."""
        rows: dict[tuple, None] = {}  # MLflow drops equal points of one batch
        for m in metrics:
            value, is_nan = _sanitize(float(m.value))
            rows[(m.key, value, int(m.timestamp), run_id, int(m.step), is_nan)] = None
        if not rows:
            return
        con = self._con
        con.execute("BEGIN IMMEDIATE")
        try:
            stage = con.execute("SELECT lifecycle_stage FROM runs WHERE run_uuid = ?",
                                (run_id,)).fetchone()
            if stage is None or stage[0] != "active":
                raise RuntimeError(f"MLflow run {run_id}: not an active run "
                                   f"({stage[0] if stage else 'not found'})")
            con.executemany("INSERT OR IGNORE INTO metrics (key, value, timestamp, run_uuid, "
                            "step, is_nan) VALUES (?, ?, ?, ?, ?, ?)", list(rows))
            con.executemany("INSERT OR REPLACE INTO latest_metrics (key, value, timestamp, "
                            "step, is_nan, run_uuid) VALUES (?, ?, ?, ?, ?, ?)",
                            self._latest(run_id, rows))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

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
