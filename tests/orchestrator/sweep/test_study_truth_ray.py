"""A small real Optuna sweep (Ray) with a deterministically diverging arm (issue 17 §2): the
study holds every trial at lr = 1e30 (NaN at step 2 by construction: test_nan_storm.py) as
COMPLETE with the violated constraint ``diverged``, every healthy trial as feasible."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]

# search.seed 0: the first two asks (before any tell; max_concurrent 2) are the TPE's random
# start-up draws, lr 1e30 then 1e-3, so both classes are in the study whatever the timing.
SPEC = """
name: truth
workload:
  preset: gpt-debug
  overrides: {optim.grad_clip: 0.0, optim.warmup_steps: 4}
space:
  optim.lr: {choice: [1.0e-3, 1.0e30]}
seeds: [0]
search: {algorithm: optuna-tpe, num_samples: 4, max_concurrent: 2, seed: 0}
budget: {steps: 4, eval_every: 2, metrics_every: 0}
resources: {workers_per_trial: 1, cpus_per_worker: 1}
"""


@pytest.mark.timeout(900)
def test_diverged_trials_violate_the_constraint(tmp_path):
    import optuna

    from orchestrator.store.parquet import read_trials

    spec = tmp_path / "truth.yaml"
    spec.write_text(SPEC)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(spec), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=840,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    root = tmp_path / "out" / "truth"
    trials = read_trials(str(root / "parquet"), sweep="truth")
    status = dict(zip(trials["optim.lr"].astype(float), trials["status"]))
    assert set(trials.loc[trials["optim.lr"] > 1, "status"]) == {"diverged"}, status
    assert set(trials.loc[trials["optim.lr"] < 1, "status"]) == {"completed"}, status
    study = optuna.load_study(study_name="truth", storage=f"sqlite:///{root / 'optuna.db'}")
    got = [(t.params["trial/optim.lr"], t.state, t.constraints) for t in study.trials]
    assert len(got) == 4 and {lr for lr, _, _ in got} == {1e-3, 1e30}, got
    for lr, state, con in got:
        assert state == optuna.trial.TrialState.COMPLETE, got
        assert con == {"diverged": 1.0 if lr > 1 else 0.0}, got
    assert study.best_trial.params["trial/optim.lr"] == 1e-3
