"""docs/cluster.md §1 as written: `cluster/configs/local_cluster.sh start`, `geosweep submit SPEC
--wait` to it, the MLflow parent run FINISHED, `local_cluster.sh stop`.

The script is run as a user runs it, with only its environment settings: free ports (other Ray
clusters may share this machine), a state folder in tmp_path, GEOSWEEP_PY naming this test's
interpreter (the script otherwise finds $VIRTUAL_ENV or the checkout's .venv), and a test-only
Ray token in RAY_AUTH_TOKEN so ``~/.ray/auth_token`` is neither read nor written.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "cluster" / "configs" / "local_cluster.sh"

# quickstart-sized but a minute of compute: two gpt-debug trials of 20 steps
SPEC = {
    "name": "local-cluster-smoke",
    "workload": {"preset": "gpt-debug", "overrides": {"train.eval_iters": 1}},
    "space": {"optim.lr": {"grid": [0.003, 0.02]}},
    "seeds": [0],
    "search": {"algorithm": "grid", "max_concurrent": 2},
    "budget": {"steps": 20, "eval_every": 10, "metrics_every": 0},
    "resources": {"workers_per_trial": 1, "cpus_per_worker": 1.0, "max_failures": 0},
}


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _script(cmd: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), cmd], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_start_submit_wait_stop(tmp_path: Path):
    ray_port, dash, mlport, client, agent1, agent2 = _free_ports(6)
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
    env.update(RAY_PORT=str(ray_port), DASHBOARD_PORT=str(dash), MLFLOW_PORT=str(mlport),
               CLIENT_PORT=str(client), HEAD_AGENT_PORT=str(agent1),
               NODE2_AGENT_PORT=str(agent2), STATE=str(state), GEOSWEEP_PY=sys.executable,
               RAY_AUTH_TOKEN=secrets.token_hex(24), RAY_USAGE_STATS_ENABLED="0")
    spec = tmp_path / "local_cluster_smoke.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    tmps: list[str] = []
    started = _script("start", env, timeout=300)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        # each node its own Ray temp dir (a shared one lost the job's working dir)
        tmps = (state / "ray_tmp").read_text().split()
        assert len(tmps) == 2 and tmps[0] != tmps[1]
        assert f"using {Path(sys.executable).parent / 'ray'}" in started.stdout
        addr, ml = f"http://127.0.0.1:{dash}", f"http://127.0.0.1:{mlport}"
        sub = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "submit", str(spec), "--address", addr,
             "--mlflow-uri", ml, "--out", str(state / "runs"), "--wait"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=420)
        assert sub.returncode == 0, sub.stdout[-4000:] + sub.stderr[-2000:]
        assert "[geosweep] finished" in sub.stdout and "2 completed" in sub.stdout
        assert sub.stdout.rstrip().endswith(": SUCCEEDED")

        from mlflow.tracking import MlflowClient

        client_ = MlflowClient(tracking_uri=ml)
        exp = client_.get_experiment_by_name(SPEC["name"])
        runs = client_.search_runs([exp.experiment_id])
        parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
        assert [p.info.status for p in parents] == ["FINISHED"]
        assert len(children) == 2
    finally:
        stopped = _script("stop", env, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not (state / "ray_tmp").exists()
    assert all(not Path(t).exists() for t in tmps)
    for name in ("head", "node2", "mlflow"):
        assert not (state / f"{name}.pid").exists()
    with socket.socket() as s:  # the dashboard port is free again
        s.bind(("127.0.0.1", dash))
