"""`seeds: auto` runs its rounds on one Ray (issue 32 §3): the first round starts a local Ray,
every later round (a `--more-seeds` extension of the undecided arms) runs its trials on that
same Ray, and the command shuts it down once, at its end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]

# lr 1e-3 against 3e-2 at 6 steps: per-seed differences of -0.21, -0.09, -0.01 (1 thread, CPU,
# seeds 0..2): undecided after 2 seeds, so a round adds seed 2; with 3 the budget is spent
SPEC = """
name: auto
workload: {preset: gpt-debug}
space:
  optim.lr: {grid: [1.0e-3, 3.0e-2]}
seeds: {auto: true, min: 2, max: 3}
search: {algorithm: grid, max_concurrent: 2}
budget: {steps: 6, eval_every: 3, metrics_every: 0}
resources: {workers_per_trial: 1, cpus_per_worker: 1}
"""


@pytest.mark.timeout(900)
def test_rounds_share_one_ray(tmp_path):
    from orchestrator.store.parquet import read_trials

    spec = tmp_path / "auto.yaml"
    spec.write_text(SPEC)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", GEOSWEEP_RAY_STATE=str(tmp_path / "no-warm-ray.json"))
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(spec), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=840, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[until-decided] adding 1 seed(s) to 2 arms" in proc.stdout, proc.stdout[-3000:]
    trials = read_trials(str(tmp_path / "out" / "auto" / "parquet"), sweep="auto")
    assert sorted(trials["seed"]) == [0, 0, 1, 1, 2, 2] and set(trials["status"]) == {
        "completed"}
    # node = "host:ip/<node id prefix>": a Ray started again would be another node
    nodes = {str(n).rsplit("/", 1)[-1] for n in trials["node"]}
    assert len(nodes) == 1, nodes
    assert proc.stdout.count("closing Ray") <= 1
