"""Where a run came from: code version, libraries, machine, command line.

Logged as tags and ``provenance.json`` on the sweep's MLflow parent run. Versions are read
from package metadata, so nothing heavy (torch, ray) is imported here.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import socket
import subprocess
import sys
from importlib import metadata

__all__ = ["provenance", "git_info", "library_versions"]

LIBRARIES = ("torch", "ray", "mlflow", "optuna", "pyarrow", "pydantic", "numpy")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(args: list[str], cwd: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=10,
                             check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode("utf-8", "replace")


def git_info(repo: str = _REPO) -> dict[str, object]:
    """``{sha, dirty, diff_hash}`` of the repo at ``repo``; "unknown" outside git.

    ``diff_hash`` is the first 12 hex digits of sha256(``git diff HEAD`` + untracked file
    names), "" when clean: two runs with the same SHA and hash ran the same code.
    """
    sha = _git(["rev-parse", "HEAD"], repo)
    status = _git(["status", "--porcelain"], repo)
    if status is None:  # not a git checkout (or no git)
        return {"sha": "unknown", "dirty": "unknown", "diff_hash": "unknown"}
    diff = _git(["diff", "HEAD"], repo) if sha else None
    untracked = "\n".join(line for line in status.splitlines() if line.startswith("??"))
    dirty = bool(status.strip())
    blob = (diff or "") + untracked if sha else status
    return {
        "sha": sha.strip() if sha else "unknown",  # a repo without commits has no HEAD
        "dirty": dirty,
        "diff_hash": hashlib.sha256(blob.encode()).hexdigest()[:12] if dirty else "",
    }


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def provenance() -> dict[str, object]:
    """Git state, python and library versions, host and command line of this process."""
    return {
        "git": git_info(),
        "python": platform.python_version(),
        "versions": library_versions(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "command": shlex.join(sys.argv),
    }
