"""docs/cluster.md §1 as written: `cluster/configs/local_cluster.sh start`, `geosweep submit
quickstart --wait` to it, the MLflow parent run FINISHED, `local_cluster.sh stop`.

The script is run as a user runs it, with only its environment settings: free ports (other Ray
clusters may share this machine), a state folder in tmp_path, GEOSWEEP_PY naming this test's
interpreter (the script otherwise finds $VIRTUAL_ENV or the checkout's .venv), and a test-only
Ray token in RAY_AUTH_TOKEN so ``~/.ray/auth_token`` is neither read nor written. While the
cluster runs, every server of both Ray nodes must listen on loopback only (both nodes have
node IP 127.0.0.1: no routable address is involved, which a CI machine may not reach).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from listening import describe, is_loopback, listening, process_tree

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "cluster" / "configs" / "local_cluster.sh"


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


def _ray_sockets(state: Path) -> list[tuple[int, str, str, int]]:
    pids: set[int] = set()
    for name in ("head", "node2"):
        pids |= process_tree(int((state / f"{name}.pid").read_text()))
    return listening(pids)


def test_start_submit_quickstart_wait_stop(tmp_path: Path):
    ray_port, dash, mlport, client, agent1, agent2 = _free_ports(6)
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN_PATH",
                        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "HOST")}
    env.update(RAY_PORT=str(ray_port), DASHBOARD_PORT=str(dash), MLFLOW_PORT=str(mlport),
               CLIENT_PORT=str(client), HEAD_AGENT_PORT=str(agent1),
               NODE2_AGENT_PORT=str(agent2), STATE=str(state), GEOSWEEP_PY=sys.executable,
               RAY_AUTH_TOKEN=secrets.token_hex(24), RAY_USAGE_STATS_ENABLED="0")
    tmps: list[str] = []
    started = _script("start", env, timeout=600)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        # each node its own Ray temp dir (a shared one lost the job's working dir)
        tmps = (state / "ray_tmp").read_text().split()
        assert len(tmps) == 2 and tmps[0] != tmps[1]
        assert f"using {Path(sys.executable).parent / 'ray'}" in started.stdout
        # `start` returns once both nodes say "Ray runtime started"; the dashboard, the Ray
        # Client server and the agents bind their ports after that, seconds later on a
        # loaded machine: wait for the whole set before asserting on it
        want = {ray_port, dash, client, agent1, agent2}
        deadline = time.monotonic() + 180
        while True:
            rows = _ray_sockets(state)
            raylets = {pid for pid, comm, _, _ in rows if comm == "raylet"}
            if (len(raylets) == 2 and want <= {p for *_, p in rows}) \
                    or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        assert len(raylets) == 2, describe(rows)
        assert want <= {p for *_, p in rows}, describe(rows)
        assert all(is_loopback(host) for _, _, host, _ in rows), describe(rows)

        addr, ml = f"http://127.0.0.1:{dash}", f"http://127.0.0.1:{mlport}"
        sub = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "submit", "quickstart", "--address", addr,
             "--mlflow-uri", ml, "--out", str(state / "runs"), "--wait"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
        assert sub.returncode == 0, sub.stdout[-4000:] + sub.stderr[-2000:]
        assert "[geosweep] finished" in sub.stdout, sub.stdout[-4000:]
        assert sub.stdout.rstrip().endswith(": SUCCEEDED")
        # issue 33 §16: no MLflow "View run" line per trial, no Ray packaging chatter
        assert "View run" not in sub.stdout and "packaging.py" not in sub.stdout + sub.stderr
        assert "[local_cluster] all up in" in started.stdout  # it said what it was doing
        assert env["RAY_AUTH_TOKEN"] not in sub.stdout + sub.stderr + started.stdout

        from mlflow.tracking import MlflowClient

        client_ = MlflowClient(tracking_uri=ml)
        exp = client_.get_experiment_by_name("quickstart")
        runs = client_.search_runs([exp.experiment_id])
        parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
        assert [p.info.status for p in parents] == ["FINISHED"]
        assert len(children) == 8  # quickstart's num_samples
    finally:
        stopped = _script("stop", env, timeout=180)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not (state / "ray_tmp").exists()
    assert all(not Path(t).exists() for t in tmps)
    for name in ("head", "node2", "mlflow"):
        assert not (state / f"{name}.pid").exists()
    # the dashboard port is free again: nothing listens on it. SO_REUSEADDR, because the
    # closed connections of the run leave it in TIME_WAIT for a minute, which a plain bind
    # refuses (CI saw it); a process that still listens makes even this bind fail. A dying
    # process may hold it a moment after `stop` returns.
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", dash))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.5)
