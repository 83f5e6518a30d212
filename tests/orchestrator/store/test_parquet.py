"""Parquet sink: layout, atomic files, exactly-once steps, and three independent readers."""

from __future__ import annotations

import math
import os

import duckdb
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from orchestrator.store.parquet import (
    CURVE_SCHEMA,
    ParquetSink,
    read_curves,
    read_metrics,
    read_trials,
)

pytestmark = pytest.mark.timeout(60)


def _curve(first: int, last: int, offset: float = 0.0) -> list[dict]:
    """train/loss every step, val/loss at multiples of 10; value = step + offset."""
    pts = [{"step": s, "split": "train", "metric": "loss", "value": s + offset,
            "wall_time": 0.1 * s} for s in range(first, last + 1)]
    pts += [{"step": s, "split": "val", "metric": "loss", "value": -s - offset,
             "wall_time": 0.1 * s} for s in range(first, last + 1) if s % 10 == 0]
    return pts


def _files(root, kind="curves", sweep="sw", trial="t1"):
    return sorted(os.listdir(os.path.join(root, kind, f"sweep={sweep}", f"trial={trial}")))


def test_layout_schema_and_readers_agree(tmp_path):
    root = str(tmp_path / "ds")
    sink = ParquetSink(root, "sw")
    sink.write_curve("t1", _curve(1, 20))
    sink.write_curve("t1", _curve(21, 40))
    sink.write_curve("t2_00001", _curve(1, 10))
    assert _files(root) == ["part-00000001-00000020.parquet", "part-00000021-00000040.parquet"]
    one = pq.read_table(os.path.join(root, "curves/sweep=sw/trial=t1", _files(root)[0]))
    assert one.schema == CURVE_SCHEMA

    df = read_curves(root)
    assert len(df) == 40 + 4 + 10 + 1
    t1 = df[(df.trial == "t1") & (df.split == "train")].sort_values("step")
    assert t1.step.tolist() == list(range(1, 41))
    assert t1.value.tolist() == [float(s) for s in range(1, 41)]

    dset = ds.dataset(os.path.join(root, "curves"), format="parquet", partitioning="hive")
    assert dset.count_rows(filter=ds.field("trial") == "t2_00001") == 11

    q = duckdb.sql(
        f"select trial, count(*) n, sum(value) s from read_parquet('{root}/curves/**/*.parquet',"
        " hive_partitioning=true) where split = 'train' group by trial order by trial"
    ).fetchall()
    assert q == [("t1", 40, float(sum(range(1, 41)))), ("t2_00001", 10, 55.0)]


def test_file_uri_root_and_sweep_filter(tmp_path):
    uri = (tmp_path / "u").as_uri()
    assert uri.startswith("file://")
    ParquetSink(uri, "a").write_curve("t1", _curve(1, 5))
    ParquetSink(uri, "b").write_curve("t1", _curve(1, 3))
    assert (tmp_path / "u/curves/sweep=a/trial=t1/part-00000001-00000005.parquet").exists()
    assert len(read_curves(uri)) == 8
    assert sorted(read_curves(uri, sweep="b").step) == [1, 2, 3]


