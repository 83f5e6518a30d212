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

__all__ = ["cmd_ui", "check_host", "port_free", "free_port", "wait_ready", "DEFAULT_PORT"]

DEFAULT_PORT = 5000
READY_TIMEOUT_S = 300.0  # a loaded 2-core machine was seen taking ~35 s


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


def _server_cmd(uri: str, host: str, port: int) -> list[str]:
    """``mlflow server`` on the store: geosweep's app when installed (the model-training view
    for a fresh browser: orchestrator/store/mlflow_ui_app.py), one worker, no access log."""
    from importlib.metadata import entry_points

    from orchestrator.store.mlflow_names import UI_APP as APP_NAME

    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
           "--host", host, "--port", str(port), "--workers", "1",
           "--uvicorn-opts", "--no-access-log"]
    if any(e.name == APP_NAME for e in entry_points(group="mlflow.app")):
        cmd += ["--app-name", APP_NAME]
    else:  # an install from before the entry point: MLflow's own app (GenAI view by default)
        print("[geosweep] note: geosweep's MLflow app is not installed (run bash .ci/install "
              "again); a new browser opens MLflow's GenAI view until switched", flush=True)
    return cmd


def _answers(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = READY_TIMEOUT_S,
               every: float = 10.0, printer=print) -> float | None:
    """Seconds until ``url`` answers 200 (a line every ``every`` s until then), or None when
    the server exits or ``timeout`` passes first."""
    t0 = last = time.monotonic()
    while proc.poll() is None:
        if _answers(url):
            return time.monotonic() - t0
        now = time.monotonic()
        if now - t0 > timeout:
            return None
        if now - last >= every:
            printer(f"[geosweep] still starting the MLflow UI server ({now - t0:.0f}s)")
            last = now
        time.sleep(0.25)
    return None


def _tail(path: str, n: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:]).rstrip()
    except OSError:
        return ""


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
    if host not in ("127.0.0.1", "localhost"):
        print("[geosweep] warning: the MLflow UI is reachable from the network; protect it",
              file=sys.stderr)
    base = f"http://{host}:{port}"
    probe = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/health"
    from orchestrator.store.mlflow_names import view_url
    from orchestrator.store.runs import view_experiment

    name = str(manifest.get("name") or root.name)
    exp_id = view_experiment(uri, name)
    # the server's own lines (uvicorn's start-up, warnings) go to a log file, said once and
    # removed after a clean stop (kept, and its tail shown, when the server fails); the
    # terminal gets the links when the server answers
    import tempfile

    fd, log_path = tempfile.mkstemp(prefix=f"geosweep-ui-{port}-", suffix=".log")
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    print(f"[geosweep] starting the MLflow UI server for {root.name} (its log: {log_path})",
          flush=True)
    with os.fdopen(fd, "w") as log:
        proc = subprocess.Popen(_server_cmd(uri, host, port), env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        took = wait_ready(proc, probe, printer=lambda s: print(s, flush=True))
        if took is None and proc.poll() is None:
            print(f"geosweep: error: the MLflow UI server did not answer on {base} within "
                  f"{READY_TIMEOUT_S:.0f}s; its log: {log_path}", file=sys.stderr)
            return 1
        if took is not None:
            print(f"[geosweep] MLflow UI for {root.name}: {base}  (up in {took:.0f}s; "
                  "Ctrl-C stops it)", flush=True)
            if exp_id is not None:  # runs sorted by the objective, the trials' curves overlaid
                print(f"[geosweep] the sweep's runs:   {view_url(base, exp_id, name)}",
                      flush=True)
                print(f"[geosweep] the sweep's charts: {view_url(base, exp_id, name, 'CHART')}",
                      flush=True)
        rc = proc.wait()
    except KeyboardInterrupt:
        print("[geosweep] stopping the MLflow UI", file=sys.stderr, flush=True)
        _kill_group(proc)
        _remove(log_path)  # a clean stop: nothing in it to read
        return 0
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _kill_group(proc)  # a leader that died may leave its workers behind
    if rc != 0:
        tail = _tail(log_path)
        if tail:
            print(tail, file=sys.stderr)
        print(f"geosweep: error: the MLflow UI server exited with code {rc} "
              f"(host {host}, port {port}); its log: {log_path}", file=sys.stderr)
        return 1
    _remove(log_path)
    return 0


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def add(sub: argparse._SubParsersAction) -> None:
    u = sub.add_parser("ui", help="open the MLflow UI on a sweep's store")
    u.add_argument("dir", help="the sweep folder (<out>/<name>, holds sweep.json)")
    u.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; others expose the UI)")
    u.add_argument("--port", type=_port, default=None,
                   help=f"port (default {DEFAULT_PORT}, or a free one if it is busy)")
    u.set_defaults(fn=cmd_ui)
