"""One writer per sweep folder (the flock) and a sweep.json that moves with its folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.store.lock import SweepLocked, holds_lock, lock_sweep, unlock_sweep
from orchestrator.store.manifest import ManifestError, read_manifest, write_manifest

_HOLD = ("import sys; sys.path.insert(0, sys.argv[2]); from orchestrator.store.lock import "
         "lock_sweep; lock_sweep(sys.argv[1]); print('locked', flush=True); "
         "import time; time.sleep(60)")
ROOT = Path(__file__).resolve().parents[3]


def _holder(folder: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder), str(ROOT)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "locked"
    return p


@pytest.mark.timeout(60)
def test_second_writer_refused_then_lock_freed_by_holder_death(tmp_path: Path):
    sweep = tmp_path / "s"
    p = _holder(sweep)
    try:
        with pytest.raises(SweepLocked, match=rf"pid {p.pid} on "):
            lock_sweep(sweep)
        assert not holds_lock(sweep)
        os.kill(p.pid, signal.SIGKILL)  # kill -9: the kernel drops the flock
        p.wait(10)
        lock_sweep(sweep)  # a stale lock file is no lock
        assert holds_lock(sweep)
        assert json.loads((sweep / ".lock").read_text())["pid"] == os.getpid()
        lock_sweep(sweep)  # re-entrant in the holder
    finally:
        p.kill()
        p.wait()
        unlock_sweep(sweep)
    assert not holds_lock(sweep)


@pytest.mark.timeout(60)
def test_unlock_lets_another_process_in(tmp_path: Path):
    sweep = tmp_path / "s"
    lock_sweep(sweep)
    unlock_sweep(sweep)
    p = _holder(sweep)  # would block (and time out) if the lock were still held
    p.kill()
    p.wait()


def test_manifest_paths_are_relative_and_follow_the_folder(tmp_path: Path):
    root = tmp_path / "a" / "tiny"
    (root / "parquet").mkdir(parents=True)
    write_manifest(root, {"name": "tiny", "trials": 3,
                          "mlflow_uri": f"sqlite:///{root / 'mlflow.db'}",
                          "parquet_root": str(root / "parquet")})
    raw = json.loads((root / "sweep.json").read_text())
    assert raw["mlflow_uri"] == "sqlite:///./mlflow.db"
    assert raw["parquet_root"] == "./parquet"
    moved = tmp_path / "b" / "tiny"
    moved.parent.mkdir()
    root.rename(moved)
    m = read_manifest(moved)
    assert m["mlflow_uri"] == f"sqlite:///{moved / 'mlflow.db'}"
    assert m["parquet_root"] == str(moved / "parquet")


def test_manifest_keeps_outside_uris_and_maps_old_absolute_ones(tmp_path: Path):
    root = tmp_path / "tiny"
    (root / "parquet").mkdir(parents=True)
    write_manifest(root, {"name": "tiny", "trials": 1, "mlflow_uri": "http://127.0.0.1:5000",
                          "parquet_root": "s3://bucket/geo"})
    m = read_manifest(root)
    assert (m["mlflow_uri"], m["parquet_root"]) == ("http://127.0.0.1:5000", "s3://bucket/geo")
    # an older sweep.json with absolute paths of the folder's former place
    (root / "sweep.json").write_text(json.dumps({
        "name": "tiny", "trials": 1, "mlflow_uri": "sqlite:////gone/tiny/mlflow.db",
        "parquet_root": "/gone/tiny/parquet"}))
    m = read_manifest(root)
    assert m["parquet_root"] == str(root / "parquet")


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b'{"name": ""}', b'{"name": "x", "trials": -2}',
                                 b'{"name": "x", "parquet_root": 3}'])
def test_broken_manifest_is_one_line(tmp_path: Path, raw: bytes):
    (tmp_path / "sweep.json").write_bytes(raw)
    with pytest.raises(ManifestError, match=r"sweep\.json") as e:
        read_manifest(tmp_path)
    assert "\n" not in str(e.value)


def test_copy_of_an_old_absolute_manifest_reads_itself_not_the_original(tmp_path: Path):
    """An rsync'd copy of a sweep whose sweep.json predates relative paths: while the original
    folder still exists, status/report/eval of the copy must read and write the copy."""
    orig = tmp_path / "orig" / "tiny"
    copy = tmp_path / "copy" / "tiny"
    for root in (orig, copy):
        (root / "parquet").mkdir(parents=True)
        (root / "mlflow.db").write_bytes(b"")
        (root / "sweep.json").write_text(json.dumps({
            "name": "tiny", "trials": 1, "mlflow_uri": f"sqlite:///{orig / 'mlflow.db'}",
            "parquet_root": str(orig / "parquet")}))
    m = read_manifest(copy)
    assert m["parquet_root"] == str(copy / "parquet")
    assert m["mlflow_uri"] == f"sqlite:///{copy / 'mlflow.db'}"
