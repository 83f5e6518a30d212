"""Provenance: git state of a real throwaway repo, versions from package metadata."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import metadata

import pytest

from orchestrator.sweep.provenance import git_info, provenance

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("git") is None, reason="needs git"),
]


def _git(repo, *args) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, cwd=repo, check=True, capture_output=True, text=True).stdout


def test_git_info_clean_dirty_and_outside(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    assert git_info(str(repo))["sha"] == "unknown"  # no commit yet
    _git(repo, "add", "a.py")
    _git(repo, "commit", "-q", "-m", "c")
    sha = _git(repo, "rev-parse", "HEAD").strip()
    assert git_info(str(repo)) == {"sha": sha, "dirty": False, "diff_hash": ""}

    (repo / "a.py").write_text("x = 2\n")
    one = git_info(str(repo))
    assert one["sha"] == sha and one["dirty"] is True and len(one["diff_hash"]) == 12
    (repo / "a.py").write_text("x = 3\n")
    two = git_info(str(repo))
    assert two["diff_hash"] != one["diff_hash"]  # a different edit, a different hash
    (repo / "a.py").write_text("x = 2\n")
    assert git_info(str(repo)) == one  # the same edit, the same hash

    outside = tmp_path / "plain"
    outside.mkdir()
    assert git_info(str(outside))["sha"] == "unknown"


def test_provenance_fields():
    p = provenance()
    assert p["versions"]["pyarrow"] == metadata.version("pyarrow")
    assert p["versions"]["mlflow"] == metadata.version("mlflow")
    assert p["python"] == ".".join(map(str, sys.version_info[:3]))
    assert set(p["git"]) == {"sha", "dirty", "diff_hash"}
    assert p["hostname"] and isinstance(p["command"], str)
