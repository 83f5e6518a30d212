"""`geosweep ui`: one line when the server cannot start, a free port when 5000 is busy; the real
server: its links printed only once it answers, no line per HTTP request, the page it serves
seeds the model-training view, and no mlflow/uvicorn child left after SIGTERM (its own process
group)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import orchestrator.cli as ocli
import orchestrator.cli.ui as ui

ROOT = Path(__file__).resolve().parents[3]


def _sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sw"
    root.mkdir()
    (root / "sweep.json").write_text(json.dumps(
        {"name": "sw", "mlflow_uri": f"sqlite:///{root / 'mlflow.db'}"}))
    return root


def _procs() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, pgid) of every live (non-zombie) process, from /proc."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            out[int(d.name)] = (int(fields[1]), int(fields[2]))
    return out


def _descendants(pid: int) -> set[int]:
    procs, found, todo = _procs(), set(), [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, (pp, _) in procs.items() if pp == p}
        todo += list(kids - found)
        found |= kids
    return found


def run_cli(argv, capsys):
    capsys.readouterr()
    rc = ocli.main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


class FakeProc:
    """What subprocess.Popen returns, for a server that exits with ``rc`` at once."""

    calls: list = []

    def __init__(self, cmd, rc=0, **kw):
        FakeProc.calls.append((cmd, kw))
        self.pid, self.rc = 999_999_999, rc

    def wait(self, timeout=None):
        return self.rc

    def poll(self):  # exited at once
        return self.rc


@pytest.mark.parametrize("argv, msg", [
    (["--port", "70000"], "a port is in 1..65535"),
    (["--port", "http"], "expected a port number"),
    (["--host", "no-such-host.invalid"], "--host: cannot resolve"),
    (["--host", "198.51.100.254"], "--host: cannot listen on"),  # TEST-NET-2, not ours
])
def test_bad_host_or_port_is_one_line(tmp_path, capsys, argv, msg):
    if "198.51.100.254" in argv and ui.port_free("198.51.100.254", 0):
        pytest.skip("this machine owns 198.51.100.254")
    rc, _, err = run_cli(["ui", str(_sweep(tmp_path)), *argv], capsys)
    assert rc == 2 and err.count("\n") == 1 and msg in err


def test_busy_ports(tmp_path, capsys, monkeypatch):
    root = _sweep(tmp_path)
    FakeProc.calls = []
    monkeypatch.setattr(subprocess, "Popen", FakeProc)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        # an explicit busy port: one line, exit 2, nothing started
        rc, _, err = run_cli(["ui", str(root), "--port", str(busy)], capsys)
        assert rc == 2 and err.count("\n") == 1 and f"127.0.0.1:{busy} is in use" in err
        assert FakeProc.calls == []
        # the default port busy: another one is picked and said
        monkeypatch.setattr(ui, "DEFAULT_PORT", busy)
        rc, out, err = run_cli(["ui", str(root)], capsys)
    assert rc == 0, err
    cmd, kw = next(c for c in FakeProc.calls if "mlflow" in c[0])
    port = int(cmd[cmd.index("--port") + 1])
    assert port != busy and f"port {busy} is in use; using port {port}" in out
    assert kw["start_new_session"] is True


def test_server_failure_is_one_line_exit_1(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", lambda cmd, **kw: FakeProc(cmd, rc=1, **kw))
    rc, _, err = run_cli(["ui", str(_sweep(tmp_path)), "--port", str(ui.free_port("127.0.0.1"))],
                         capsys)
    assert rc == 1 and err.count("\n") == 1 and "exited with code 1" in err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_real_server_links_quiet_and_sigterm(tmp_path):
    import threading
    import urllib.request

    from orchestrator.store.mlflow_names import UI_DEFAULTS

    root = _sweep(tmp_path)
    port = ui.free_port("127.0.0.1")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "ui", str(root),
                             "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    up = threading.Event()
    answered: list[bool] = []

    def read() -> None:  # the moment the link is printed, the server must answer at once
        for line in proc.stdout:
            lines.append(line)
            if "MLflow UI for sw:" in line and not up.is_set():
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health",
                                                timeout=5) as r:
                        answered.append(r.status == 200)
                except OSError:
                    answered.append(False)
                up.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert up.wait(240), "".join(lines)
        assert answered == [True], "".join(lines)
        assert f"http://127.0.0.1:{port}" in "".join(lines)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            page = r.read().decode()
        for key in UI_DEFAULTS:  # a fresh browser gets the model-training view
            assert key in page
        assert page.index("localStorage") < page.index("static-files/static/js/main")
        for _ in range(3):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).read()
        time.sleep(1.0)
        assert not any("GET /" in line for line in lines), "".join(lines)  # no access log
        assert not ui.port_free("127.0.0.1", port), "the server never listened"
        children = _descendants(proc.pid)
        assert children  # mlflow server -> uvicorn (-> its worker)
        groups = {_procs()[c][1] for c in children if c in _procs()}
        assert proc.pid not in groups  # the server has its own process group
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        assert rc == 0
        deadline = time.time() + 20
        while time.time() < deadline and (children & set(_procs())):
            time.sleep(0.5)
        assert children & set(_procs()) == set()
        assert not any(g in groups for _, g in _procs().values())
        assert ui.port_free("127.0.0.1", port)
        import re

        log = re.search(r"its log: (\S+?)\)", "".join(lines))
        assert log and not os.path.exists(log.group(1))  # a clean stop leaves no log behind
    finally:
        if proc.poll() is None:
            proc.kill()
