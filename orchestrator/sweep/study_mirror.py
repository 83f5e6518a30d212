"""The sweep's Optuna study in memory, its trials written to its RDB by a thread.

Tune's event loop calls the searcher between a trial's report and the moment that trial (and
every other one) may go on: Ray's ``OptunaSearch`` on an RDB pays a sqlite transaction there
per result (``Trial.report``), several per finished trial (``tell``) and per new trial
(``ask``: ~35 CPU-ms a trial on this project's machines, against 1.5 in memory, WAL included).
Here the study the searcher and its sampler work on is an ``InMemoryStorage`` (what raw Tune's
``OptunaSearch`` uses); the sampler sees exactly what it saw before, every trial of the study,
in memory. Study writes are replayed on ``<sweep>/optuna.db`` by a ``SerialWriter`` in their
order; a trial's writes are not replayed one by one (each was an ORM transaction, ~3 CPU-ms on
the driver): when a trial finishes, and at every flush, the writer writes what changed in each
trial since it last wrote it, all in one transaction (``study_rows.write_trials``), new trials
in number order, so the RDB's trial numbers are memory's.

What the RDB holds, and when (docs/reliability.md):
- ``flush()`` returns once every write so far is in the RDB (a running trial's reports reach
  it there or when the trial finishes, whichever is first). The searcher's ``save`` (Tune's
  experiment snapshot) flushes first, so the RDB is never behind a snapshot a resumed driver
  restores; the sweep flushes at its end (``orchestrator.sweep.writer.flush_all``).
- a ``kill -9`` loses the writes after the last snapshot that the thread had not made: the
  same trials Tune's restored snapshot does not hold as finished either, which the resumed
  driver runs (or re-finalises) again, and tells again.
- unpickled (Tune restores its searcher), the memory is rebuilt from the RDB: the study as
  the snapshot left it, plus whatever the thread wrote after it. The RDB a restored study
  opens is the one this driver names for the study (``use_rdb``), so a moved or copied sweep
  folder writes its own ``optuna.db``, not the original's.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.exceptions import DuplicatedStudyError
from optuna.storages import InMemoryStorage, RDBStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from orchestrator.sweep.study_rows import write_trials
from orchestrator.sweep.writer import SerialWriter, flush_at_end

__all__ = ["MirroredStorage", "use_rdb"]

_RDB_OF: dict[str, str] = {}  # study name -> the RDB URL this driver keeps it in
_LOCK = threading.Lock()


def use_rdb(study_name: str, url: str) -> None:
    """The RDB of ``study_name`` for studies restored from a pickle in this process."""
    with _LOCK:
        _RDB_OF[study_name] = url


class MirroredStorage(InMemoryStorage):
    """An ``InMemoryStorage`` of one study whose writes are replayed on ``rdb``."""

    def __init__(self, rdb: RDBStorage | str, study_name: str) -> None:
        super().__init__()
        self._rdb = RDBStorage(rdb) if isinstance(rdb, str) else rdb
        self._name = study_name
        self._writer = SerialWriter("geosweep-study")
        self._rdb_study: dict[int, int] = {}  # memory study id -> RDB study id
        self._rdb_trial: dict[int, int] = {}  # memory trial id -> RDB trial id (writer only)
        self._written: dict[int, FrozenTrial] = {}  # the state the RDB holds (writer only)
        self._dirty: dict[int, None] = {}  # trials changed since written, in change order
        self._drain_queued = False
        self._dirty_lock = threading.Lock()
        self._load()
        flush_at_end(self)  # the sweep's end writes the trials still held back

    # --- the RDB's study, copied into memory -------------------------------------------------
    def _load(self) -> None:
        try:
            sid = self._rdb.get_study_id_from_name(self._name)
        except KeyError:
            return  # a new study: create_study makes it (here and, replayed, in the RDB)
        mem = super().create_new_study(self._rdb.get_study_directions(sid), self._name)
        self._rdb_study[mem] = sid
        for k, v in self._rdb.get_study_user_attrs(sid).items():
            super().set_study_user_attr(mem, k, v)
        for k, v in self._rdb.get_study_system_attrs(sid).items():
            super().set_study_system_attr(mem, k, v)
        for t in self._rdb.get_all_trials(sid, deepcopy=False):  # in number order
            tid = super().create_new_trial(mem, template_trial=t)
            self._rdb_trial[tid], self._written[tid] = t._trial_id, t

    def flush(self) -> None:
        """Wait until the RDB holds every write so far (raises the first replay error)."""
        with self._dirty_lock:
            self._drain_queued = True
        self._writer.submit(self._drain)
        self._writer.flush()

    def __getstate__(self) -> dict[str, Any]:
        self.flush()
        return {"url": self._rdb.url, "engine_kwargs": self._rdb.engine_kwargs,
                "name": self._name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        with _LOCK:
            url = _RDB_OF.get(state["name"], state["url"])
        self.__init__(RDBStorage(url, engine_kwargs=state.get("engine_kwargs")), state["name"])

    # --- writes: memory now, the RDB on the writer thread -------------------------------------
    def create_new_study(self, directions: Any, study_name: str | None = None) -> int:
        sid = super().create_new_study(directions, study_name)
        name = self.get_study_name_from_id(sid)
        self._writer.submit(self._replay_study, sid, list(directions), name)
        return sid

    def _replay_study(self, sid: int, directions: list[StudyDirection], name: str) -> None:
        try:
            self._rdb_study[sid] = self._rdb.create_new_study(directions, name)
        except DuplicatedStudyError:
            self._rdb_study[sid] = self._rdb.get_study_id_from_name(name)

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        super().set_study_user_attr(study_id, key, value)
        self._writer.submit(lambda: self._rdb.set_study_user_attr(
            self._rdb_study[study_id], key, value))

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        super().set_study_system_attr(study_id, key, value)
        self._writer.submit(lambda: self._rdb.set_study_system_attr(
            self._rdb_study[study_id], key, value))

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        tid = super().create_new_trial(study_id, template_trial)
        self._changed(tid, template_trial is not None and template_trial.state.is_finished())
        return tid

    def set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                        distribution: BaseDistribution) -> None:
        super().set_trial_param(trial_id, param_name, param_value_internal, distribution)
        self._changed(trial_id)

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Any = None) -> bool:
        done = super().set_trial_state_values(trial_id, state, values)
        if done:
            self._changed(trial_id, state.is_finished())
        return done

    def set_trial_intermediate_value(self, trial_id: int, step: int,
                                     intermediate_value: float) -> None:
        super().set_trial_intermediate_value(trial_id, step, intermediate_value)
        self._changed(trial_id)

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        super().set_trial_user_attr(trial_id, key, value)
        self._changed(trial_id)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        super().set_trial_system_attr(trial_id, key, value)
        self._changed(trial_id)

    # --- trials: what changed, written together ----------------------------------------------
    def _changed(self, trial_id: int, finished: bool = False) -> None:
        """Trial ``trial_id`` changed in memory. Its rows are written when a trial finishes
        or the RDB is flushed (Tune's snapshot, the sweep's end), each trial's changes since
        its last write in one transaction for all of them (study_rows.py)."""
        with self._dirty_lock:
            self._dirty[trial_id] = None
            if not finished or self._drain_queued:
                return
            self._drain_queued = True
        self._writer.submit(self._drain)

    def _drain(self) -> None:
        with self._dirty_lock:
            tids, self._dirty, self._drain_queued = sorted(self._dirty), {}, False
        if not tids:
            return
        # a copy, under memory's lock: optuna's Trial edits the FrozenTrial memory handed it
        # in place (its cached params), so a reference kept as "last written" would change
        with self._lock:
            now = {tid: (self._trial_id_to_study_id_and_number[tid][0],
                         copy.deepcopy(self._get_trial(tid))) for tid in tids}
        by_study: dict[int, list[int]] = {}
        for tid in tids:  # memory ids grow with numbers: new trials go in number order
            by_study.setdefault(now[tid][0], []).append(tid)
        try:
            for sid, group in by_study.items():
                ids = write_trials(self._rdb.engine, self._rdb_study[sid], [
                    (self._rdb_trial.get(t), self._written.get(t), now[t][1]) for t in group])
                for t, rid in zip(group, ids):
                    self._rdb_trial[t], self._written[t] = rid, now[t][1]
        except BaseException:
            with self._dirty_lock:  # written again by the next drain (a flush raises this)
                for tid in tids:
                    self._dirty[tid] = None
            raise
