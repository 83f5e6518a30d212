"""The store and folder tables of issue 28 (tests/orchestrator/hostile_round3.py says the
rules): ``escape``, ``foreign_store``, ``broken_store``."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import hostile_kit as kit
from hostile_round3 import (
    _CONT,
    _EVAL,
    _EVAL_WRITES,
    _OUT,
    _REPORT_WRITES,
    BROKEN,
    FOREIGN,
    Case,
    _fake,
    _link,
    _manifest,
    _outside,
    _store_edit,
    _theirs_with,
    _trial0_ckpt,
)

# --- class: escape --------------------------------------------------------------------------

_ENTRY_LINKS = ("mlflow.db", "parquet", "report", "ray", "mlartifacts", "optuna.db",
                "spec.yaml", ".lock")
_MANIFEST_ESCAPES = {
    "parquet-dot-dotdot": {"parquet_root": "./../outside/parquet"},
    "parquet-bare-dotdot": {"parquet_root": "../outside/parquet"},
    "parquet-down-and-out": {"parquet_root": "parquet/../../outside/parquet"},
    "mlflow-dot-dotdot": {"mlflow_uri": "sqlite:///./../outside/mlflow.db"},
    "mlflow-bare-dotdot": {"mlflow_uri": "sqlite:///../outside/mlflow.db"},
}


def _escape_cases() -> list[Case]:
    out: list[Case] = []
    for cmd in ("eval", "report", "ui", "resume"):
        argv = _EVAL if cmd == "eval" else [cmd, "{fake}"]
        for name in _ENTRY_LINKS:
            out.append(Case("escape", f"{cmd}-symlinked-{name.strip('.')}", argv, 2,
                            r"is a symlink to .*outside the sweep folder",
                            setup=lambda t, n=name: _fake(t, lambda r: _link(
                                r, n, t, folder=n not in ("mlflow.db", "optuna.db",
                                                          "spec.yaml", ".lock")))))
        for kind, kv in _MANIFEST_ESCAPES.items():
            out.append(Case("escape", f"{cmd}-manifest-{kind}", argv, 2,
                            r"sweep\.json (parquet_root|mlflow_uri): .* outside the sweep "
                            r"folder", setup=lambda t, kv=kv: _fake(t, lambda r: _manifest(
                                r, **kv))))
        out.append(Case("escape", f"{cmd}-path-through-linked-folder", argv, 2,
                        r"symlink to .*outside the sweep folder",
                        setup=lambda t: _fake(t, lambda r: _through_link(r, t))))
    # a reader may follow a folder the user linked elsewhere (a bigger disk); writers may not
    out.append(Case("escape", "status-reads-a-symlinked-parquet", ["status", "{fake}"], 0,
                    r"3 trials planned, 3 recorded",
                    setup=lambda t: _fake(t, lambda r: _link(r, "parquet", t))))
    # deeper than the folder's own entries: where each writer writes
    out += [
        Case("escape", "eval-symlinked-parquet-eval", _EVAL, 2,
             r"parquet/eval is a symlink to .*outside",
             setup=lambda t: _fake(t, lambda r: _link(r / "parquet", "eval", t))),
        Case("escape", "resume-symlink-deep-in-ray", ["resume", "{fake}"], 2,
             r"checkpoint_000001 is a symlink to .*outside",
             setup=lambda t: _fake(t, lambda r: _link(_trial0_ckpt(r).parents[1].parent,
                                                      "checkpoint_000001", t))),
        Case("escape", "resume-symlink-deep-in-parquet", ["resume", "{fake}"], 2,
             r"sweep=fake is a symlink to .*outside",
             setup=lambda t: _fake(t, lambda r: _link(r / "parquet" / "trials", "sweep=fake",
                                                      t))),
        Case("escape", "resume-symlink-loop", ["resume", "{fake}"], 2, r"symlink loop",
             setup=lambda t: _fake(t, lambda r: (r / "ray" / "loop").symlink_to(
                 r / "ray" / "loop"))),
        Case("escape", "run-resume-symlinked-mlflow-db", ["run", "{fake}/spec.yaml", "--out",
                                                          "{tmp}/runs", "--resume"], 2,
             r"mlflow.db is a symlink to .*outside",
             setup=lambda t: _fake(t, lambda r: _link(r, "mlflow.db", t, folder=False))),
        # the folder's own store says its artifacts live elsewhere (not a moved sweep's)
        Case("escape", "report-artifacts-elsewhere", ["report", "{fake}"], 0,
             r"not logged: the MLflow store in .* keeps this run's artifacts at .*outside",
             setup=lambda t: _fake(t, lambda r: _artifacts_to(r, t / "outside" / "art")),
             makes=("runs/fake/report/report.md",), may_change=("runs/fake/report/**",)),
        Case("escape", "resume-artifacts-elsewhere", ["resume", "{fake}"], 2,
             r"keeps this run's artifacts at .*outside",
             setup=lambda t: _fake(t, lambda r: _artifacts_to(r, t / "outside" / "art"))),
        # a moved copy: its store's locations point back into the copy, never the original
        Case("escape", "report-moved-copy-writes-itself", ["report", "{fake}"], 0,
             r"now point into .*runs/fake/mlartifacts", setup=_moved_copy,
             makes=("runs/fake/mlartifacts/*/artifacts/report/report.md",),
             may_change=_REPORT_WRITES),
    ]
    return out


def _through_link(root: Path, t: Path) -> None:
    """sweep.json names an absolute place inside the folder by name that a symlinked folder
    on its way leads outside."""
    o = _outside(t)
    (o / "pq").mkdir()
    (root / "data").symlink_to(o, target_is_directory=True)
    _manifest(root, parquet_root=str(root / "data" / "pq"))


def _artifacts_to(root: Path, where: Path) -> None:
    con = sqlite3.connect(root / "mlflow.db")
    with con:
        con.execute("UPDATE experiments SET artifact_location = ? WHERE name = 'fake'",
                    (str(where),))
        con.execute("UPDATE runs SET artifact_uri = ? || '/' || run_uuid", (str(where),))
    con.close()


def _moved_copy(t: Path) -> Path:
    """An original sweep folder (t/orig/fake, its store's locations its own), copied to
    t/runs/fake: report of the copy must not write into the original."""
    base = kit.fake_sweep(t / "o1")
    orig = t / "orig" / "fake"
    shutil.copytree(base, orig)
    shutil.rmtree(t / "o1")
    con = sqlite3.connect(orig / "mlflow.db")
    old = con.execute("SELECT artifact_location FROM experiments WHERE name = 'fake'"
                      ).fetchone()[0].rsplit("/mlartifacts", 1)[0]
    with con:
        con.execute("UPDATE experiments SET artifact_location = replace(artifact_location, ?, "
                    "?)", (old, str(orig)))
        con.execute("UPDATE runs SET artifact_uri = replace(artifact_uri, ?, ?)",
                    (old, str(orig)))
    con.close()
    shutil.copytree(orig, t / "runs" / "fake")
    return t / "runs" / "fake"


def _foreign_cases() -> list[Case]:
    out: list[Case] = []
    for kind, (make, pat) in FOREIGN.items():
        fk = _store_edit(make)
        out += [
            Case("foreign_store", f"ui-{kind}", ["ui", "{fake}"], 2, pat, setup=fk),
            Case("foreign_store", f"eval-{kind}", _EVAL, 0, rf"not logging to MLflow: .*{pat}",
                 setup=fk, makes=("runs/fake/parquet/eval/sweep=fake/*.parquet",),
                 may_change=_EVAL_WRITES),
            Case("foreign_store", f"report-{kind}", ["report", "{fake}"], 0,
                 rf"not logged: .*{pat}", setup=fk, makes=("runs/fake/report/arms.csv",),
                 may_change=("runs/fake/report/**",)),
            Case("foreign_store", f"resume-{kind}", ["resume", "{fake}"], 2, pat, setup=fk),
            Case("foreign_store", f"run-mlflow-uri-{kind}",
                 ["run", "{spec}", *_OUT, "--mlflow-uri", "sqlite:///{tmp}/their.db"], 2,
                 rf"--mlflow-uri: .*{pat}", setup=_theirs_with(make)),
            Case("foreign_store", f"continuity-mlflow-uri-{kind}",
                 [*_CONT, "--mlflow-uri", "sqlite:///{tmp}/their.db"], 2,
                 rf"--mlflow-uri: .*{pat}", setup=_theirs_with(make)),
        ]
    return out


def _broken_cases() -> list[Case]:
    out: list[Case] = []
    for kind, (make, pat) in BROKEN.items():
        fk, theirs = _store_edit(make), _theirs_with(make)
        out += [
            Case("broken_store", f"ui-{kind}", ["ui", "{fake}"], 2, pat, setup=fk),
            Case("broken_store", f"eval-{kind}", _EVAL, 0, rf"not logging to MLflow: .*{pat}",
                 setup=fk, makes=("runs/fake/parquet/eval/sweep=fake/*.parquet",),
                 may_change=_EVAL_WRITES),
            Case("broken_store", f"report-{kind}", ["report", "{fake}"], 0,
                 rf"not logged: .*{pat}", setup=fk,
                 makes=("runs/fake/report/report.md", "runs/fake/report/arms.csv",
                        "runs/fake/report/trials.csv", "runs/fake/report/metrics.csv"),
                 may_change=("runs/fake/report/**",)),
            Case("broken_store", f"resume-{kind}", ["resume", "{fake}"], 2, pat, setup=fk),
            Case("broken_store", f"run-mlflow-uri-{kind}",
                 ["run", "{spec}", *_OUT, "--mlflow-uri", "sqlite:///{tmp}/their.db"], 2,
                 rf"--mlflow-uri: .*{pat}", setup=theirs),
            Case("broken_store", f"continuity-mlflow-uri-{kind}",
                 [*_CONT, "--mlflow-uri", "sqlite:///{tmp}/their.db"], 2,
                 rf"--mlflow-uri: .*{pat}", setup=theirs),
        ]
    # the default store of continuity's --out, broken
    for kind in ("folder", "garbage", "truncated"):
        make, pat = BROKEN[kind]
        out.append(Case("broken_store", f"continuity-out-store-{kind}", _CONT, 2,
                        rf"--out: .*{pat}", setup=lambda t, m=make: _cont_out_store(t, m)))
    return out


def _cont_out_store(t: Path, make: Callable[[Path], object]) -> None:
    (t / "c").mkdir()
    kit.fake_sweep(t / "src")
    shutil.copy(t / "src" / "runs" / "fake" / "mlflow.db", t / "c" / "mlflow.db")
    shutil.rmtree(t / "src")
    make(t / "c" / "mlflow.db")


CASES: list[Case] = _escape_cases() + _foreign_cases() + _broken_cases()
