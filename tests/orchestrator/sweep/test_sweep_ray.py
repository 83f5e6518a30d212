"""End to end on a real local Ray: spec -> Tune -> trials -> MLflow + Parquet.

Each sweep runs `geosweep run` in a subprocess (its own Ray, shut down when it exits) under a
hard timeout, so a hang fails fast instead of eating CI's budget.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SPEC_4 = """
name: four
workload:
  preset: gpt-debug
  overrides: {optim.warmup_steps: 0}
space:
  optim.lr: {grid: [1.0e-3, 3.0e-3, 1.0e-2, 500.0]}
seeds: [0]
search: {algorithm: grid, max_concurrent: 2}
divergence: {warmup_steps: 3}
budget: {steps: 24, eval_every: 6, metrics_every: 12}
resources: {workers_per_trial: 1, cpus_per_worker: 1}
"""

SPEC_DDP = """
name: ddp
workload: {preset: gpt-debug}
space: {}
seeds: [0]
search: {algorithm: grid, max_concurrent: 1}
budget: {steps: 6, eval_every: 3, metrics_every: 0}
resources: {workers_per_trial: 2, cpus_per_worker: 0.49, executor: train}
"""


def _geosweep(*args: str, timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=Path(__file__).parents[3])


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep4")
    spec = tmp / "four.yaml"
    spec.write_text(textwrap.dedent(SPEC_4))
    proc = _geosweep("run", str(spec), "--out", str(tmp / "out"), timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp / "out" / "four", proc


@pytest.mark.timeout(600)
def test_four_trials_with_planted_divergence(four):
    root, proc = four
    assert "[geosweep]" in proc.stdout and "geosweep ui" in proc.stdout
    import duckdb

    pq = root / "parquet"
    trials = duckdb.sql(
        f"select * from read_parquet('{pq}/trials/**/*.parquet', hive_partitioning=true, "
        "union_by_name=true)").df()
    assert len(trials) == 4
    by_lr = {float(r["optim.lr"]): r for _, r in trials.iterrows()}
    bad = by_lr[500.0]
    assert bad["status"] == "diverged", bad.to_dict()
    assert bad["divergence_reason"]
    assert int(bad["divergence_step"]) < 24
    for lr in (1e-3, 3e-3, 1e-2):
        assert by_lr[lr]["status"] == "completed"

    curves = duckdb.sql(
        f"select trial, step, split, metric, value from read_parquet('{pq}/curves/**/*.parquet', "
        "hive_partitioning=true)").df()
    tl = curves[(curves.split == "train") & (curves.metric == "loss")]
    for lr, r in by_lr.items():
        steps = sorted(tl[tl.trial == r["trial"]].step)
        if lr == 500.0:
            # stopped at once: the curve ends at the divergence step, within one report interval
            assert steps[-1] == int(bad["divergence_step"])
        else:
            assert steps == list(range(1, 25)), (lr, steps)
        vs = curves[(curves.trial == r["trial"]) & (curves.split == "val")]
        assert len(vs) > 0 or lr == 500.0
    metrics = duckdb.sql(
        f"select count(*) as n from read_parquet('{pq}/metrics/**/*.parquet', "
        "hive_partitioning=true)").fetchall()[0][0]
    assert metrics > 0


@pytest.mark.timeout(600)
def test_mlflow_parent_child_and_tags(four):
    root, _ = four
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("four")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 4
    pid = parents[0].info.run_id
    assert all(c.data.tags["mlflow.parentRunId"] == pid for c in children)
    statuses = sorted(c.data.tags.get("geosweep.status") for c in children)
    assert statuses == ["completed", "completed", "completed", "diverged"]
    div = next(c for c in children if c.data.tags.get("geosweep.status") == "diverged")
    assert div.data.tags.get("geosweep.divergence.reason")
    ok = next(c for c in children if c.data.tags.get("geosweep.status") == "completed")
    hist = client.get_metric_history(ok.info.run_id, "Loss/train")
    assert sorted(m.step for m in hist) == list(range(1, 25))
    assert "optim.lr" in ok.data.params


@pytest.mark.timeout(300)
def test_status_and_report_commands(four):
    root, _ = four
    st = _geosweep("status", str(root), timeout=120)
    assert st.returncode == 0, st.stderr
    assert "diverged" in st.stdout and "completed" in st.stdout
    rp = _geosweep("report", str(root), timeout=240)
    assert rp.returncode == 0, rp.stderr[-2000:]
    assert (root / "report" / "report.md").exists()


@pytest.mark.timeout(420)
def test_torch_trainer_ddp_two_workers(tmp_path):
    spec = tmp_path / "ddp.yaml"
    spec.write_text(textwrap.dedent(SPEC_DDP))
    proc = _geosweep("run", str(spec), "--out", str(tmp_path / "out"), timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import duckdb

    pq = tmp_path / "out" / "ddp" / "parquet"
    trials = duckdb.sql(f"select * from read_parquet('{pq}/trials/**/*.parquet', "
                        "hive_partitioning=true, union_by_name=true)").df()
    assert list(trials.status) == ["completed"]
    curves = duckdb.sql(f"select step from read_parquet('{pq}/curves/**/*.parquet', "
                        "hive_partitioning=true) where split='train' and metric='loss'").df()
    assert sorted(curves.step) == list(range(1, 7))
