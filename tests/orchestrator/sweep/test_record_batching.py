"""The background sink's trial records: written at a trial's start and end; a result's
refresh waits up to ``batch_s`` for a later one or the trial's end (sweep/callback.py)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from orchestrator.store.parquet import ParquetSink, read_trials
from orchestrator.sweep.callback import SinkCallback

pytestmark = pytest.mark.timeout(120)


class Counting(ParquetSink):
    """Remembers every record it was asked to write: (trial, status, last_step)."""

    def __init__(self, root: str) -> None:
        super().__init__(root, "s")
        self.writes: list[tuple[str, str, int | None]] = []

    def write_trial(self, record: dict) -> bool:
        self.writes.append((record["trial"], record["status"], record.get("last_step")))
        return super().write_trial(record)


def _trial(tid: str = "t1") -> SimpleNamespace:
    return SimpleNamespace(trial_id=tid, config={"optim.lr": 1e-3, "train.seed": 0})


def _result(last: int, status: str = "running") -> dict:
    curve = [{"step": s, "split": "train", "metric": "loss", "value": 1.0 / s,
              "wall_time": 0.1 * s} for s in range(last - 9, last + 1)]
    return {"step": last, "val/loss": 1.0 / last, "train/loss": 1.0 / last, "_curve": curve,
            "_status": status, "_timing": {"train_s": 1.0, "setup_s": 0.5}}


def _sink(tmp_path, batch_s: float) -> tuple[SinkCallback, Counting]:
    pq = Counting(str(tmp_path))
    return SinkCallback(parquet=pq, sweep="s", background=True, batch_s=batch_s), pq


def _step(cb: SinkCallback) -> None:
    """Wait until the writer has taken every event so far (as Tune's snapshot does)."""
    cb.get_state()


def test_refreshes_wait_for_the_trials_end(tmp_path):
    """A trial whose results all come within batch_s: its start and its end are written, the
    refreshes in between not (the end replaces them); the end's record is the whole one."""
    cb, pq = _sink(tmp_path, batch_s=3600)
    t = _trial()
    cb.on_trial_start(0, [], t)
    _step(cb)
    for last, status in ((10, "running"), (20, "running"), (30, "completed")):
        cb.on_trial_result(0, [], t, _result(last, status))
        _step(cb)
    assert pq.writes == [("t1", "running", None)]
    cb.on_trial_complete(0, [], t)
    cb.flush()
    assert pq.writes == [("t1", "running", None), ("t1", "completed", 30)]
    rec = read_trials(str(tmp_path), sweep="s").iloc[0]
    assert rec["status"] == "completed" and rec["last_step"] == 30 and rec["wall_s"] > 0


def test_a_waiting_refresh_is_written_by_flush_not_by_a_snapshot(tmp_path):
    """Tune's snapshot (get_state) does not write a waiting refresh (a restored trial
    re-reports from its checkpoint); flush writes it, once, with the latest values."""
    cb, pq = _sink(tmp_path, batch_s=3600)
    t = _trial()
    cb.on_trial_start(0, [], t)
    _step(cb)
    cb.on_trial_result(0, [], t, _result(10))
    cb.on_trial_result(0, [], t, _result(20))
    _step(cb)
    assert read_trials(str(tmp_path), sweep="s").iloc[0]["status"] == "running"
    assert pq.writes == [("t1", "running", None)]
    cb.flush()
    assert pq.writes == [("t1", "running", None), ("t1", "running", 20)]
    assert read_trials(str(tmp_path), sweep="s").iloc[0]["last_step"] == 20
    cb.flush()  # nothing waits any more
    assert len(pq.writes) == 2


def test_a_due_refresh_is_written_at_once(tmp_path):
    """batch_s=0: every refresh is due when its result is taken: each result's record is
    written, as the foreground sink writes them."""
    cb, pq = _sink(tmp_path, batch_s=0)
    t = _trial()
    cb.on_trial_start(0, [], t)
    _step(cb)
    for last in (10, 20):
        cb.on_trial_result(0, [], t, _result(last))
        _step(cb)
    cb.on_trial_complete(0, [], t)
    cb.flush()
    assert pq.writes == [("t1", "running", None), ("t1", "running", 10),
                         ("t1", "running", 20), ("t1", "stopped", 20)]


def test_a_trials_first_record_never_waits(tmp_path):
    """A trial this driver has written nothing of (its start was coalesced into a queued
    result, or a resumed trial's first event is a result) is written at once."""
    cb, pq = _sink(tmp_path, batch_s=3600)
    t = _trial("t2")
    cb.on_trial_result(0, [], t, _result(10))
    _step(cb)
    assert pq.writes == [("t2", "running", 10)]
    cb.on_trial_result(0, [], t, _result(20))  # the second one waits
    _step(cb)
    assert len(pq.writes) == 1


def test_the_idle_writer_writes_a_refresh_once_it_is_due(tmp_path):
    """With no later event, a refresh is written once it has waited batch_s (the writer
    wakes for it): a running trial's record is at most batch_s late."""
    cb, pq = _sink(tmp_path, batch_s=0.05)
    t = _trial()
    cb.on_trial_start(0, [], t)
    _step(cb)
    cb.on_trial_result(0, [], t, _result(10))
    deadline = time.monotonic() + 60  # a bound on a busy machine, not a timing claim
    while len(pq.writes) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pq.writes == [("t1", "running", None), ("t1", "running", 10)]
    cb.flush()
    assert len(pq.writes) == 2
