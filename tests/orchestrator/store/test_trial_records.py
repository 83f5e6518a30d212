"""Trial records: the one-row file as the sink writes it (no statistics, dictionary pages or
compression) reads back as the pyarrow-default file did, and an unchanged record is not
written again."""

from __future__ import annotations

import math
import os
import shutil

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.store.parquet import (
    ParquetSink,
    _trial_row,
    read_trial_records,
    read_trials,
)

pytestmark = pytest.mark.timeout(60)


def _records() -> list[dict]:
    """Every kind of value a record holds: nulls, NaN and inf, bools, numpy scalars,
    containers as JSON, conditional params, slash scalars, a timing dict."""
    return [
        {"trial": "t1", "status": "completed", "arm": "family=pre_ln", "seed": 0,
         "last_step": 705, "objective": 3.0, "final_train_loss": 3.9, "final_val_loss": 3.0,
         "best_val_loss": float("nan"), "started_at": 1.5, "ended_at": 7.25, "wall_s": 5.75,
         "train_s": 5.0, "setup_s": 0.5, "overhead_s": 0.75, "timing_json": '{"train_s": 5.0}',
         "node": "host:10.0.0.1", "retries": 1, "spikes": 2, "spikes_rule": "r1",
         "params": {"optim.lr": np.float64(1e-3), "train.seed": np.int64(0), "flag": True,
                    "model": {"residual": {"family": "pre_ln"}}, "layers": [1, 2],
                    "opt": {}, "none": None},
         "scalars": {"train/loss": 3.9, "val/loss": 3.0, "val/inf": math.inf, "lr": 1.0}},
        {"trial": "t2", "status": "diverged", "divergence_reason": "nonfinite_loss",
         "divergence_step": 7, "divergence_detail": "loss nan at step 7",
         "params": {"optim.lr": 1, "model.residual.p": -math.inf,
                    "model.residual.family": "spheret"},
         "scalars": {"val/loss": 10.8}},
        {"trial": "t3", "status": "running", "params": {}},
    ]


def _write_default(root: str, record: dict) -> None:
    """The record as the sink wrote it before: the same columns, pyarrow's default options."""
    from orchestrator.store.run_names import run_name

    if not record.get("name"):
        record = {**record, "name": run_name(record.get("params") or {})}
    table = pa.table({n: pa.array([v], type=t) for n, t, v in _trial_row(record)})
    folder = os.path.join(root, "trials", "sweep=sw")
    os.makedirs(folder, exist_ok=True)
    pq.write_table(table, os.path.join(folder, f"trial={record['trial']}.parquet"))


def test_record_reads_back_as_the_default_written_file(tmp_path):
    new, old = str(tmp_path / "new"), str(tmp_path / "old")
    sink = ParquetSink(new, "sw")
    for rec in _records():
        assert sink.write_trial(rec)
        _write_default(old, rec)
    for name in ("t1", "t2", "t3"):  # file by file: columns, types and values
        f = f"trials/sweep=sw/trial={name}.parquet"
        a, b = pq.read_table(os.path.join(new, f)), pq.read_table(os.path.join(old, f))
        assert a.schema.equals(b.schema, check_metadata=True)
        assert repr(a.to_pylist()) == repr(b.to_pylist())  # repr: NaN equals NaN
        meta = pq.ParquetFile(os.path.join(new, f)).metadata.row_group(0).column(0)
        assert meta.compression == "UNCOMPRESSED" and not meta.is_stats_set
    pd.testing.assert_frame_equal(read_trials(new).sort_values("trial").reset_index(drop=True),
                                  read_trials(old).sort_values("trial").reset_index(drop=True))
    got, want = read_trial_records(new, "sw"), read_trial_records(old, "sw")
    assert repr(sorted(got, key=lambda r: r["trial"])) == repr(
        sorted(want, key=lambda r: r["trial"]))  # repr: NaN equals NaN
    t1 = next(r for r in got if r["trial"] == "t1")
    assert t1["params"]["layers"] == [1, 2] and t1["params"]["flag"] is True
    assert t1["scalars"]["val/inf"] == math.inf and "lr" not in t1["scalars"]
    assert t1["timing"] == {"train_s": 5.0} and t1["retries"] == 1

    def sql(root: str) -> list[tuple]:
        return duckdb.sql(
            "select trial, status, \"optim.lr\", \"val/loss\", divergence_step from "
            f"read_parquet('{root}/trials/**/*.parquet', hive_partitioning=true, "
            "union_by_name=true) order by trial").fetchall()

    assert sql(new) == sql(old) == [("t1", "completed", 1e-3, 3.0, None),
                                    ("t2", "diverged", 1.0, 10.8, 7),
                                    ("t3", "running", None, None, None)]


def test_an_unchanged_record_is_not_written_again(tmp_path):
    root = str(tmp_path)
    sink = ParquetSink(root, "sw")
    rec = _records()[0]
    path = tmp_path / "trials/sweep=sw/trial=t1.parquet"
    assert sink.write_trial(rec)
    first = path.stat().st_ino  # every write renames a new file over the old one
    assert not sink.write_trial(dict(rec))  # the same record (NaN included): skipped
    assert path.stat().st_ino == first
    # a change the reader sees is written: a value, a type (1.0 -> 1), a sign of zero
    for change in ({"status": "stopped"}, {"scalars": {**rec["scalars"], "lr": 2.0,
                                                         "val/loss": 3.0000001}},
                   {"params": {**rec["params"], "optim.lr": 1}},
                   {"objective": -0.0}, {"objective": 0.0}):
        rec = {**rec, **change}
        assert sink.write_trial(rec)
        assert read_trial_records(root, "sw")[0]["status"] == rec["status"]
    assert read_trial_records(root, "sw")[0]["params"]["optim.lr"] == 1
    assert not sink.write_trial(rec)
    # a new sink (a resumed driver) does not know what is on disk: it writes
    assert ParquetSink(root, "sw").write_trial(rec)


def test_a_removed_trials_folder_is_made_again(tmp_path):
    """The sink makes a folder once; one removed by hand since is made again on the next write
    (no temp file left behind)."""
    root = str(tmp_path)
    sink = ParquetSink(root, "sw")
    sink.write_trial({"trial": "t1", "status": "running", "params": {"a": 1}})
    shutil.rmtree(tmp_path / "trials")
    assert sink.write_trial({"trial": "t1", "status": "completed", "params": {"a": 1}})
    assert os.listdir(tmp_path / "trials/sweep=sw") == ["trial=t1.parquet"]
    assert read_trials(root).status.tolist() == ["completed"]
