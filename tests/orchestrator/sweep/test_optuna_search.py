"""ResumableOptunaSearch reads the study once per trial, not once per result (no Ray)."""

from __future__ import annotations

import os

import optuna
import pytest
from optuna.distributions import FloatDistribution

from orchestrator.sweep.optuna_search import ResumableOptunaSearch

pytestmark = pytest.mark.timeout(60)


def _search(storage) -> ResumableOptunaSearch:
    s = ResumableOptunaSearch(space={"lr": FloatDistribution(1e-4, 1e-1, log=True)},
                              metric="objective", mode="min", storage=storage,
                              study_name="s", seed=0)
    return s


def _counting(storage, monkeypatch) -> list[int]:
    calls = []
    real = storage.get_trial
    monkeypatch.setattr(storage, "get_trial", lambda tid: calls.append(tid) or real(tid))
    return calls


def test_study_read_once_per_trial_and_never_saved(tmp_path, monkeypatch):
    storage = optuna.storages.InMemoryStorage()
    s = _search(storage)
    assert s.suggest("t1") is not None
    calls = _counting(storage, monkeypatch)
    for step in (1, 2, 3):
        s.on_trial_result("t1", {"objective": 1.0 / step, "training_iteration": step})
    assert len(calls) == 1  # the first result only
    monkeypatch.undo()
    frozen = storage.get_trial(s._ot_trials["t1"]._trial_id)
    assert sorted(frozen.intermediate_values) == [1, 2, 3]
    s.save(str(tmp_path / "ckpt.pkl"))  # what Tune snapshots: no memo of live trials
    restored = _search(optuna.storages.InMemoryStorage())
    restored.restore(str(tmp_path / "ckpt.pkl"))
    assert "_live" not in restored.__dict__ and "t1" in s.__dict__["_live"]
    s.on_trial_complete("t1", {"objective": 0.3, "_status": "completed"})
    assert "t1" not in s.__dict__["_live"]
    frozen = storage.get_trial(s._ot_trials["t1"]._trial_id)
    assert frozen.state == optuna.trial.TrialState.COMPLETE and frozen.value == 0.3


def test_result_for_a_trial_the_study_finished_is_ignored(tmp_path):
    """A resumed driver: Tune re-runs a trial whose study trial an earlier driver finished."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{os.path.join(tmp_path, 'o.db')}")
    s = _search(storage)
    s.suggest("t1")
    s.on_trial_result("t1", {"objective": 1.0, "training_iteration": 1})
    ckpt = str(tmp_path / "ckpt.pkl")
    s.save(ckpt)
    s.on_trial_complete("t1", {"objective": 0.5, "_status": "completed"})
    again = _search(storage)
    again.restore(ckpt)  # its snapshot still has t1 running
    again.on_trial_result("t1", {"objective": 9.0, "training_iteration": 2})  # no raise
    again.on_trial_complete("t1", {"objective": 9.0, "_status": "completed"})
    frozen = storage.get_trial(s._ot_trials["t1"]._trial_id)
    assert frozen.value == 0.5 and sorted(frozen.intermediate_values) == [1]
