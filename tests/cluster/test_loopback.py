"""Every local Ray geosweep starts listens on 127.0.0.1 only (issue 15 section 6).

What listens is read from /proc (``listening.py``): the TCP sockets in state LISTEN held by the
process tree of what was started. Checked: the Ray that ``geosweep run`` starts (no
``--address``), the test helper's head plus a joining node (``tests/ray_services.py``), and the
socket reader itself on a socket bound to all interfaces.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from listening import describe, is_loopback, listening, process_tree

from cluster import jobs
from cluster.ray_loopback import LOOPBACK_VAR

ROOT = Path(__file__).resolve().parents[2]

SPEC = """\
name: loopback
workload: {preset: gpt-debug}
space: {optim.lr: {grid: [3.0e-3]}}
seeds: [0]
search: {algorithm: grid, max_concurrent: 1}
budget: {steps: 40, eval_every: 20, metrics_every: 0}
resources: {workers_per_trial: 1, cpus_per_worker: 1}
"""


def _exposed(rows: list[tuple[int, str, str, int]]) -> list[tuple[int, str, str, int]]:
    return [r for r in rows if not is_loopback(r[2])]


def test_reader_sees_a_socket_on_all_interfaces():
    # the check below cannot pass vacuously: a socket on 0.0.0.0 is reported as exposed
    with socket.socket() as s, socket.socket() as lo:
        s.bind(("0.0.0.0", 0))
        s.listen()
        lo.bind(("127.0.0.1", 0))
        lo.listen()
        rows = listening({os.getpid()})
        mine = {(h, p) for _, _, h, p in rows}
        assert ("0.0.0.0", s.getsockname()[1]) in mine
        assert ("127.0.0.1", lo.getsockname()[1]) in mine
        assert [(h, p) for _, _, h, p in _exposed(rows)] == [("0.0.0.0", s.getsockname()[1])]
    assert is_loopback("::ffff:127.0.0.1") and is_loopback("::1")
    assert not is_loopback("::") and not is_loopback("192.0.2.2")


def _run_watching(env: dict[str, str], spec: Path, out: Path,
                  seen: set[tuple[int, str, str, int]]) -> tuple[int, str]:
    """``geosweep run SPEC --out OUT``; adds every socket any process of the run listened on
    while it ran (Ray's workers come and go; the GCS and the raylet live from start to end)."""
    log = out.with_suffix(".log")
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", str(spec),
                                 "--out", str(out)], cwd=ROOT, env=env,
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while proc.poll() is None:
            seen.update(listening(process_tree(proc.pid)))
            time.sleep(1.0)  # a scan costs ~0.1 s of CPU: keep it off a loaded machine
    finally:
        if proc.poll() is None:  # the test failed or timed out: its whole process group
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
    return proc.returncode, log.read_text(errors="replace")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_geosweep_run_starts_a_loopback_only_ray(tmp_path: Path):
    spec = tmp_path / "loopback.yaml"
    spec.write_text(SPEC)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT),
               GEOSWEEP_RAY_STATE=str(tmp_path / "no-warm-ray.json"))  # start its own Ray
    env.pop(LOOPBACK_VAR, None)  # geosweep's default, not whatever this process holds
    env.pop("RAY_ADDRESS", None)
    seen: set[tuple[int, str, str, int]] = set()
    # twice at most: a loaded 2-core machine can miss Ray's 30 s raylet start window (seen with
    # and without loopback: benchmarks/loopback_start.py); the sockets of both tries count
    for attempt in range(2):
        rc, text = _run_watching(env, spec, tmp_path / f"out{attempt}", seen)
        if "could not start a local Ray" not in text:
            break
    assert rc == 0, text[-3000:]
    rows = sorted(seen)
    names = {comm for _, comm, _, _ in rows}
    assert {"gcs_server", "raylet"} <= names, describe(rows)
    assert any(n.startswith("ray::") for n in names), describe(rows)  # agents, workers
    assert _exposed(rows) == [], describe(rows)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_helper_head_and_joining_node_listen_on_loopback_only(monkeypatch):
    import secrets

    from ray_services import ray_head, ray_worker, wait_for_nodes

    token = secrets.token_hex(24)
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)  # this test's own token, for both nodes
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    ray_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    with ray_head(num_cpus=1, env=ray_env, wait_dashboard=False) as head, \
            ray_worker(head.gcs_address, num_cpus=1, resources={"node2": 1}, env=ray_env) as w:
        nodes = wait_for_nodes(head.dashboard_url, 2, headers=jobs.auth_headers())
        assert sorted(n["ip"] for n in nodes) == ["127.0.0.1", "127.0.0.1"], nodes
        rows = listening(process_tree(head.proc.pid) | process_tree(w.proc.pid))
    names = {comm for _, comm, _, _ in rows}
    assert {"gcs_server", "raylet"} <= names, describe(rows)
    # the head's dashboard (Jobs API) and both nodes' raylets are among them
    ports = {p for _, _, _, p in rows}
    assert head.ports["dashboard"] in ports and head.ports["gcs"] in ports, describe(rows)
    assert len({pid for pid, comm, _, _ in rows if comm == "raylet"}) == 2, describe(rows)
    assert _exposed(rows) == [], describe(rows)


@pytest.mark.parametrize("row, complete", [
    ({"ip": "127.0.0.1", "hostname": "h", "raylet": {"state": "ALIVE"}}, True),
    ({"hostname": "h", "raylet": {"state": "ALIVE"}}, False),  # joining: no ip yet (CI saw it)
    ({"ip": "", "hostname": "h", "raylet": {"state": "ALIVE"}}, False),
    ({"ip": "127.0.0.1", "hostname": "h", "raylet": {}}, False),
    ({"ip": "127.0.0.1", "hostname": "h", "raylet": {"state": "DEAD"}}, False),
    ({"ip": "127.0.0.1", "raylet": {"state": "ALIVE"}}, False),
    (None, False),
])
def test_a_node_counts_only_once_its_summary_is_complete(row, complete):
    from ray_services import node_complete

    assert node_complete(row) is complete
