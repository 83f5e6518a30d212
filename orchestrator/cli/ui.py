"""`geosweep ui DIR`: the MLflow UI on a sweep's store.

The host and port are checked before the server starts (a bad host or port is one line, exit
2; a busy default port moves to a free one and says so). The server runs in its own process
group: on SIGINT/SIGTERM (or when it fails) the whole group, mlflow's uvicorn workers included,
is taken down, so no child keeps the port.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

from orchestrator.cli.checks import sweep_dir
from orchestrator.cli.errors import UsageError

__all__ = ["cmd_ui", "check_host", "port_free", "free_port", "DEFAULT_PORT"]

DEFAULT_PORT = 5000


def check_host(host: str) -> str:
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise UsageError(f"--host: cannot resolve {host!r} ({e})") from None
    return host


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"a port is in 1..65535, got {v}")
    return v


def _choose_port(host: str, port: int | None) -> int:
    try:
        any_port = free_port(host)
    except OSError as e:
        raise UsageError(f"--host: cannot listen on {host!r} ({e.strerror})") from None
    if port is None:
        if port_free(host, DEFAULT_PORT):
            return DEFAULT_PORT
        print(f"[geosweep] port {DEFAULT_PORT} is in use; using port {any_port}", flush=True)
        return any_port
    if not port_free(host, port):
        raise UsageError(f"--port: {host}:{port} is in use or not allowed; pick another "
                         "(or leave --port out to get a free one)")
    return port


def _kill_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the server's process group, then SIGKILL whatever is left of it."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader is gone; its workers may not be
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)


def _check_store(uri: str) -> None:
    """The store classified before the server opens it (store/mlflow_store.py): a folder, a
    foreign or corrupt database, a locked one is one line, where the server retried forever,
    migrated a foreign database or printed a 60-line traceback. A missing store is said."""
    from orchestrator.store.mlflow_store import probe

    found = probe(uri, pages=True)
    if found is None:
        return
    if found.kind != "missing":
        raise UsageError(f"{found}")
    from orchestrator.store.mlflow_template import seed_sqlite_store

    seed_sqlite_store(uri[len("sqlite:///"):])
    print(f"[geosweep] {uri[len('sqlite:///'):]} did not exist: the UI shows a new, empty "
          "store", flush=True)


def cmd_ui(args: argparse.Namespace) -> int:
    root = sweep_dir(args.dir)
    from orchestrator.store.manifest import sweep_targets
    from orchestrator.store.targets import FolderError

    try:  # the server writes its store: it must be the folder's (store/targets.py)
        targets = sweep_targets(root)
    except FolderError as e:
        raise UsageError(str(e)) from None
    manifest, uri = targets.manifest, targets.store_uri
    if uri.startswith("http"):
        print(f"this sweep logs to the MLflow server {uri}: open it in a browser")
        return 0
    host = check_host(args.host)
    port = _choose_port(host, args.port)
    _check_store(uri)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
           "--host", host, "--port", str(port), "--workers", "1"]
    if host not in ("127.0.0.1", "localhost"):
        print("[geosweep] warning: the MLflow UI is reachable from the network; protect it",
              file=sys.stderr)
    base = f"http://{host}:{port}"
    print(f"[geosweep] MLflow UI for {root.name}: {base}  (Ctrl-C stops it)", flush=True)
    from orchestrator.store.mlflow_names import view_url
    from orchestrator.store.runs import view_experiment

    name = str(manifest.get("name") or root.name)
    exp_id = view_experiment(uri, name)
    if exp_id is not None:  # the runs table with params and losses as columns, arms expanded
        print(f"[geosweep] the sweep's runs: {view_url(base, exp_id, name)}", flush=True)
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        print("[geosweep] stopping the MLflow UI", file=sys.stderr, flush=True)
        _kill_group(proc)
        return 0
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _kill_group(proc)  # a leader that died may leave its workers behind
    if rc != 0:
        print(f"geosweep: error: the MLflow UI server exited with code {rc} "
              f"(host {host}, port {port}); see the lines above", file=sys.stderr)
        return 1
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    u = sub.add_parser("ui", help="open the MLflow UI on a sweep's store")
    u.add_argument("dir", help="the sweep folder (<out>/<name>, holds sweep.json)")
    u.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; others expose the UI)")
    u.add_argument("--port", type=_port, default=None,
                   help=f"port (default {DEFAULT_PORT}, or a free one if it is busy)")
    u.set_defaults(fn=cmd_ui)
