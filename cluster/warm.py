"""A warm local Ray that sweeps join instead of starting their own (``geosweep ray start``).

Starting Ray costs a sweep ~3-4 s before its first trial and shutting it down ~1-3 s after its
last; a Ray kept running between sweeps costs neither. ``start`` runs ``ray start --head
--block`` in its own process group, listening on 127.0.0.1 only (``cluster.ray_loopback``;
``--node-ip-address=127.0.0.1`` alone is rewritten to the routable IP), with token auth on
(Ray 2.60's default for a head; ``RAY_AUTH_MODE=token``) and its own temp dir, and records it
in a small state file (``~/.geosweep/ray.json``, or ``$GEOSWEEP_RAY_STATE``). ``current``
returns that record while the Ray is alive (its process runs and its GCS port answers), so
``cluster.local.connect`` joins it when no address is given. ``stop`` ends exactly that process
group (and stragglers naming its temp dir); never a bare ``ray stop``, which ends every Ray on
the machine.
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
from pathlib import Path
from typing import Any

from cluster.ray_loopback import LOOPBACK_VAR

__all__ = ["state_file", "current", "start", "stop", "join_env", "WarmRayError"]


class WarmRayError(RuntimeError):
    """The warm Ray could not be started; the message is one line (plus its log's tail)."""


def state_file() -> Path:
    return Path(os.environ.get("GEOSWEEP_RAY_STATE")
                or Path.home() / ".geosweep" / "ray.json")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not yet reaped) is not alive
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    return True


def _port_open(address: str, timeout: float = 0.5) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def current() -> dict[str, Any] | None:
    """The warm Ray's record (``address``, ``pid``, ``temp_dir``, ``num_cpus``, ``started``)
    when it is alive; None otherwise (no record, or a stale one)."""
    try:
        rec = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or not {"address", "pid"} <= rec.keys():
        return None
    if not _alive(int(rec["pid"])) or not _port_open(str(rec["address"])):
        return None
    return rec


def _new_token() -> Path:
    """A fresh token of this warm Ray, readable by this user only (not ``~/.ray/auth_token``,
    which other Rays on the machine may write)."""
    import secrets

    path = state_file().with_name("ray_auth_token")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def join_env(rec: dict[str, Any]) -> dict[str, str]:
    """What a driver needs in its environment to join the warm Ray of ``rec``."""
    env = {"RAY_AUTH_MODE": "token"}
    if rec.get("token_path"):
        env["RAY_AUTH_TOKEN_PATH"] = str(rec["token_path"])
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(num_cpus: int | None = None, port: int | None = None, timeout: float = 120.0,
          env: dict[str, str] | None = None) -> dict[str, Any]:
    """Start the warm Ray (or return the one already running). ``env``: extra environment
    of its processes (the caller passes ``cluster.local.ray_env()``)."""
    extra = env or {}
    rec = current()
    if rec is not None:
        return rec
    port = port or _free_port()
    # Ray's unix sockets live under the temp dir: short path (108-byte sun_path limit)
    temp_dir = tempfile.mkdtemp(prefix="gswarm-", dir="/tmp" if os.path.isdir("/tmp") else None)
    log = Path(temp_dir) / "ray-start.log"
    env = dict(os.environ)
    env.update(extra)
    env.setdefault(LOOPBACK_VAR, "0")  # every server of this one-node Ray on 127.0.0.1
    env.pop("RAY_AUTH_TOKEN", None)
    env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(_new_token())})
    # jobs started through this Ray find this Python's tools first
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    ray_bin = Path(sys.executable).with_name("ray")
    args = [str(ray_bin) if ray_bin.exists() else "ray", "start", "--head", "--block",
            "--disable-usage-stats", f"--port={port}", "--node-ip-address=127.0.0.1",
            "--include-dashboard=false", f"--temp-dir={temp_dir}",
            f"--ray-client-server-port={_free_port()}"]
    if num_cpus is not None:
        args.append(f"--num-cpus={num_cpus}")
    with open(log, "wb") as fh:
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    rec = {"address": f"127.0.0.1:{port}", "pid": proc.pid, "temp_dir": temp_dir,
           "num_cpus": num_cpus, "started": time.time(), "log": str(log),
           "token_path": env["RAY_AUTH_TOKEN_PATH"]}
    deadline = time.time() + timeout
    while time.time() < deadline:
        if "Ray runtime started" in log.read_text(errors="replace"):
            path = state_file()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(rec, indent=2))
            return rec
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])[-1500:]
    _stop_tree(proc.pid, temp_dir)
    raise WarmRayError(f"ray start failed or timed out after {timeout:.0f} s: {tail}")


def stop(timeout: float = 15.0) -> bool:
    """Stop the warm Ray this machine's state file names; False when none was running."""
    path = state_file()
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    path.unlink(missing_ok=True)
    if not isinstance(rec, dict) or "pid" not in rec:
        return False
    was = _alive(int(rec["pid"]))
    _stop_tree(int(rec["pid"]), str(rec.get("temp_dir") or ""), timeout)
    return was


def _stop_tree(pid: int, temp_dir: str, timeout: float = 15.0) -> None:
    # SIGTERM to the leader: `ray start --block` then shuts its Ray processes down itself;
    # what is left of its process group (and any process naming its temp dir) gets SIGKILL.
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.time() + timeout
    while time.time() < deadline and _alive(pid):
        time.sleep(0.2)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if temp_dir and temp_dir.startswith(tempfile.gettempdir()):
        _kill_marked(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _kill_marked(marker: str) -> None:
    """SIGKILL this user's processes whose command line names ``marker`` (our temp dir)."""
    me, uid = os.getpid(), os.getuid()
    for d in Path("/proc").glob("[0-9]*"):
        try:
            pid = int(d.name)
            if d.stat().st_uid != uid:
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except (OSError, ValueError):
            continue
        if pid != me and marker in cmd:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
