"""The warm local Ray of `geosweep ray start | status | stop` (cluster/warm.py)."""

from __future__ import annotations

import json
import os

import pytest
from listening import describe, is_loopback, listening, process_tree

from cluster import warm


@pytest.fixture()
def state(tmp_path, monkeypatch):
    path = tmp_path / "ray.json"
    monkeypatch.setenv("GEOSWEEP_RAY_STATE", str(path))
    return path


def test_no_or_stale_record_is_no_warm_ray(state):
    assert warm.current() is None
    state.write_text("not json")
    assert warm.current() is None
    # a record whose process is gone (this pid can't be a live Ray: pid 2**22 + 1 > pid_max)
    state.write_text(json.dumps({"address": "127.0.0.1:1", "pid": 2**22 + 1}))
    assert warm.current() is None
    assert warm.stop() is False and not state.exists()  # the stale record is removed
    # a live process (this one) but a port nobody answers on: still not a Ray
    state.write_text(json.dumps({"address": "127.0.0.1:1", "pid": os.getpid()}))
    assert warm.current() is None


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_start_join_status_stop(state, capsys):
    import orchestrator.cli as ocli

    assert ocli.main(["ray", "status"]) == 3
    try:
        assert ocli.main(["ray", "start", "--num-cpus", "1"]) == 0
        rec = warm.current()
        assert rec is not None and rec["address"].startswith("127.0.0.1:")
        assert ocli.main(["ray", "start"]) == 0  # idempotent: the same Ray
        assert warm.current()["pid"] == rec["pid"]
        assert "already running" in capsys.readouterr().out
        assert ocli.main(["ray", "status"]) == 0
        # every server of the warm Ray on loopback (issue 15 section 6; test_loopback.py)
        rows = listening(process_tree(rec["pid"]))
        assert {"gcs_server", "raylet"} <= {comm for _, comm, _, _ in rows}, describe(rows)
        assert all(is_loopback(host) for _, _, host, _ in rows), describe(rows)
    finally:
        assert ocli.main(["ray", "stop"]) == 0
    assert warm.current() is None and not state.exists()
    assert not os.path.exists(rec["temp_dir"])
    assert ocli.main(["ray", "stop"]) == 0
    assert "no local Ray running" in capsys.readouterr().out


def test_bad_num_cpus_is_one_line(state, capsys):
    import orchestrator.cli as ocli

    assert ocli.main(["ray", "start", "--num-cpus", "zero"]) == 2
    assert "--num-cpus: 'zero' is not a positive whole number" in capsys.readouterr().err


SWEEP = """
name: warmjoin
workload: {preset: gpt-debug}
space:
  optim.lr: {grid: [1.0e-3, 3.0e-3]}
seeds: [0]
search: {algorithm: grid, max_concurrent: 2}
budget: {steps: 6, eval_every: 3, metrics_every: 0}
resources: {workers_per_trial: 1, cpus_per_worker: 1}
"""

# the sweep as `geosweep run` runs it, in a process that reports afterwards whether it
# imported torch (the trials train; the driver never needs it, kept weights included)
DRIVER = """
import sys
from orchestrator.cli import main
rc = main(["run", sys.argv[1], "--out", sys.argv[2]])
print("rc", rc, "torch" in sys.modules, flush=True)
"""

JOBS = """
import json, sys
import ray
ray.init(address=sys.argv[1], _node_ip_address="127.0.0.1", log_to_driver=False)
print(json.dumps([int(j["DriverPid"]) for j in ray._private.state.jobs()]))
"""


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sweep_joins_the_warm_ray_and_leaves_it_up(state, tmp_path):
    """`geosweep run` with a warm Ray up: the sweep is a job of that Ray (its driver's pid in
    the Ray's job table), the Ray is the same one, alive, when the sweep has exited, and the
    driver imported no torch (the final weights are the trial's own files)."""
    import subprocess
    import sys

    import orchestrator.cli as ocli
    from cluster.local import ray_env
    from cluster.warm import join_env

    spec = tmp_path / "warmjoin.yaml"
    spec.write_text(SWEEP)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1")
    assert ocli.main(["ray", "start"]) == 0
    try:
        rec = warm.current()
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(spec),
                                 str(tmp_path / "out")], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:] + err[-3000:]
        assert out.strip().splitlines()[-1] == "rc 0 False", out[-2000:]
        assert "closing Ray" not in out
        assert warm.current() is not None and warm.current()["pid"] == rec["pid"]
        jobs = subprocess.run([sys.executable, "-c", JOBS, rec["address"]], text=True,
                              capture_output=True, timeout=120,
                              env={**env, **ray_env(), **join_env(rec),
                                   "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
        assert jobs.returncode == 0, jobs.stderr[-2000:]
        assert proc.pid in json.loads(jobs.stdout.strip().splitlines()[-1])
    finally:
        assert ocli.main(["ray", "stop"]) == 0
