"""Trials of an Optuna study written to its RDB by difference, many in one transaction.

``RDBStorage`` writes one field of one trial per transaction through SQLAlchemy's ORM: a
trial of this project's sweeps is ~7 of them (ask, its params, each report's intermediate
value, the constraint, the tell), 23 CPU-ms a trial on the sweep's driver against 1-2 for
the same rows written here (measured, docs/platform.md). Here a trial's row and its child
rows are written with SQLAlchemy Core on Optuna's own tables and column types
(``optuna.storages._rdb.models``: enum names, datetimes as naive UTC) and Optuna's own
encodings (``value_to_stored_repr``, ``intermediate_value_to_stored_repr``,
``distribution_to_json``, attributes as JSON), so ``RDBStorage`` reads back the trial it was
given. What a trial's state changed since it was last written is what is written: new
intermediate values, a new attribute, the values and the end. Portable SQL only (INSERT,
UPDATE, DELETE by key): the study's RDB may be any Optuna supports.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from optuna.distributions import distribution_to_json
from optuna.storages._rdb import models
from optuna.trial import FrozenTrial
from sqlalchemy import delete, insert, update
from sqlalchemy.engine import Connection, Engine

__all__ = ["write_trials"]

_TRIALS = models.TrialModel.__table__
_PARAMS = models.TrialParamModel.__table__
_VALUES = models.TrialValueModel.__table__
_STEPS = models.TrialIntermediateValueModel.__table__
_USER = models.TrialUserAttributeModel.__table__
_SYSTEM = models.TrialSystemAttributeModel.__table__


def write_trials(engine: Engine, study_id: int,
                 changes: Iterable[tuple[int | None, FrozenTrial | None, FrozenTrial]]
                 ) -> list[int]:
    """Write each ``(rdb_trial_id, last_written, now)`` of RDB study ``study_id`` in one
    transaction: a new trial (``rdb_trial_id`` None) is inserted with ``now.number`` as its
    number (callers pass new trials in number order), an existing one gets what changed since
    ``last_written``. Returns the RDB trial ids, in order."""
    ids: list[int] = []
    with engine.begin() as conn:
        for rid, old, new in changes:
            row = _trial_row(new)
            if rid is None:
                rid = conn.execute(insert(_TRIALS).values(
                    study_id=study_id, number=new.number, **row)).inserted_primary_key[0]
                old = None
            elif old is None or _trial_row(old) != row:
                conn.execute(update(_TRIALS).where(_TRIALS.c.trial_id == rid).values(**row))
            _write_children(conn, rid, old, new)
            ids.append(rid)
    return ids


def _utc(dt: datetime | None) -> datetime | None:
    """A FrozenTrial's naive local datetime as the naive UTC ``TrialModel`` stores."""
    return None if dt is None else dt.astimezone(timezone.utc).replace(tzinfo=None)


def _trial_row(t: FrozenTrial) -> dict[str, Any]:
    return {"state": t.state, "datetime_start": _utc(t.datetime_start),
            "datetime_complete": _utc(t.datetime_complete)}


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN (an intermediate value may be NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _changed(old: Mapping[Any, Any], new: Mapping[Any, Any]) -> tuple[list, list]:
    """(keys whose rows go: changed or gone; keys whose rows come: new or changed)."""
    gone = [k for k, v in old.items() if k not in new or not _same(v, new[k])]
    come = [k for k, v in new.items() if k not in old or not _same(old[k], v)]
    return gone, come


def _write_children(conn: Connection, rid: int, old: FrozenTrial | None,
                    new: FrozenTrial) -> None:
    def params(t: FrozenTrial | None) -> dict[str, tuple[Any, Any]]:
        return {} if t is None else {k: (v, t.distributions[k]) for k, v in t.params.items()}

    gone, come = _changed(params(old), params(new))
    _replace(conn, _PARAMS, _PARAMS.c.param_name, rid, gone, [
        {"param_name": k, "distribution_json": distribution_to_json(new.distributions[k]),
         "param_value": new.distributions[k].to_internal_repr(new.params[k])} for k in come])

    old_values = None if old is None else old.values
    if old_values != new.values:
        conn.execute(delete(_VALUES).where(_VALUES.c.trial_id == rid))
        rows = []
        for objective, v in enumerate(new.values or []):
            stored, kind = models.TrialValueModel.value_to_stored_repr(v)
            rows.append({"trial_id": rid, "objective": objective, "value": stored,
                         "value_type": kind})
        if rows:
            conn.execute(insert(_VALUES), rows)

    gone, come = _changed({} if old is None else old.intermediate_values,
                          new.intermediate_values)
    rows = []
    for step in come:
        stored, kind = models.TrialIntermediateValueModel.intermediate_value_to_stored_repr(
            new.intermediate_values[step])
        rows.append({"step": step, "intermediate_value": stored,
                     "intermediate_value_type": kind})
    _replace(conn, _STEPS, _STEPS.c.step, rid, gone, rows)

    for table, attrs in ((_USER, "user_attrs"), (_SYSTEM, "system_attrs")):
        now = getattr(new, attrs)
        gone, come = _changed({} if old is None else getattr(old, attrs), now)
        _replace(conn, table, table.c.key, rid, gone,
                 [{"key": k, "value_json": json.dumps(now[k])} for k in come])


def _replace(conn: Connection, table: Any, key: Any, rid: int, gone: list,
             rows: list[dict[str, Any]]) -> None:
    """Delete trial ``rid``'s rows of ``table`` whose ``key`` is in ``gone``; insert ``rows``."""
    if gone:
        conn.execute(delete(table).where(table.c.trial_id == rid, key.in_(gone)))
    if rows:
        conn.execute(insert(table), [{"trial_id": rid, **r} for r in rows])
