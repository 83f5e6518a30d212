"""Ray's ``OptunaSearch``, made safe for a resumed driver and truthful to the study.

Resume: after ``kill -9`` of the driver, Tune's last experiment snapshot (saved every ~10 s)
can be older than the Optuna study in ``<sweep>/optuna.db``: a trial the study already holds as
finished is still "running" in the snapshot, so the restored Tune re-starts it and reports for
it, and Ray's ``OptunaSearch.on_trial_result`` then raises ``UpdateFinishedTrialError`` and
stops the whole sweep. Here a result for a finished study trial is ignored (the trial driver
also returns at once for trials the Parquet dataset already holds as finished: trial.py).

Truth (issue 17 §2): Ray tells the study COMPLETE for every trial that ended with a metric, so
optuna-dashboard showed every ASHA-stopped, failed and diverged trial as "Complete". Here the
last result's ``_status`` (orchestrator/sweep/worker.py) decides the state:

- ``diverged``: COMPLETE with the penalty objective and the violated constraint
  ``diverged = 1.0`` (Optuna 5's ``Trial.set_constraint``, which replaced the deprecated
  ``constraints_func``): TPE and GP read ``trial.constraints`` and rank every feasible trial
  above it, and the dashboard marks it infeasible. The penalty value stays, for samplers
  without constraints (and as an ordering among infeasible trials).
- stopped by the scheduler (last ``_status`` is ``running``): PRUNED, with its last value
  reported as an intermediate value (Ray already reports each result).
- error: FAIL. Everything else: COMPLETE, ``diverged = 0.0`` (feasible).

Its study lives in memory and reaches ``<sweep>/optuna.db`` through a writer thread
(orchestrator/sweep/study_mirror.py): ``save``, which Tune's experiment snapshot calls, first
waits until the RDB holds every write so far.
"""

from __future__ import annotations

import logging
from typing import Any

from optuna.trial import TrialState
from ray.tune.search.optuna import OptunaSearch

__all__ = ["ResumableOptunaSearch", "DIVERGED", "study_state"]

log = logging.getLogger(__name__)
DIVERGED = "diverged"  # the Optuna constraint's name; > 0: violated (the trial diverged)


def study_state(result: dict[str, Any] | None, error: bool) -> tuple[TrialState, float]:
    """(Optuna state, diverged flag) of a Tune trial from its last result."""
    if error:
        return TrialState.FAIL, 0.0
    status = (result or {}).get("_status")
    if status == "diverged":
        return TrialState.COMPLETE, 1.0
    if status == "running":  # the trial's loop had not ended: the scheduler stopped it
        return TrialState.PRUNED, 0.0
    return TrialState.COMPLETE, 0.0


class ResumableOptunaSearch(OptunaSearch):
    # ``_live``: trials this searcher saw unfinished in the study. Only its own ``tell``
    # finishes them (one driver per sweep), so the study is read once per trial, not once
    # per result (an RDB query on Tune's event loop). Never saved with the searcher: a
    # resumed driver reads the study again.
    _LIVE = "_live"

    def _finished(self, trial_id: str) -> bool:
        live = self.__dict__.setdefault(self._LIVE, set())
        if trial_id in live:
            return False
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None:
            return False
        frozen = self._ot_study._storage.get_trial(ot_trial._trial_id)
        if frozen.state.is_finished():
            return True
        live.add(trial_id)
        return False

    def save(self, checkpoint_path: str) -> None:
        flush = getattr(self._ot_study._storage, "flush", None)
        if flush is not None:  # the RDB is never behind the snapshot (study_mirror.py)
            flush()
        live = self.__dict__.pop(self._LIVE, None)
        try:
            super().save(checkpoint_path)
        finally:
            if live is not None:
                self.__dict__[self._LIVE] = live

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if self._finished(trial_id):
            return
        super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                          error: bool = False) -> None:
        if (trial_id in self._completed_trials or trial_id not in self._ot_trials
                or isinstance(self.metric, list)):
            super().on_trial_complete(trial_id, result, error)
            return
        if self._finished(trial_id):  # a resumed driver: the study already holds it
            self._completed_trials.add(trial_id)
            return
        self.__dict__.get(self._LIVE, set()).discard(trial_id)  # told below: finished
        ot_trial = self._ot_trials[trial_id]
        state, diverged = study_state(result, error)
        value = (result or {}).get(self.metric)
        if state == TrialState.COMPLETE and value is None:
            state = TrialState.FAIL  # nothing to tell: Optuna refuses COMPLETE without a value
        try:
            if state == TrialState.COMPLETE:
                ot_trial.set_constraint(DIVERGED, diverged)
                self._ot_study.tell(ot_trial, float(value), state=state)
            else:
                self._ot_study.tell(ot_trial, state=state)
        except Exception as exc:  # e.g. a nan value; Ray's own behaviour is to log it
            log.warning("optuna tell of trial %s failed: %s", trial_id, exc)
        self._completed_trials.add(trial_id)
