"""Ctrl-C and a moved sweep folder, through the real CLI (issue 15, sections 2 and 3).

`geosweep run` gets SIGINT once its first trial reported: it exits 130, says how to continue,
and its MLflow parent run is KILLED. The folder is then copied elsewhere and `resume` of the
copy finishes the sweep there, leaving the original as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_spec import ROOT, cli_env, spec_with

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SPEC = spec_with(name="tiny", budget="{steps: 60, eval_every: 20, metrics_every: 0}",
                 resources="{workers_per_trial: 1, cpus_per_worker: 1}")
_env = cli_env


def _parent_status(db: Path) -> str:
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT status FROM runs WHERE run_uuid NOT IN (SELECT run_uuid FROM "
                         "tags WHERE key = 'mlflow.parentRunId')").fetchall()
    assert len(rows) == 1, rows
    return rows[0][0]


def _run_then_signal(tmp_path: Path, sig: int) -> tuple[subprocess.Popen, Path, str]:
    """`geosweep run` of SPEC, sent ``sig`` once its first trial record is written."""
    from orchestrator.store.parquet import read_trials

    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC)
    sweep = tmp_path / "out" / "tiny"
    log = tmp_path / "run.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", str(spec),
                                 "--out", str(sweep.parent)], cwd=ROOT, env=_env(), stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None:
            t = read_trials(str(sweep / "parquet"), sweep="tiny") \
                if (sweep / "parquet" / "trials").exists() else None
            if t is not None and len(t):
                break
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()[-3000:]
        os.kill(proc.pid, sig)  # once
        proc.wait(300)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc, sweep, log.read_text(errors="replace")


@pytest.mark.timeout(900)
def test_sigterm_is_an_interrupt_too(tmp_path: Path):
    """SIGTERM (kill, a scheduler) ends the sweep as Ctrl-C does; Ray's own handlers aborted
    the driver (exit 134, a C++ stack dump) and left the parent run RUNNING."""
    proc, sweep, text = _run_then_signal(tmp_path, signal.SIGTERM)
    assert proc.returncode == 130, text[-3000:]
    assert f"interrupted; continue with: geosweep resume {sweep}" in text, text[-3000:]
    assert "Traceback" not in text and "SIGTERM received" not in text
    assert _parent_status(sweep / "mlflow.db") == "KILLED"


@pytest.mark.timeout(900)
def test_ctrl_c_exit_130_then_resume_a_moved_copy(tmp_path: Path):
    from orchestrator.store.parquet import read_trials

    proc, sweep, text = _run_then_signal(tmp_path, signal.SIGINT)  # Ctrl-C, once
    assert proc.returncode == 130, text[-3000:]
    assert f"interrupted; continue with: geosweep resume {sweep}" in text, text[-3000:]
    assert "Traceback" not in text
    assert "finished in" not in text
    assert _parent_status(sweep / "mlflow.db") == "KILLED"
    before = read_trials(str(sweep / "parquet"), sweep="tiny")
    assert (before["status"] != "completed").any()  # it really was interrupted

    # copy the folder elsewhere (as `ray rsync-down` would) and resume the copy
    moved = tmp_path / "elsewhere" / "tiny"
    shutil.copytree(sweep, moved, ignore=shutil.ignore_patterns(".lock"))
    # everything of the original, byte for byte: the resume of the copy writes none of it (its
    # store's artifact locations, which name the original, are pointed into the copy first)
    original = {str(p.relative_to(sweep)): p.read_bytes() for p in sorted(sweep.rglob("*"))
                if p.is_file() and p.name != ".lock"}
    for _ in range(2):  # a loaded 2-core machine can miss Ray's 30 s raylet start window
        r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "resume", str(moved)],
                           cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
        if "could not start a local Ray" not in r.stderr:
            break
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    done = read_trials(str(moved / "parquet"), sweep="tiny")
    assert sorted(done["status"]) == ["completed", "completed"], done
    assert _parent_status(moved / "mlflow.db") == "FINISHED"
    # the original was not written by the resume of its copy
    again = read_trials(str(sweep / "parquet"), sweep="tiny")
    assert sorted(again["status"]) == sorted(before["status"])
    now = {str(p.relative_to(sweep)): p.read_bytes() for p in sorted(sweep.rglob("*"))
           if p.is_file() and p.name != ".lock"}
    assert now.keys() == original.keys() and all(now[k] == original[k] for k in now), \
        sorted(k for k in now.keys() | original.keys() if now.get(k) != original.get(k))
    assert "now point into" in r.stdout and str(moved / "mlartifacts") in r.stdout, r.stdout
    assert list(moved.glob("mlartifacts/*/artifacts/spec.yaml"))
    s = subprocess.run([sys.executable, "-m", "orchestrator.cli", "status", str(moved)],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert s.returncode == 0 and "2 recorded" in s.stdout, s.stdout + s.stderr


@pytest.mark.parametrize("written", [False, True])
def test_sigterm_while_starting_is_an_interrupt_not_exit_15(tmp_path: Path, monkeypatch, capsys,
                                                            written):
    """Before Tune's fit, ray.init's own SIGTERM handler makes the driver sys.exit(15): it is
    ended like a SIGTERM during the trials (130), with the resume line only when the sweep
    folder holds something to resume (a pure unit test: run_sweep raises what Ray's handler
    raises)."""
    import orchestrator.cli as ocli
    import orchestrator.sweep.tuner as tuner

    def dying(spec, out, **kw):
        if written:
            (out / spec.name / "spec.yaml").write_text("name: tiny\n")
        raise SystemExit(signal.SIGTERM)

    monkeypatch.setattr(tuner, "run_sweep", dying)
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC)
    rc = ocli.main(["run", str(spec), "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 130, err
    if written:
        assert f"interrupted; continue with: geosweep resume {tmp_path / 'runs' / 'tiny'}" in err
    else:
        assert "terminated (SIGTERM) while starting; nothing was written" in err
