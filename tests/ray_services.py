"""Start and stop the services of a local multi-node Ray cluster, each by its own handle.

``ray_head``, ``ray_worker`` and ``mlflow_server`` are context managers that start one real
process tree (``ray start --block`` / ``mlflow server``) in a new process group and, on exit,
stop exactly that group and any straggler whose command line names this cluster's private
``--temp-dir``. A bare ``ray stop`` is never used: it kills every Ray on the machine, including
other users' ``ray.init()`` clusters.

Everything binds 127.0.0.1 unless a host is named; then a warning says that the Ray dashboard /
Jobs API and the MLflow server accept anyone who can reach them. A Ray node on 127.0.0.1 listens
on loopback only, every one of its servers (docs/platform.md, "Loopback-only Ray"): the head
through ``LOOPBACK_VAR``, a joining node through the launcher, both in ``cluster/ray_loopback.py``.
Tokens are never printed: the auth token reaches Ray through the inherited environment only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cluster.ray_loopback import LOOPBACK_VAR

__all__ = ["RayNode", "MlflowServer", "ray_head", "ray_worker", "mlflow_server", "free_port",
           "is_local_host", "network_warning", "wait_for_nodes", "node_complete"]

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
_RAY_BIN = str(Path(sys.executable).with_name("ray"))
# `ray start` on loopback for a node that joins a head (plain `ray start` cannot)
_LOOPBACK_RAY = [sys.executable, str(Path(__file__).resolve().parents[1] / "cluster"
                                     / "ray_loopback.py")]


def is_local_host(host: str) -> bool:
    return host in LOCAL_HOSTS


def network_warning(host: str, what: str) -> str | None:
    """The warning for a service bound to a non-loopback host (None on 127.0.0.1)."""
    if is_local_host(host):
        return None
    return (f"{what} listens on {host}: anyone who can reach it can run code on the cluster or "
            "read results; protect it (firewall, VPN, SSH tunnel, Ray token auth)")


def _warn(msg: str | None) -> None:
    if msg:
        warnings.warn(msg, stacklevel=3)
        print(f"[geosweep] warning: {msg}", file=sys.stderr, flush=True)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _short_tempdir(prefix: str) -> str:
    # Ray's unix sockets live under the temp dir: keep the path short (108-byte sun_path limit).
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp" if os.path.isdir("/tmp") else None)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Jobs run `python ...`/`geosweep ...` through the PATH of `ray start`: put ours first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra or {})
    return env


@dataclass
class RayNode:
    """A running ``ray start --block`` process tree."""

    proc: subprocess.Popen
    temp_dir: str
    log: Path
    gcs_address: str = ""
    dashboard_url: str = ""
    ports: dict[str, int] = field(default_factory=dict)

    def stop(self, timeout: float = 10.0) -> None:
        _stop_group(self.proc, timeout)
        _kill_stragglers(self.temp_dir)


def _stop_group(proc: subprocess.Popen, timeout: float) -> None:
    # SIGTERM to the leader only: `ray start --block` then shuts its Ray processes down in ~3 s
    # (SIGTERM to the whole group at once measured ~20 s); whatever is left gets SIGKILL.
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def _kill_stragglers(marker: str) -> None:
    """SIGKILL processes whose command line contains ``marker`` (our private temp dir)."""
    me = os.getpid()
    for d in Path("/proc").glob("[0-9]*"):
        try:
            pid = int(d.name)
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except (OSError, ValueError):
            continue
        if pid != me and marker in cmd:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _start_ray(args: list[str], temp_dir: str, env: dict[str, str] | None,
               ready: str, timeout: float, loopback: bool = False) -> RayNode:
    """``ray start --block ARGS``; returns once ``ready`` is in its log. ``loopback``: a head
    with every server on 127.0.0.1, or a node joining a head on 127.0.0.1 (plain ``ray start``
    would look for that head at the routable IP)."""
    log = Path(temp_dir) / f"ray-start-{int(time.time() * 1000)}.log"
    fh = open(log, "wb")  # noqa: SIM115 - handed to the child, closed with it
    # Token auth on every node unless the caller chose: a head defaults to it in Ray 2.60 but a
    # joining `ray start` does not, and then fails with InvalidAuthToken.
    penv = _env(env)
    penv.setdefault("RAY_AUTH_MODE", "token")
    # Ray gives the dashboard 60 s to come up; on 2 cores at load 60 its imports alone took
    # longer (no dashboard.log yet) and `ray start --head` failed
    penv.setdefault("RAY_DASHBOARD_STARTUP_TIMEOUT_S", "300")
    # Ray's default (all interfaces) unless this node is on loopback, whatever this process's
    # environment holds (an in-process `geosweep run` sets the variable here too)
    penv.pop(LOOPBACK_VAR, None)
    ray_cmd = [_RAY_BIN]
    if loopback and "--head" in args:
        penv[LOOPBACK_VAR] = "0"
    elif loopback:
        ray_cmd = _LOOPBACK_RAY
    proc = subprocess.Popen([*ray_cmd, "start", "--block", "--disable-usage-stats", *args],
                            stdout=fh, stderr=subprocess.STDOUT, env=penv,
                            start_new_session=True)
    fh.close()
    node = RayNode(proc, temp_dir, log)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ready in log.read_text(errors="replace"):
            return node
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-2000:]
    node.stop()
    raise RuntimeError(f"ray start failed or timed out after {timeout:.0f}s:\n{tail}")


@contextlib.contextmanager
def ray_head(port: int | None = None, num_cpus: float = 2, dashboard_port: int | None = None,
             host: str = "127.0.0.1", resources: dict[str, float] | None = None,
             temp_dir: str | None = None, env: dict[str, str] | None = None,
             timeout: float = 180.0, wait_dashboard: bool = True) -> Iterator[RayNode]:
    """A Ray head with the dashboard (Jobs API) on ``host:dashboard_port``. On 127.0.0.1 it
    listens on loopback only, and while it runs this process's environment says so to the
    Ray clients it starts (``_clients_reach_loopback``).

    ``wait_dashboard=False`` yields once ``ray start`` reports the runtime started, without
    waiting for the dashboard to answer (``wait_for_nodes`` polls it). A node joining before
    that fails on a loaded machine ("Failed to get node info: Deadline Exceeded").
    """
    _warn(network_warning(host, "the Ray dashboard / Jobs API"))
    port = port or free_port()
    dashboard_port = dashboard_port or free_port()
    own_tmp = temp_dir is None
    temp_dir = temp_dir or _short_tempdir("gsray-")
    ports = {"gcs": port, "dashboard": dashboard_port,
             "agent": free_port(), "client": free_port()}
    args = ["--head", f"--port={port}", f"--num-cpus={num_cpus}", f"--node-ip-address={host}",
            "--include-dashboard=true", f"--dashboard-host={host}",
            f"--dashboard-port={dashboard_port}",
            f"--dashboard-agent-listen-port={ports['agent']}",
            f"--ray-client-server-port={ports['client']}", f"--temp-dir={temp_dir}"]
    if resources:
        args.append(f"--resources={json.dumps(resources)}")
    try:
        node = _start_ray(args, temp_dir, env, "Ray runtime started", timeout,
                          loopback=is_local_host(host))
    except BaseException:
        if own_tmp:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    node.gcs_address = f"{host}:{port}"
    node.dashboard_url = f"http://{host}:{dashboard_port}"
    node.ports = ports
    try:
        if wait_dashboard:
            _wait_http(node.dashboard_url + "/api/version", timeout, node.proc)
        with _clients_reach_loopback(is_local_host(host)):
            yield node
    finally:
        node.stop()
        if own_tmp:
            shutil.rmtree(temp_dir, ignore_errors=True)


@contextlib.contextmanager
def _clients_reach_loopback(on: bool) -> Iterator[None]:
    """While a loopback head runs, the processes this one starts (``geosweep run --address``,
    Ray's state API) keep its 127.0.0.1 address as given: Ray would swap it for the routable IP,
    where the head does not listen (docs/platform.md, "Loopback-only Ray")."""
    old = os.environ.get(LOOPBACK_VAR)
    if on:
        os.environ[LOOPBACK_VAR] = "0"
    try:
        yield
    finally:
        if on and old is None:
            os.environ.pop(LOOPBACK_VAR, None)
        elif on:
            os.environ[LOOPBACK_VAR] = old


@contextlib.contextmanager
def ray_worker(address: str, num_cpus: float = 1, resources: dict[str, float] | None = None,
               node_ip: str = "127.0.0.1", temp_dir: str | None = None,
               env: dict[str, str] | None = None, timeout: float = 180.0) -> Iterator[RayNode]:
    """One more Ray node joining the head at ``address`` (``host:gcs_port``)."""
    own_tmp = temp_dir is None
    temp_dir = temp_dir or _short_tempdir("gsrayw-")
    ports = {"agent": free_port()}
    args = [f"--address={address}", f"--num-cpus={num_cpus}", f"--node-ip-address={node_ip}",
            f"--dashboard-agent-listen-port={ports['agent']}", f"--temp-dir={temp_dir}"]
    if resources:
        args.append(f"--resources={json.dumps(resources)}")
    try:
        # One retry: on a loaded machine joining can fail with a GCS deadline (measured once
        # at load average 20 on 2 cores); a fresh `ray start` then succeeds.
        loopback = is_local_host(node_ip) or is_local_host(address.rsplit(":", 1)[0])
        try:
            node = _start_ray(args, temp_dir, env, "Ray runtime started", timeout, loopback)
        except RuntimeError:
            node = _start_ray(args, temp_dir, env, "Ray runtime started", timeout, loopback)
    except BaseException:
        if own_tmp:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    node.gcs_address = address
    node.ports = ports
    try:
        yield node
    finally:
        node.stop()
        if own_tmp:
            shutil.rmtree(temp_dir, ignore_errors=True)


NODE_FIELDS = ("ip", "hostname", "raylet")


def wait_for_nodes(dashboard_url: str, n: int, timeout: float = 120.0,
                   headers: dict[str, str] | None = None,
                   fields: tuple[str, ...] = NODE_FIELDS) -> list[dict]:
    """Poll the dashboard until ``n`` nodes are alive *and their summaries are complete*.

    A node that is still joining shows up ALIVE before the dashboard's agent has filled in its
    summary (seen on a loaded 2-core CI box: a row without ``ip``). Returning that half-built
    row made a caller's ``n["ip"]`` fail; so a row counts only once every key in ``fields`` is
    present and non-empty, and the caller asserts on a state that is whole.
    """
    deadline = time.time() + timeout
    alive: list[dict] = []
    while time.time() < deadline:
        try:
            req = urllib.request.Request(dashboard_url + "/nodes?view=summary",
                                         headers=headers or {})
            data = json.loads(urllib.request.urlopen(req, timeout=5).read())
            alive = [x for x in data["data"]["summary"] if node_complete(x, fields)]
            if len(alive) >= n:
                return alive
        except (OSError, ValueError, KeyError, TypeError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"only {len(alive)} of {n} Ray nodes alive with complete summaries "
                       f"({', '.join(fields)}) after {timeout:.0f}s")


def node_complete(row: dict, fields: tuple[str, ...] = NODE_FIELDS) -> bool:
    """True when a dashboard node summary is ALIVE and carries every key in ``fields``."""
    if not isinstance(row, dict) or (row.get("raylet") or {}).get("state") != "ALIVE":
        return False
    return all(row.get(f) not in (None, "", {}) for f in fields)


@dataclass
class MlflowServer:
    proc: subprocess.Popen
    uri: str
    root: Path
    log: Path

    def stop(self, timeout: float = 10.0) -> None:
        _stop_group(self.proc, timeout)

    def wait_ready(self, timeout: float = 180.0) -> None:
        _wait_http(self.uri + "/health", timeout, self.proc, self.log)


@contextlib.contextmanager
def mlflow_server(port: int | None = None, root: str | os.PathLike | None = None,
                  host: str = "127.0.0.1", timeout: float = 180.0,
                  wait: bool = True) -> Iterator[MlflowServer]:
    """A lean MLflow tracking server (1 worker, no job execution) with a sqlite store.

    ``wait=False`` yields at once (start other services meanwhile; then ``wait_ready()``).
    """
    _warn(network_warning(host, "the MLflow server"))
    port = port or free_port()
    own_root = root is None
    root = Path(root or _short_tempdir("gsmlflow-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    log = root / "mlflow-server.log"
    cmd = [sys.executable, "-m", "mlflow", "server", "--workers", "1", "--host", host,
           "--port", str(port), "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
           "--artifacts-destination", str(root / "artifacts")]
    fh = open(log, "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                            env=_env({"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}))
    fh.close()
    server = MlflowServer(proc, f"http://{host}:{port}", root, log)
    try:
        if wait:
            server.wait_ready(timeout)
        yield server
    finally:
        server.stop()
        if own_root:
            shutil.rmtree(root, ignore_errors=True)


def _wait_http(url: str, timeout: float, proc: subprocess.Popen,
               log: Path | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            break
        try:
            urllib.request.urlopen(url, timeout=3).read()
            return
        except urllib.error.HTTPError as e:  # up, but e.g. 401 without a token: it answers
            if e.code in (401, 403):
                return
        except OSError:
            pass
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-2000:] if log else ""
    raise RuntimeError(f"{url} did not answer within {timeout:.0f}s {tail}")
