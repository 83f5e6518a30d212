"""The third round of hostile cases (issue 28), one table per class of failure: the tables are
in tests/orchestrator/hostile_stores.py and hostile_inputs.py, the runner is
tests/orchestrator/cli/test_hostile_round3.py, and this module holds their Case and setups.
Each class is many cases of one kind, over every command it concerns, not one example:

- ``escape``: writes that would leave the sweep folder (symlinks anywhere on the way, relative
  paths in sweep.json, artifact locations in the folder's own mlflow.db);
- ``foreign_store``: an mlflow.db that is not (this MLflow's) MLflow store;
- ``broken_store``: an mlflow.db that is a folder, a pipe, truncated, garbage, locked, a loop;
- ``secrets``: passwords in URLs and tokens must never be printed;
- ``tracebacks``: non-UTF-8 paths, Parquet parts of the wrong types, seeds, odd layers,
  refused checkpoints under ``resume``;
- ``answers``: wrong or unclear answers (caps, garbage URIs, which field is named first,
  bytes that are not UTF-8).

Every case: the exit code, one stderr line matching a pattern (code 0: a pattern on stdout),
no traceback, no Ray started, no secret printed, and no file under the case's folder changed
or created but those the case names (``may_change``): a foreign database, a folder outside
the sweep, an earlier report stay byte for byte as they were.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import hostile_kit as kit

SECRET = "S3cr3tPw-9f2"  # never printed (class secrets); appears in the URLs the cases give


@dataclass
class Case:
    cls: str  # the class of failure (the module docstring)
    id: str
    argv: list[str]  # {tmp}, {spec}, {sweep}, {model}, {fake}, {http} are filled in
    code: int
    line: str  # a regex on the one stderr line (code 0: on stdout)
    setup: Callable[[Path], object] | None = None
    spec: str | None = None
    env: dict | None = None
    makes: tuple[str, ...] = ()  # code 0: globs that must exist afterwards
    may_change: tuple[str, ...] = ()  # globs (under tmp) that may be written or created
    cwd: str | None = None  # relative to tmp (default: tmp)
    skip_root: bool = False  # meaningless as root (permissions)


_EVAL = ["eval", "{fake}", "--no-hub", "--max-batches", "1"]
_OUT = ["--out", "{tmp}/out"]
_CONT = ["continuity", "{model}", "--out", "{tmp}/c"]
# what a successful eval / report of the fake sweep writes
_EVAL_WRITES = ("runs/fake/parquet/eval/**",)
_REPORT_WRITES = ("runs/fake/report/**", "runs/fake/mlartifacts/**", "runs/fake/mlflow.db")


def _outside(t: Path) -> Path:
    """A folder of the user's beside the sweep, with a file that must stay as it is."""
    o = t / "outside"
    o.mkdir(exist_ok=True)
    (o / "victim.txt").write_text("precious\n")
    return o


def _link(root: Path, name: str, t: Path, folder: bool = True) -> None:
    """``root/name`` replaced by a symlink into ``outside/`` (its content moved there)."""
    o = _outside(t)
    src = root / name
    dest = o / name
    if src.exists():
        shutil.move(str(src), str(dest))
    elif folder:
        dest.mkdir(parents=True, exist_ok=True)
    else:
        dest.write_text("x")
    src.symlink_to(dest, target_is_directory=dest.is_dir())


def _manifest(root: Path, **kv) -> None:
    import json

    m = json.loads((root / "sweep.json").read_text())
    m.update(kv)
    (root / "sweep.json").write_text(json.dumps(m))


def _fake(t: Path, edit: Callable[[Path], object] | None = None) -> Path:
    root = kit.fake_sweep(t)
    _outside(t)
    if edit is not None:
        edit(root)
    return root


