"""The progress line of a resumed sweep: trials over before this driver started count as done
and in the best value, not in the rate (orchestrator/sweep/progress.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.sweep.progress import eta_seconds, make_progress


def test_eta_leaves_the_trials_done_before_out_of_the_rate():
    # 10 trials of 100 steps; 5 were over before this driver; in 20 s of its work one more
    # ended and two run at step 50: 200 steps in 20 s, 10 steps/s, 300 steps left
    ended = {"a", "b", "c", "d", "e", "f"}
    reached = {"f": 100, "g": 50, "h": 50}
    before = {"a", "b", "c", "d", "e"}
    assert eta_seconds(10, 100, reached, ended, 20.0, before) == pytest.approx(30.0)
    # without ``before`` the 500 earlier steps would make it 3.5x too fast
    assert eta_seconds(10, 100, reached, ended, 20.0) == pytest.approx(300 / 35.0)
    assert eta_seconds(10, 100, {}, before, 20.0, before) is None  # nothing done here yet


def _trial(tid: str, status: str, result: dict | None = None):
    return SimpleNamespace(trial_id=tid, status=status, last_result=result or {})


def test_a_resumed_sweep_shows_its_earlier_best_and_divergences():
    lines: list[str] = []
    cb = make_progress()(6, "val/loss", "min", every_s=0.0, printer=lines.append)
    trials = [_trial("a", "TERMINATED", {"val/loss": 1.79, "_budget": 100, "step": 100}),
              _trial("b", "TERMINATED", {"val/loss": 9.9, "_status": "diverged"}),
              _trial("c", "PENDING"), _trial("d", "PENDING")]
    cb.on_step_begin(0, trials)
    cb.on_step_end(0, trials)
    assert "2/6 done" in lines[-1] and "1 diverged" in lines[-1]
    assert "best val/loss 1.7900" in lines[-1]
    assert "ETA ?" in lines[-1]  # no step of this driver's yet: no rate
    # a trial that ends later in this driver is not one of the earlier ones
    trials[2] = _trial("c", "RUNNING")
    cb.on_trial_result(1, trials, trials[2], {"val/loss": 1.5, "step": 50, "_budget": 100})
    trials[2] = _trial("c", "TERMINATED", {"val/loss": 1.5})
    cb.on_step_end(2, trials)
    assert cb.before == {"a", "b"}
    assert "3/6 done" in lines[-1] and "best val/loss 1.5000" in lines[-1]
