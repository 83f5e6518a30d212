"""store/targets.py (where a sweep folder's writers write), store/artifact_home.py (where its
own MLflow store keeps artifacts) and store/staging.py (report/ replaced whole): tables of
the shapes that lead outside, and the ones that stay in."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from orchestrator.store.artifact_home import outside_artifacts, relocate
from orchestrator.store.manifest import ManifestError, read_manifest, sweep_targets
from orchestrator.store.staging import staged_folder
from orchestrator.store.targets import (
    FOLDER_ENTRIES,
    FolderError,
    check_inside,
    check_tree,
    check_utf8_path,
    resolve_local,
)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "runs" / "sw"
    (root / "parquet").mkdir(parents=True)
    (root / "sweep.json").write_text(json.dumps({"name": "sw", "trials": 1}))
    (tmp_path / "outside").mkdir()
    return root


# value in sweep.json -> where it resolves ("{root}" / "{tmp}" filled in), or None: refused
MANIFEST_VALUES = [
    ("parquet_root", "./parquet", "{root}/parquet"),
    ("parquet_root", "parquet", "{root}/parquet"),  # relative: the folder's, never the cwd's
    ("parquet_root", "./data/../parquet", "{root}/parquet"),
    ("parquet_root", "{tmp}/outside/pq", "{tmp}/outside/pq"),  # absolute outside: as named
    ("parquet_root", "s3://bucket/pq", "s3://bucket/pq"),
    ("parquet_root", "./../outside/pq", None),
    ("parquet_root", "../outside/pq", None),
    ("parquet_root", "parquet/../../outside", None),
    ("parquet_root", "./../../../../../../etc", None),
    ("parquet_root", "file://./../outside/pq", None),
    ("mlflow_uri", "sqlite:///./mlflow.db", "sqlite:///{root}/mlflow.db"),
    ("mlflow_uri", "sqlite:///mlflow.db", "sqlite:///{root}/mlflow.db"),
    ("mlflow_uri", "sqlite:///{tmp}/outside/m.db", "sqlite:///{tmp}/outside/m.db"),
    ("mlflow_uri", "http://host:5000", "http://host:5000"),
    ("mlflow_uri", "sqlite:///./../outside/m.db", None),
    ("mlflow_uri", "sqlite:///../outside/m.db", None),
    ("mlflow_uri", "sqlite:///sub/../../m.db", None),
]


@pytest.mark.parametrize("key, value, want", MANIFEST_VALUES,
                         ids=[f"{k}={v}" for k, v, _ in MANIFEST_VALUES])
def test_manifest_values_resolve_inside_or_are_refused(folder, key, value, want, monkeypatch):
    tmp = folder.parent.parent
    monkeypatch.chdir(tmp / "outside")  # a relative path must not be taken from the cwd
    m = {"name": "sw", "trials": 1, key: value.format(root=folder, tmp=tmp)}
    (folder / "sweep.json").write_text(json.dumps(m))
    if want is None:
        with pytest.raises(ManifestError, match="outside the sweep folder"):
            read_manifest(folder)
        return
    got = read_manifest(folder)[key]
    assert got == want.format(root=folder, tmp=tmp)


@pytest.mark.parametrize("entry", FOLDER_ENTRIES)
def test_every_folder_entry_symlinked_outside_is_refused(folder, entry):
    outside = folder.parent.parent / "outside" / entry
    if entry in ("sweep.json",):
        outside.write_text((folder / entry).read_text())
        (folder / entry).unlink()
    elif "." in entry.strip("."):
        outside.write_text("x")
    else:
        outside.mkdir()
    if (folder / entry).is_dir():
        (folder / entry).rmdir()
    (folder / entry).symlink_to(outside)
    with pytest.raises(FolderError, match=rf"{entry} is a symlink to .*outside"):
        sweep_targets(folder)


def test_symlinks_inside_the_folder_are_fine(folder):
    (folder / "real-parquet").mkdir()
    (folder / "parquet").rmdir()
    (folder / "parquet").symlink_to(folder / "real-parquet")
    t = sweep_targets(folder, deep=True)
    assert t.parquet_root == str(folder / "parquet")
    assert t.store_in_folder and t.store_path == folder / "mlflow.db"


@pytest.mark.parametrize("deep", ["ray/tune/t1/checkpoint_000001", "parquet/trials/sweep=sw",
                                  "mlartifacts/run/artifacts"])
def test_a_symlink_deep_in_a_written_tree_is_refused(folder, deep):
    p = folder / deep
    p.parent.mkdir(parents=True, exist_ok=True)
    p.symlink_to(folder.parent.parent / "outside", target_is_directory=True)
    sweep_targets(folder)  # the folder's own entries are fine
    with pytest.raises(FolderError, match="symlink to .*outside"):
        sweep_targets(folder, deep=True)


def test_loops_and_dangling_links(folder):
    (folder / "ray").mkdir()
    (folder / "ray" / "loop").symlink_to(folder / "ray" / "loop")
    with pytest.raises(FolderError, match="symlink loop"):
        check_tree(folder, "ray")
    (folder / "mlflow.db").symlink_to(folder / "missing.db")  # dangling, but inside
    check_inside(folder, "mlflow.db")


@pytest.mark.parametrize("target", ["../x", "/etc/passwd", "a/../../b", "./../runs2"])
def test_check_inside_refuses_by_name(folder, target):
    with pytest.raises(FolderError, match="outside the sweep folder"):
        check_inside(folder, target)


@pytest.mark.parametrize("path", ["/tmp/caf\udce9", "/tmp/\udcff/x", "rel/\udc80"])
def test_paths_not_utf8_are_one_line(path):
    with pytest.raises(FolderError, match=r"is not valid UTF-8 \(byte 0x"):
        check_utf8_path(path, "x")


def test_resolve_local_keeps_uris(folder):
    for uri in ("http://h:1", "postgresql://u:p@h/db", "gs://b/x", "mlflow-artifacts:/x"):
        assert resolve_local(folder, uri, sqlite=True, what="mlflow_uri") == uri


# --- artifact locations of the folder's own store ------------------------------------------

def _store(db: Path, loc: str, run_uris: list[str]) -> None:
    con = sqlite3.connect(db)
    with con:
        con.execute("CREATE TABLE experiments (experiment_id INTEGER, name TEXT, "
                    "artifact_location TEXT)")
        con.execute("CREATE TABLE runs (run_uuid TEXT, experiment_id INTEGER, artifact_uri "
                    "TEXT)")
        con.execute("CREATE TABLE tags (key TEXT, value TEXT, run_uuid TEXT)")
        con.execute("INSERT INTO experiments VALUES (0, 'Default', '/somewhere/mlruns/0')")
        con.execute("INSERT INTO experiments VALUES (1, 'sw', ?)", (loc,))
        for i, u in enumerate(run_uris):
            con.execute("INSERT INTO runs VALUES (?, 1, ?)", (f"r{i}", u))
            con.execute("INSERT INTO tags VALUES ('geosweep.sweep', 'sw', ?)", (f"r{i}",))
    con.close()


def _locations(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    rows = [r[0] for r in con.execute("SELECT artifact_location FROM experiments ORDER BY "
                                      "experiment_id")]
    rows += [r[0] for r in con.execute("SELECT artifact_uri FROM runs ORDER BY run_uuid")]
    con.close()
    return rows


@pytest.mark.parametrize("old", ["/old/place/sw", "/mnt/a b/sw", "file:///old/sw"])
def test_a_moved_folders_store_is_pointed_back_in(folder, old):
    db = folder / "mlflow.db"
    _store(db, f"{old}/mlartifacts", [f"{old}/mlartifacts/r0/artifacts",
                                      f"{old}/mlartifacts/r1/artifacts"])
    line = relocate(folder, db, "sw")
    assert line and "now point into" in line and "3 now point" in line
    assert _locations(db) == ["/somewhere/mlruns/0", str(folder / "mlartifacts"),
                              str(folder / "mlartifacts" / "r0" / "artifacts"),
                              str(folder / "mlartifacts" / "r1" / "artifacts")]
    assert relocate(folder, db, "sw") is None  # inside now: nothing to do


@pytest.mark.parametrize("loc", ["/home/you/precious", "/tmp/elsewhere/artifacts"])
def test_any_other_outside_location_is_refused_and_left(folder, loc):
    db = folder / "mlflow.db"
    _store(db, str(folder / "mlartifacts"), [f"{loc}/r0"])
    before = _locations(db)
    with pytest.raises(FolderError, match="outside the sweep folder"):
        relocate(folder, db, "sw")
    assert _locations(db) == before
    assert outside_artifacts(folder, f"{loc}/r0") is not None
    for remote in ("mlflow-artifacts:/1/r0", "s3://b/r0", str(folder / "mlartifacts" / "x")):
        assert outside_artifacts(folder, remote) is None


# --- staged folders (report/) ------------------------------------------------------------------

def test_staged_folder_replaces_whole_or_not_at_all(tmp_path):
    final = tmp_path / "report"
    final.mkdir()
    (final / "old.csv").write_text("old")
    with staged_folder(final) as out:
        (out / "new.csv").write_text("new")
        assert not (final / "new.csv").exists()  # nothing seen until the end
    assert sorted(p.name for p in final.iterdir()) == ["new.csv"]
    for err in (RuntimeError("a bug"), OSError(28, "No space left on device"),
                KeyboardInterrupt()):
        with pytest.raises(type(err)), staged_folder(final) as out:
            (out / "half.csv").write_text("half")
            raise err
        assert sorted(p.name for p in final.iterdir()) == ["new.csv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no temporary left


def test_staged_folder_into_nothing_yet(tmp_path):
    with staged_folder(tmp_path / "report") as out:
        (out / "a").write_text("a")
    assert (tmp_path / "report" / "a").read_text() == "a"
    assert os.listdir(tmp_path) == ["report"]