def _running(root: Path, trial: str = "abc12_00000") -> None:
    """The trial's record says it was still running (an interrupted sweep)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = root / "parquet" / "trials" / "sweep=fake" / f"trial={trial}.parquet"
    t = pq.read_table(f)
    i = t.schema.get_field_index("status")
    t = t.set_column(i, "status", pa.array(["running"] * len(t), type=pa.string()))
    pq.write_table(t, f)


def _trial0_ckpt(root: Path) -> Path:
    return [p for p in kit.state_files(root) if "abc12_00000" in str(p)][-1]


# --- stores that are not ours, and broken ones ---------------------------------------------

def _store_edit(make: Callable[[Path], object]) -> Callable[[Path], object]:
    """A setup: the fake sweep with its mlflow.db changed by ``make``."""
    return lambda t: _fake(t, lambda r: make(r / "mlflow.db"))


def _theirs_with(make: Callable[[Path], object]) -> Callable[[Path], object]:
    return lambda t: _theirs(t, make)


def _theirs(t: Path, make: Callable[[Path], object]) -> None:
    """``t/their.db``: a copy of a real MLflow store, then changed by ``make``."""
    kit.fake_sweep(t / "src")
    shutil.copy(t / "src" / "runs" / "fake" / "mlflow.db", t / "their.db")
    shutil.rmtree(t / "src")
    make(t / "their.db")


def _sqlite(path: Path, *sql: str) -> None:
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    with con:
        for s in sql:
            con.execute(s)
    con.close()


def _old_schema(path: Path) -> None:
    con = sqlite3.connect(path)
    with con:
        con.execute("UPDATE alembic_version SET version_num = '0584bdc529eb'")
    con.close()


def _no_version(path: Path) -> None:
    con = sqlite3.connect(path)
    with con:
        con.execute("DROP TABLE alembic_version")
    con.close()


FOREIGN: dict[str, tuple[Callable[[Path], None], str]] = {
    "notes-db": (lambda p: _sqlite(p, "CREATE TABLE notes (x)", "INSERT INTO notes VALUES (1)"),
                 r"not an MLflow store \(tables: notes\)"),
    "optuna-db": (lambda p: _sqlite(p, "CREATE TABLE studies (study_id INTEGER)",
                                    "CREATE TABLE trials (trial_id INTEGER)",
                                    "CREATE TABLE alembic_version (version_num TEXT)"),
                  r"not an MLflow store \(tables: alembic_version, studies, trials\)"),
    "half-mlflow": (lambda p: _sqlite(p, "CREATE TABLE experiments (experiment_id INTEGER)",
                                      "CREATE TABLE runs (run_uuid TEXT)"),
                    r"not an MLflow store"),
    "no-tables": (lambda p: _sqlite(p, "CREATE TABLE t (x)", "DROP TABLE t"),
                  r"SQLite file without tables"),
    "zero-bytes": (lambda p: (p.unlink(missing_ok=True), p.write_bytes(b"")),
                   r"is an empty file"),
    "old-schema": (_old_schema, r"MLflow store of schema 0584bdc529eb.*never migrates"),
    "no-version": (_no_version, r"MLflow store of schema unknown.*never migrates"),
}



def _locked_db(path: Path) -> None:
    """Another process holds an exclusive lock on the database (a stuck writer)."""
    code = ("import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None);"
            " c.execute('BEGIN EXCLUSIVE'); print('ok', flush=True); time.sleep(120)")
    p = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ok"
    kit.CHILDREN.append(p)


def _swap(path: Path, make: Callable[[Path], object]) -> None:
    path.unlink(missing_ok=True)
    make(path)


BROKEN: dict[str, tuple[Callable[[Path], object], str]] = {
    "folder": (lambda p: _swap(p, lambda q: q.mkdir()), r"is a folder, not an SQLite file"),
    "fifo": (lambda p: _swap(p, lambda q: os.mkfifo(q)), r"is not a regular file"),
    "truncated": (lambda p: kit.truncate(p, 20000), r"is (unreadable|corrupt)"),
    "garbage": (lambda p: _swap(p, lambda q: q.write_bytes(b"\x00garbage" * 100)),
                r"is not an SQLite database"),
    "header-only": (lambda p: _swap(p, lambda q: q.write_bytes(b"SQLite format 3\x00" +
                                                               b"\xff" * 84)),
                    r"is (unreadable|corrupt)"),
    "locked": (_locked_db, r"is locked by another process"),
}


CLASSES = ("escape", "foreign_store", "broken_store", "secrets", "tracebacks", "answers")