def test_crash_mid_write_is_invisible(tmp_path, monkeypatch):
    root = str(tmp_path)
    sink = ParquetSink(root, "sw")
    sink.write_curve("t1", _curve(1, 10))
    folder = tmp_path / "curves/sweep=sw/trial=t1"
    # what a kill -9 between write and rename leaves: a truncated file under the temp name
    good = (folder / "part-00000001-00000010.parquet").read_bytes()
    (folder / "_part-00000011-00000020.parquet.tmp-deadbeef").write_bytes(good[: len(good) // 2])

    # an error after the temp file is written: it is cleaned up, nothing new is visible
    real_write = pq.write_table

    def boom(table, where, **kw):
        real_write(table, where, **kw)
        assert os.path.basename(where).startswith("_part-00000011-00000020.parquet.tmp-")
        raise OSError("disk gone")

    monkeypatch.setattr(pq, "write_table", boom)
    with pytest.raises(OSError, match="disk gone"):
        sink.write_curve("t1", _curve(11, 20))
    monkeypatch.undo()
    names = sorted(os.listdir(folder))
    assert names == ["_part-00000011-00000020.parquet.tmp-deadbeef",
                     "part-00000001-00000010.parquet"]

    assert len(read_curves(root)) == 11
    n = duckdb.sql(f"select count(*) from read_parquet('{root}/curves/**/*.parquet',"
                   " hive_partitioning=true)").fetchall()[0][0]
    assert n == 11


def test_resumed_segment_replaces_rows_every_step_once(tmp_path):
    root = str(tmp_path)
    sink = ParquetSink(root, "sw")
    sink.write_curve("t1", _curve(1, 50))
    sink.write_curve("t1", _curve(51, 75, offset=0.5))  # lost segment: killed at 75
    sink.write_metrics("t1", [{"step": s, "metric": "m", "module": "q", "layer": 0,
                               "next_layer": -1, "value": 9.0} for s in (50, 75)])
    # resume from checkpoint at step 60: rows 61..75 of the lost run must go
    sink.truncate_after("t1", 60)
    assert _files(root) == ["part-00000001-00000050.parquet", "part-00000051-00000060.parquet"]
    assert _files(root, "metrics") == ["part-00000050-00000050.parquet"]
    sink.write_curve("t1", _curve(61, 100))
    sink.write_metrics("t1", [{"step": 75, "metric": "m", "module": "q", "layer": 0,
                               "next_layer": -1, "value": 1.0}])

    df = read_curves(root)
    train = df[df.split == "train"]
    assert sorted(train.step) == list(range(1, 101))
    vals = dict(zip(train.step, train.value))
    assert vals[55] == 55.5 and vals[61] == 61.0 and vals[75] == 75.0
    assert sorted(df[df.split == "val"].step) == list(range(10, 101, 10))
    m = read_metrics(root)
    assert sorted(zip(m.step, m.value)) == [(50, 9.0), (75, 1.0)]


def test_overlapping_write_replaces_same_keys_keeps_others(tmp_path):
    # a final report that repeats step 40 with only a val point must not drop train/loss@40
    root = str(tmp_path)
    sink = ParquetSink(root, "sw")
    sink.write_curve("t1", _curve(31, 40))
    sink.write_curve("t1", [{"step": 40, "split": "val", "metric": "loss", "value": 7.0,
                             "wall_time": 9.0}])
    sink2 = ParquetSink(root, "sw")  # a restarted driver rediscovers the parts
    sink2.write_curve("t1", [{"step": 40, "split": "train", "metric": "loss", "value": 3.0,
                              "wall_time": 9.0}])
    df = read_curves(root).sort_values(["step", "split"])
    assert len(df) == 11 and _files(root) == ["part-00000031-00000040.parquet"]
    last = df[df.step == 40]
    assert dict(zip(last.split, last.value)) == {"train": 3.0, "val": 7.0}


def test_trials_overwrite_and_params_as_columns(tmp_path):
    root = str(tmp_path)
    sink = ParquetSink(root, "sw")
    base = {"trial": "t1", "status": "running", "seed": 0, "arm": "family=pre_ln",
            "params": {"optim.lr": 1e-3, "train.seed": 0, "model": {"residual": {"family":
                                                                                  "pre_ln"}}}}
    sink.write_trial(base)
    sink.write_trial({**base, "status": "completed", "final_val_loss": 2.5, "wall_s": 10.0,
                      "train_s": 8.0, "overhead_s": 2.0, "scalars": {"val/loss": 2.5, "lr": 1}})
    sink.write_trial({"trial": "t2", "status": "diverged", "divergence_reason": "nonfinite_loss",
                      "divergence_step": 7, "params": {"optim.lr": 1, "model.residual.p":
                                                       math.inf, "model.residual.family":
                                                       "spheret"}})
    assert sorted(os.listdir(tmp_path / "trials/sweep=sw")) == ["trial=t1.parquet",
                                                                "trial=t2.parquet"]
    df = read_trials(root).set_index("trial")
    assert df.loc["t1", "status"] == "completed" and df.loc["t1", "overhead_s"] == 2.0
    assert df.loc["t1", "model.residual.family"] == "pre_ln"
    assert df.loc["t1", "val/loss"] == 2.5 and "lr" not in df.columns
    assert df.loc["t2", "optim.lr"] == 1.0 and df.loc["t1", "optim.lr"] == 1e-3  # promoted
    assert df.loc["t2", "model.residual.p"] == math.inf
    assert math.isnan(df.loc["t1", "model.residual.p"])
    assert df.loc["t2", "divergence_step"] == 7 and df.loc["t1", "sweep"] == "sw"
    rows = duckdb.sql(
        f"select trial, status, \"optim.lr\" from read_parquet('{root}/trials/**/*.parquet',"
        " hive_partitioning=true, union_by_name=true) order by trial").fetchall()
    assert rows == [("t1", "completed", 1e-3), ("t2", "diverged", 1.0)]


def test_empty_and_bad_names(tmp_path):
    assert read_curves(str(tmp_path)).empty and read_trials(str(tmp_path)).empty
    with pytest.raises(ValueError, match="trial="):
        ParquetSink(str(tmp_path), "sw").write_curve("a/b", _curve(1, 2))
    with pytest.raises(ValueError, match="sweep="):
        ParquetSink(str(tmp_path), "x=y")


def test_read_curves_projection_filter_categorical(tmp_path):
    """metric filter + columns + categoricals = the full read, filtered, in the same rows;
    a file written elsewhere with large_string columns is read too (cast while scanning)."""
    import pandas as pd
    import pyarrow as pa

    sink = ParquetSink(str(tmp_path), "s")
    for t in ("a", "b"):
        sink.write_curve(t, [{"step": s, "split": sp, "metric": m, "value": s * 0.5 + len(m),
                              "wall_time": float(s)}
                             for s in range(1, 6) for sp in ("train", "val")
                             for m in ("loss", "grad_norm")])
    other = pa.table({"step": pa.array([1, 2], pa.int64()),
                      "split": pa.array(["train"] * 2, pa.large_string()),
                      "metric": pa.array(["loss", "grad_norm"], pa.large_string()),
                      "value": [7.0, 8.0], "wall_time": [0.0, 1.0]})
    folder = tmp_path / "curves" / "sweep=s" / "trial=c"
    folder.mkdir(parents=True)
    pq.write_table(other, folder / "part-00000001-00000002.parquet")
    cols = ["step", "split", "metric", "value", "trial"]
    got = read_curves(str(tmp_path), "s", metric="loss", columns=cols, categorical=True)
    assert list(got.columns) == cols
    assert all(isinstance(got[c].dtype, pd.CategoricalDtype) for c in ("split", "trial"))
    full = read_curves(str(tmp_path), "s")
    want = full[full["metric"] == "loss"][cols]
    key = ["trial", "split", "step"]
    norm = [d.astype({c: str for c in ("split", "metric", "trial")}).sort_values(key)
            .reset_index(drop=True) for d in (got, want)]
    pd.testing.assert_frame_equal(norm[0], norm[1], check_dtype=False)
    assert len(got) == 2 * 5 * 2 + 1 and set(got["trial"]) == {"a", "b", "c"}


def _stale_then_real(monkeypatch, change):
    """Make the first dataset a reader builds stale: its footers are read, then ``change()``
    (the live sweep's writer) replaces or deletes files before the scan."""
    from orchestrator.store import parquet

    real, calls = parquet._dataset, []

    def first_stale(*a, **kw):
        dset = real(*a, **kw)
        calls.append(1)
        if len(calls) == 1:
            for frag in dset.get_fragments():
                frag.ensure_complete_metadata()  # footers cached, as a reader would
            change()
        return dset

    monkeypatch.setattr(parquet, "_dataset", first_stale)
    monkeypatch.setattr(parquet, "_SCAN_BACKOFF_S", 0.0)
    return calls


def test_reader_racing_the_live_writer_rescans(tmp_path, monkeypatch):
    """A trial record rewritten (renamed over) between footer read and scan, and a curve part
    merged away (deleted) between listing and scan: the read is retried, never fails, and
    returns the newest rows (CI saw thrift 'Invalid data' here from test_faults' poller)."""
    root = str(tmp_path)
    sink = ParquetSink(root, "sw")
    sink.write_trial({"trial": "t1", "status": "running", "params": {"optim.lr": 1e-3}})
    sink.write_curve("t1", _curve(1, 20))
    newer = {"trial": "t1", "status": "completed", "final_val_loss": 2.5,
             "arm": "a much longer arm name " * 40, "params": {"optim.lr": 1e-3}}
    calls = _stale_then_real(monkeypatch, lambda: sink.write_trial(newer))
    df = read_trials(root)
    assert len(calls) == 2 and df.loc[0, "status"] == "completed"

    calls = _stale_then_real(monkeypatch, lambda: sink.write_curve("t1", _curve(15, 40)))
    df = read_curves(root, "sw")
    assert len(calls) == 2 and df["step"].max() == 40
    assert not df.duplicated(["step", "split", "metric"]).any()


def test_really_broken_part_still_raises(tmp_path, monkeypatch):
    """The rescan is bounded: a truncated file fails every try and its error is raised."""
    from orchestrator.store import parquet

    monkeypatch.setattr(parquet, "_SCAN_BACKOFF_S", 0.0)
    sink = ParquetSink(str(tmp_path), "sw")
    sink.write_curve("t1", _curve(1, 20))
    (part,) = (tmp_path / "curves/sweep=sw/trial=t1").glob("part-*.parquet")
    part.write_bytes(part.read_bytes()[:-40])
    with pytest.raises((OSError, ValueError)):
        read_curves(str(tmp_path), "sw")


def test_parts_hold_what_the_rows_said(tmp_path):
    """A part is built column by column: the same table as pyarrow's row-wise from_pylist
    restricted to the schema (ints as floats, None as null, NaN kept, extra keys dropped,
    missing keys null)."""
    import pyarrow as pa

    rows = [{"step": 1, "split": "train", "metric": "loss", "value": 4, "wall_time": 0.5},
            {"step": 2, "split": "train", "metric": "loss", "value": None, "extra": "x"},
            {"step": 3, "split": "val", "metric": "loss", "value": float("nan"),
             "wall_time": None}]
    sink = ParquetSink(str(tmp_path), "s")
    sink.write_curve("t1", rows)
    got = sink._curve_table("t1")
    want = pa.Table.from_pylist([{f.name: r.get(f.name) for f in CURVE_SCHEMA} for r in rows],
                                schema=CURVE_SCHEMA)
    assert got.schema == CURVE_SCHEMA
    assert got.to_pylist()[:2] == want.to_pylist()[:2]
    last = got.to_pylist()[2]
    assert math.isnan(last.pop("value")) and last == {"step": 3, "split": "val",
                                                       "metric": "loss", "wall_time": None}
