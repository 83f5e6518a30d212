"""SinkCallback driven with fake Tune trials and payloads: both sinks checked."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from types import SimpleNamespace

import duckdb
import pandas as pd
import pytest
import ray.cloudpickle as cloudpickle
from mlflow import MlflowClient

from orchestrator.store.mlflow import MlflowSink, default_tracking
from orchestrator.store.parquet import ParquetSink, read_curves, read_metrics, read_trials
from orchestrator.sweep.callback import SinkCallback

pytestmark = pytest.mark.timeout(120)


@dataclass
class FakeTrial:
    trial_id: str
    config: dict = field(default_factory=dict)
    error_file: str | None = None


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def _payload(trial: FakeTrial, first: int, last: int, status: str = "running",
             divergence: dict | None = None, train_s: float = 0.0) -> dict:
    """What orchestrator/sweep/worker.py sends: train loss = 10/step, val every 10 steps."""
    curve = [{"step": s, "split": "train", "metric": "loss", "value": 10.0 / s,
              "wall_time": 0.1 * s} for s in range(first, last + 1)]
    curve += [{"step": s, "split": "val", "metric": "loss", "value": 20.0 / s,
               "wall_time": 0.1 * s} for s in range(first, last + 1) if s % 10 == 0]
    rows = [{"step": last, "metric": "cos", "module": m, "layer": layer, "next_layer": -1,
             "value": 0.5} for m, layer in (("q", 0), ("q", 1), ("", -1))]
    val = 20.0 / (last - last % 10) if last >= 10 else 2.0
    out = {"step": last, "train/loss": 10.0 / last, "val/loss": val, "lr": 1e-3,
           "training_iteration": 3, "config": {"optim.lr": 1e-3}, "done": False}
    if status == "diverged":
        out["val/loss"] = 10.8  # the penalty
    out.update({"_curve": curve, "_rows": rows, "_status": status, "_divergence": divergence,
                "_node": "host:10.0.0.1", "_timing": {"train_s": train_s, "setup_s": 0.5},
                "_trial_params": trial.config, "_arm": f"optim.lr={trial.config['optim.lr']}",
                "_seed": trial.config["train.seed"]})
    return out


@pytest.fixture()
def sinks(tmp_path, tmp_path_factory):
    template = tmp_path_factory.getbasetemp() / "mlflow-template.db"
    if not template.exists():
        MlflowClient(f"sqlite:///{template}").search_experiments()
    os.makedirs(tmp_path / "sw")
    shutil.copy(template, tmp_path / "sw" / "mlflow.db")
    uri, _ = default_tracking(str(tmp_path / "sw"))
    ml = MlflowSink(uri, "geosweep", "sw")
    parent = ml.start_parent("name: sw\n", {"sweep": "sw"}, {"git": {"sha": "x"}})
    pq = ParquetSink(str(tmp_path / "sw" / "parquet"), "sw")
    return ml, pq, parent, uri, str(tmp_path / "sw" / "parquet")


def test_sweep_of_five_trials(sinks, tmp_path):
    ml, pq, parent, uri, root = sinks
    cb = SinkCallback(parquet=pq, mlflow=ml, metric="val/loss", clock=Clock())
    T = {n: FakeTrial(f"{n}_0000{i}", {"optim.lr": 10.0 ** -i, "train.seed": i})
         for i, n in enumerate(["ok", "div", "fail", "res", "stop"])}
    for t in T.values():
        cb.on_trial_start(0, [], t)

    # ok: three reports then done
    for a, b in ((1, 10), (11, 20), (21, 30)):
        cb.on_trial_result(0, [], T["ok"], _payload(T["ok"], a, b, train_s=b / 10))
    cb.on_trial_result(0, [], T["ok"], _payload(T["ok"], 31, 30, "completed", train_s=3.0))
    cb.on_trial_complete(0, [], T["ok"])
    # div: diverges at step 14
    cb.on_trial_result(0, [], T["div"], _payload(T["div"], 1, 10))
    cb.on_trial_result(0, [], T["div"], _payload(
        T["div"], 11, 14, "diverged", {"reason": "nonfinite_loss", "step": 14, "detail": "nan"}))
    cb.on_trial_complete(0, [], T["div"])
    # fail: worker died, retries exhausted
    err = tmp_path / "error.txt"
    err.write_text("Traceback...\n\nray.exceptions.ActorDiedError: worker died\n")
    T["fail"].error_file = str(err)
    cb.on_trial_result(0, [], T["fail"], _payload(T["fail"], 1, 5))
    cb.on_trial_error(0, [], T["fail"])
    # res: reaches 30, killed, recovered from the checkpoint at 20, finishes at 40
    cb.on_trial_result(0, [], T["res"], _payload(T["res"], 1, 20))
    cb.on_trial_result(0, [], T["res"], _payload(T["res"], 21, 30))
    cb.on_trial_recover(0, [], T["res"])
    cb.on_trial_start(0, [], T["res"])
    cb.on_trial_result(0, [], T["res"], _payload(T["res"], 21, 40, "completed", train_s=4.0))
    cb.on_trial_complete(0, [], T["res"])
    # stop: ASHA ends it while the worker still says running
    cb.on_trial_result(0, [], T["stop"], _payload(T["stop"], 1, 10, train_s=1.0))
    cb.on_trial_complete(0, [], T["stop"])

    # --- records (for the CLI) --------------------------------------------------------------
    recs = {r["trial"]: r for r in cb.records()}
    assert {k: recs[T[k].trial_id]["status"] for k in T} == {
        "ok": "completed", "div": "diverged", "fail": "failed", "res": "completed",
        "stop": "stopped"}
    ok = recs["ok_00000"]
    assert ok["best_val_loss"] == 20.0 / 30 and ok["final_train_loss"] == 10.0 / 30
    # Clock ticks once per _record creation and per finish: ok started at 1001, ended 1006
    assert ok["wall_s"] == 5.0 and ok["train_s"] == 3.0 and ok["overhead_s"] == 2.0
    assert recs["div_00001"]["divergence_step"] == 14 and recs["div_00001"]["objective"] == 10.8
    assert recs["fail_00002"]["error"] == "ray.exceptions.ActorDiedError: worker died"
    assert recs["res_00003"]["retries"] == 1 and recs["res_00003"]["last_step"] == 40

    # --- Parquet ------------------------------------------------------------------------------
    trials = read_trials(root).set_index("trial")
    assert trials.loc["div_00001", "divergence_reason"] == "nonfinite_loss"
    assert trials.loc["div_00001", "status"] == "diverged"
    assert trials.loc["ok_00000", "overhead_s"] == 2.0
    assert trials.loc["ok_00000", "node"] == "host:10.0.0.1"
    assert trials.loc["res_00003", "optim.lr"] == 1e-3 and trials.loc["res_00003", "seed"] == 3
    assert trials.loc["ok_00000", "arm"] == "optim.lr=1.0"
    steps = duckdb.sql(
        f"select trial, count(*) n, count(distinct step) d, max(step) m from read_parquet("
        f"'{root}/curves/**/*.parquet', hive_partitioning=true) where split = 'train' "
        "group by trial order by trial").fetchall()
    assert steps == [("div_00001", 14, 14, 14), ("fail_00002", 5, 5, 5),
                     ("ok_00000", 30, 30, 30), ("res_00003", 40, 40, 40),
                     ("stop_00004", 10, 10, 10)]
    res_val = read_curves(root, "sw").query("trial == 'res_00003' and split == 'val'")
    assert sorted(res_val.step) == [10, 20, 30, 40]
    m = read_metrics(root).query("trial == 'res_00003'")
    assert sorted(m.step.unique()) == [20, 40]  # the lost segment's step-30 rows are gone
    assert len(m) == 6

    # --- MLflow ------------------------------------------------------------------------------
    client = MlflowClient(uri)
    runs = client.search_runs([ml.experiment_id], "tags.`geosweep.role` = 'child'")
    assert len(runs) == 5
    by = {r.data.tags["geosweep.trial_id"]: r for r in runs}
    assert all(r.data.tags["mlflow.parentRunId"] == parent for r in runs)
    d = by["div_00001"]
    assert d.data.tags["geosweep.status"] == "diverged" and d.info.status == "FAILED"
    assert d.data.tags["geosweep.reason"] == "diverged: nonfinite_loss at step 14 (nan)"
    # named by the arm: searched params (compact) + seed
    assert {k: r.info.run_name for k, r in by.items()} == {
        "ok_00000": "lr=1 s0", "div_00001": "lr=0.1 s1", "fail_00002": "lr=0.01 s2",
        "res_00003": "lr=1e-3 s3", "stop_00004": "lr=1e-4 s4"}
    assert by["stop_00004"].info.status == "FINISHED"  # not red: the search working
    assert by["stop_00004"].data.tags["geosweep.reason"] == \
        "stopped early by the scheduler (ASHA) at step 10"
    assert by["fail_00002"].data.tags["geosweep.reason"] == \
        "failed: ray.exceptions.ActorDiedError: worker died"
    assert by["ok_00000"].info.status == "FINISHED"
    assert "geosweep.reason" not in by["ok_00000"].data.tags
    assert by["ok_00000"].data.params["train.seed"] == "0"
    assert d.data.tags["geosweep.divergence.reason"] == "nonfinite_loss"
    assert d.data.tags["geosweep.divergence.step"] == "14"
    assert by["fail_00002"].info.status == "FAILED"
    assert by["stop_00004"].data.tags["geosweep.status"] == "stopped"
    r = by["res_00003"]
    assert r.data.tags["geosweep.seed"] == "3" and r.data.tags["geosweep.retries"] == "1"
    assert r.data.params["optim.lr"] == "0.001"
    hist = client.get_metric_history(r.info.run_id, "Loss/train")
    assert sorted(x.step for x in hist) == list(range(1, 41))
    # rows stay in Parquet (their summaries are reported scalars): no MLflow key of their own
    assert not [k for k in r.data.metrics if k.startswith("geo/") or k == "cos"]
    assert "lr" not in r.data.metrics and r.data.metrics["Loss/val"] == 0.5

    # Tune pickles run_config callbacks into tuner.pkl: the callback must survive it
    again = cloudpickle.loads(cloudpickle.dumps(cb))
    assert again.records() == cb.records() and again.mlflow.parent_id == parent


def test_works_with_one_sink_and_no_ray(tmp_path):
    pq = ParquetSink(str(tmp_path), "sw")
    cb = SinkCallback(parquet=pq)
    t = FakeTrial("a_1", {"optim.lr": 0.1, "train.seed": 0})
    cb.on_trial_start(0, [], t)
    assert read_trials(str(tmp_path)).status.tolist() == ["running"]
    cb.on_trial_result(0, [], t, _payload(t, 1, 10, "completed"))
    cb.on_trial_complete(0, [], t)
    rec = cb.records()[0]
    assert rec["status"] == "completed" and rec["sweep"] == "sw" and rec["seed"] == 0
    assert len(read_curves(str(tmp_path))) == 11


def test_background_writer_matches_synchronous(tmp_path):
    """background=True: hooks return at once, one thread writes, records() flushes first."""
    pq_sync, pq_bg = ParquetSink(str(tmp_path / "a"), "s"), ParquetSink(str(tmp_path / "b"), "s")
    sync = SinkCallback(parquet=pq_sync, sweep="s", clock=Clock())
    bg = SinkCallback(parquet=pq_bg, sweep="s", clock=Clock(), background=True)
    cloudpickle.dumps(bg)  # Tune pickles callbacks: must work before and after the thread starts
    for cb in (sync, bg):
        trial = FakeTrial("t1", {"optim.lr": 1e-3, "train.seed": 0})
        cb.on_trial_start(0, [], trial)
        cb.on_trial_result(0, [], trial, _payload(trial, 1, 10))
        cb.on_trial_result(0, [], trial, _payload(trial, 11, 20, status="completed"))
        cb.on_trial_complete(0, [], trial)
    cloudpickle.dumps(bg)
    a, b = sync.records(), bg.records()
    assert [r["status"] for r in a] == [r["status"] for r in b] == ["completed"]
    # timestamps are those of the Tune events (start = 1st, complete = 4th), not of the writes
    assert (b[0]["started_at"], b[0]["ended_at"]) == (1001.0, 1004.0)
    ca = read_curves(str(tmp_path / "a"), sweep="s").sort_values(["step", "split"])
    cb_ = read_curves(str(tmp_path / "b"), sweep="s").sort_values(["step", "split"])
    assert list(ca.step) == list(cb_.step) and len(ca) == 22


def test_background_writer_coalesces_record_writes(tmp_path):
    """While a later event of the same trial is queued, an earlier one does not rewrite the
    trial's record file; the file on disk ends as the synchronous writer's, and an event of
    ANOTHER trial does not suppress a write."""
    import threading

    gate = threading.Event()
    writes: list[tuple[str, str]] = []

    class Counting(ParquetSink):
        def write_trial(self, record):
            writes.append((record["trial"], record["status"]))
            super().write_trial(record)

    cb = SinkCallback(parquet=Counting(str(tmp_path), "s"), sweep="s", clock=Clock(),
                      background=True)
    # hold the writer thread so that every event below is queued before it runs
    cb._defer(lambda snap: gate.wait(30), FakeTrial("hold"))
    t1, t2 = (FakeTrial(t, {"optim.lr": 1e-3, "train.seed": 0}) for t in ("t1", "t2"))
    cb.on_trial_start(0, [], t1)
    cb.on_trial_start(0, [], t2)
    cb.on_trial_result(0, [], t1, _payload(t1, 1, 10))
    cb.on_trial_result(0, [], t1, _payload(t1, 11, 20, status="completed"))
    cb.on_trial_complete(0, [], t1)
    gate.set()
    recs = cb.records()
    assert [r["status"] for r in recs] == ["completed", "running"]
    # t1: its start (a result was queued behind it) and both results coalesce into the final
    # write; t2's start is written (nothing of t2 was queued after it)
    assert writes == [("t2", "running"), ("t1", "completed")]
    assert sorted(read_trials(str(tmp_path), sweep="s").status) == ["completed", "running"]


def test_tune_snapshot_waits_for_queued_writes(tmp_path):
    """Tune's experiment snapshot (CallbackList.save_to_dir, as TuneController.save_to_dir
    calls it) must not finish while a result is still queued: the snapshot records the
    trial's checkpoint, and a driver killed after it would lose that result for good."""
    import threading

    from ray.tune.callback import CallbackList

    gate = threading.Event()
    cb = SinkCallback(parquet=ParquetSink(str(tmp_path / "pq"), "s"), sweep="s",
                      clock=Clock(), background=True)
    cb._defer(lambda snap: gate.wait(30), FakeTrial("hold"))  # the writer is busy
    trial = FakeTrial("t1", {"optim.lr": 1e-3, "train.seed": 0})
    cb.on_trial_start(0, [], trial)
    cb.on_trial_result(0, [], trial, _payload(trial, 1, 10))
    saver = threading.Thread(target=CallbackList([cb]).save_to_dir, args=(str(tmp_path),))
    saver.start()
    saver.join(0.5)
    assert saver.is_alive()  # held by the queued result, not by timing: the gate is shut
    gate.set()
    saver.join(30)
    assert not saver.is_alive()
    # the queued result is on disk the moment the snapshot returns; no state file is written
    assert sorted(read_curves(str(tmp_path / "pq"), sweep="s").step) == list(range(1, 11)) + [10]
    assert not [f for f in os.listdir(tmp_path) if f.startswith("callback-states")]


def test_background_writer_error_surfaces_on_flush(tmp_path):
    class Broken(ParquetSink):
        def write_curve(self, trial_id, points):
            raise OSError("disk full")

    cb = SinkCallback(parquet=Broken(str(tmp_path), "s"), sweep="s", background=True)
    trial = FakeTrial("t1", {"optim.lr": 1e-3, "train.seed": 0})
    cb.on_trial_start(0, [], trial)
    cb.on_trial_result(0, [], trial, _payload(trial, 1, 10))
    with pytest.raises(RuntimeError, match="disk full"):
        cb.flush()


def test_train_worker_restart_is_detected_without_tune(sinks):
    """A Ray Train worker group restarted from its checkpoint at step 20 re-reports 21..:
    Tune calls no recover hook, yet the lost segment (21..30) is replaced, not duplicated."""
    ml, pq, parent, uri, root = sinks
    cb = SinkCallback(parquet=pq, mlflow=ml, metric="val/loss", clock=Clock())
    t = FakeTrial("tr_00000", {"optim.lr": 1e-3, "train.seed": 0})
    cb.on_trial_start(0, [], t)
    cb.on_trial_result(0, [], t, _payload(t, 1, 20))
    cb.on_trial_result(0, [], t, _payload(t, 21, 30))
    lost = _payload(t, 21, 30)  # what the restarted worker computes differs in the test only
    for p in lost["_curve"]:
        p["value"] += 1.0
    cb.on_trial_result(0, [], t, lost)
    cb.on_trial_result(0, [], t, _payload(t, 31, 40, "completed"))
    cb.on_trial_complete(0, [], t)
    c = read_curves(root, sweep="sw")
    c = c[(c["split"] == "train") & (c["metric"] == "loss")].sort_values("step")
    assert c["step"].tolist() == list(range(1, 41))
    # the re-reported rows replaced the old ones in Parquet
    assert c.loc[c["step"] == 25, "value"].item() == pytest.approx(10.0 / 25 + 1.0)
    rec = cb.records()[0]
    assert rec["retries"] == 1 and rec["status"] == "completed"
    hist = MlflowClient(uri).get_metric_history(ml._children[t.trial_id], "Loss/train")
    assert sorted(m.step for m in hist) == list(range(1, 41))  # every step once


def test_resumed_driver_fills_the_mlflow_steps_a_crash_lost(sinks):
    """A driver killed after a result's Parquet write and before its MLflow write, with the
    trial's checkpoint at that result's step: the resumed trial goes on from step 31 and never
    re-reports 21..30, yet the resumed driver's first MLflow write sends them (once)."""
    ml, pq, parent, uri, root = sinks
    cb = SinkCallback(parquet=pq, mlflow=ml, metric="val/loss", clock=Clock())
    t = FakeTrial("tr_00000", {"optim.lr": 1e-3, "train.seed": 0})
    cb.on_trial_start(0, [], t)
    cb.on_trial_result(0, [], t, _payload(t, 1, 20))
    pq.write_curve(t.trial_id, _payload(t, 21, 30)["_curve"])  # ... and the driver dies here
    cb.flush()

    from orchestrator.store.parquet import read_trial_records

    ml2 = MlflowSink(uri, "geosweep", "sw")
    ml2.start_parent("name: sw\n", {"sweep": "sw"}, {})
    cb2 = cloudpickle.loads(cloudpickle.dumps(cb))  # Tune restores its pickled callbacks
    cb2.parquet, cb2.mlflow = ParquetSink(root, "sw"), ml2
    cb2.preload(read_trial_records(root, "sw"))
    cb2.on_trial_restore(0, [], t)
    cb2.on_trial_start(0, [], t)
    cb2.on_trial_result(0, [], t, _payload(t, 31, 40))
    cb2.on_trial_result(0, [], t, _payload(t, 41, 50, "completed"))
    cb2.on_trial_complete(0, [], t)
    client = MlflowClient(uri)
    run = ml2._children[t.trial_id]
    train = client.get_metric_history(run, "Loss/train")
    assert sorted(m.step for m in train) == list(range(1, 51))  # every step once
    assert {m.step: m.value for m in train}[25] == pytest.approx(10.0 / 25)
    val = client.get_metric_history(run, "Loss/val")
    assert sorted(m.step for m in val) == [10, 20, 30, 40, 50]
    c = read_curves(root, sweep="sw")
    assert sorted(c.loc[c["split"] == "train", "step"]) == list(range(1, 51))


def _resumed_driver(uri: str, root: str) -> tuple[MlflowSink, SinkCallback]:
    """What a resumed driver builds: the sweep's MLflow parent found again, a fresh sink
    callback holding the records the earlier driver left in Parquet."""
    from orchestrator.store.parquet import read_trial_records

    ml = MlflowSink(uri, "geosweep", "sw")
    ml.start_parent("name: sw\n", {"sweep": "sw"}, {})
    cb = SinkCallback(parquet=ParquetSink(root, "sw"), mlflow=ml, metric="val/loss",
                      clock=Clock())
    cb.preload(read_trial_records(root, "sw"))
    return ml, cb


def test_resumed_trial_that_ends_at_once_gets_the_mlflow_points_a_crash_lost(sinks):
    """A driver killed after a trial's last curve and final record reached Parquet and before
    its MLflow end (the end carries the trial's last batch of points): Tune's snapshot predates
    the finish, so the resumed driver's Tune re-starts the trial, which completes at once
    without a result. Its end sends the points MLflow lacks (once), and keeps its outcome."""
    ml, pq, parent, uri, root = sinks
    cb = SinkCallback(parquet=pq, mlflow=ml, metric="val/loss", clock=Clock())
    t = FakeTrial("tr_00000", {"optim.lr": 1e-3, "train.seed": 0})
    cb.on_trial_start(0, [], t)
    cb.on_trial_result(0, [], t, _payload(t, 1, 20))
    cb.flush()  # steps 1..20 are in MLflow
    pq.write_curve(t.trial_id, _payload(t, 21, 30, "completed")["_curve"])
    rec = dict(cb.records()[0], status="completed", ended_at=2000.0, last_step=30)
    pq.write_trial(rec)  # ... the trial's final record, and the driver dies here

    ml2, cb2 = _resumed_driver(uri, root)
    cb2.on_trial_start(0, [], t)
    cb2.on_trial_complete(0, [], t)
    cb2.flush()
    client = MlflowClient(uri)
    run = ml2._children[t.trial_id]
    train = client.get_metric_history(run, "Loss/train")
    assert sorted(m.step for m in train) == list(range(1, 31))  # every step once
    assert {m.step: m.value for m in train}[25] == pytest.approx(10.0 / 25)
    assert sorted(m.step for m in client.get_metric_history(run, "Loss/val")) == [10, 20, 30]
    assert client.get_run(run).info.status == "FINISHED"
    assert cb2.records()[0]["ended_at"] == 2000.0


def test_preloaded_finished_trial_keeps_outcome_and_times(sinks):
    """A resumed driver preloads Parquet records; a finished trial Tune re-starts (its
    snapshot predates the finish) and completes without results keeps status and times; a
    lost one is closed as failed."""
    ml, pq, parent, uri, root = sinks
    cb = SinkCallback(parquet=pq, mlflow=ml, metric="val/loss", clock=Clock())
    done, lost = (FakeTrial(f"{n}_00000", {"optim.lr": 1e-3, "train.seed": 0})
                  for n in ("done", "lost"))
    for t in (done, lost):
        cb.on_trial_start(0, [], t)
        cb.on_trial_result(0, [], t, _payload(t, 1, 10))
    cb.on_trial_result(0, [], done, _payload(done, 11, 20, "completed"))
    cb.on_trial_complete(0, [], done)
    first = {r["trial"]: r for r in cb.records()}

    ml2, cb2 = _resumed_driver(uri, root)
    cb2.on_trial_start(0, [], done)
    cb2.on_trial_complete(0, [], done)
    assert cb2.seen() == {done.trial_id}
    cb2.abandon(lost.trial_id, "lost in a driver crash")
    recs = {r["trial"]: r for r in cb2.records()}
    assert recs[done.trial_id]["status"] == "completed"
    assert recs[done.trial_id]["ended_at"] == first[done.trial_id]["ended_at"]
    assert recs[done.trial_id]["final_val_loss"] == first[done.trial_id]["final_val_loss"]
    assert recs[lost.trial_id]["status"] == "failed"
    t = read_trials(root, sweep="sw").set_index("trial")
    assert t.loc[lost.trial_id, "error"] == "lost in a driver crash"
    runs = MlflowClient(uri).search_runs([ml.experiment_id],
                                         filter_string="tags.`geosweep.role` = 'child'")
    assert sorted(r.info.status for r in runs) == ["FAILED", "FINISHED"]  # no duplicate child


def test_finished_trial_records_its_spike_count(tmp_path):
    """At the end of a trial its spike count (of the curve on disk, the lost segment of a
    restart dropped) and the rule are in its record: the report reads no curves for them."""
    from orchestrator.analysis.spike_rule import SPIKE_FACTOR, SPIKE_MIN_DELTA, spike_rule
    from orchestrator.analysis.stats import spike_count

    pq = ParquetSink(str(tmp_path), "sw")
    cb = SinkCallback(parquet=pq, background=True)
    t = FakeTrial("a_1", {"optim.lr": 0.1, "train.seed": 0})

    def spiky(first: int, last: int, spikes: tuple[int, ...], status: str = "running"):
        p = _payload(t, first, last, status)
        for point in p["_curve"]:
            if point["split"] == "train":
                point["value"] = 5.0 if point["step"] in spikes else 1.0
        return p

    cb.on_trial_start(0, [], t)
    cb.on_trial_result(0, [], t, spiky(1, 40, (25,)))
    cb.on_trial_result(0, [], t, spiky(41, 60, (45, 46, 55)))  # lost: restarted from 40
    cb.on_trial_result(0, [], t, spiky(41, 80, (70,), "completed"))
    cb.on_trial_complete(0, [], t)
    cb.flush()
    rec = read_trials(str(tmp_path)).iloc[0]
    curve = [5.0 if s in (25, 70) else 1.0 for s in range(1, 81)]
    assert spike_count(curve, SPIKE_FACTOR, SPIKE_MIN_DELTA) == 2
    assert rec["spikes"] == 2 and rec["spikes_rule"] == spike_rule(SPIKE_FACTOR,
                                                                    SPIKE_MIN_DELTA)


def test_a_sampled_curve_gets_no_spike_count(tmp_path):
    """A sweep with ``budget.curve_every`` k > 1 stores every k-th step: its trials' records
    say no count (None, with the rule), since a spike between two samples is unseen."""
    from orchestrator.analysis.spike_rule import SPIKE_FACTOR, SPIKE_MIN_DELTA, spike_rule

    pq = ParquetSink(str(tmp_path), "sw")
    cb = SinkCallback(parquet=pq, background=True)
    t = FakeTrial("a_1", {"optim.lr": 0.1, "train.seed": 0})
    p = _payload(t, 1, 80, "completed")
    p["_curve"] = [q for q in p["_curve"] if q["step"] % 4 == 0]
    for q in p["_curve"]:
        if q["split"] == "train":
            q["value"] = 5.0 if q["step"] == 40 else 1.0
    cb.on_trial_start(0, [], t)
    cb.on_trial_result(0, [], t, p)
    cb.on_trial_complete(0, [], t)
    cb.flush()
    rec = read_trials(str(tmp_path)).iloc[0]
    assert pd.isna(rec["spikes"]) and rec["spikes_rule"] == spike_rule(SPIKE_FACTOR,
                                                                        SPIKE_MIN_DELTA)


def test_mlflow_sink_built_later_misses_nothing(sinks):
    """The driver's MLflow store is built while the first trials run (mlflow_later): the
    hooks never wait for it, and every event reaches both sinks once it is there."""
    import threading

    ml, pq, parent, uri, root = sinks
    ready = threading.Event()

    def later():
        if not ready.wait(30):  # set only once every hook below returned
            raise AssertionError("a Tune hook waited for the MLflow store")
        return ml

    cb = SinkCallback(parquet=pq, metric="val/loss", clock=Clock(), background=True,
                      mlflow_later=later)
    t = FakeTrial("t1", {"optim.lr": 1e-3, "train.seed": 0})
    cb.on_trial_start(0, [], t)
    cb.on_trial_result(0, [], t, _payload(t, 1, 10, train_s=1.0))
    cb.on_trial_result(0, [], t, _payload(t, 11, 20, status="completed", train_s=2.0))
    cb.on_trial_complete(0, [], t)
    state = cloudpickle.loads(cloudpickle.dumps(cb))  # Tune pickles callbacks meanwhile
    assert state._mlflow_later is None
    ready.set()
    (rec,) = cb.records()
    assert rec["status"] == "completed" and rec["last_step"] == 20
    run = MlflowClient(uri).get_run(ml.run_id("t1"))
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.parentRunId"] == parent
    hist = MlflowClient(uri).get_metric_history(ml.run_id("t1"), "Loss/train")
    assert sorted(m.step for m in hist) == list(range(1, 21))
    assert len(read_curves(root, sweep="sw").query("split == 'train'")) == 20


def test_mlflow_store_that_fails_stops_the_sweep_and_keeps_parquet(tmp_path):
    """A store that could not be built: the events still reach Parquet, and the next hook
    (Tune's loop: the sweep stops) and flush raise its error."""
    def later():
        raise OSError("mlflow.db: disk I/O error")

    pq = ParquetSink(str(tmp_path), "s")
    cb = SinkCallback(parquet=pq, sweep="s", clock=Clock(), background=True, mlflow_later=later)
    t = FakeTrial("t1", {"optim.lr": 1e-3, "train.seed": 0})
    cb.on_trial_start(0, [], t)
    cb.on_trial_result(0, [], t, _payload(t, 1, 10))
    with pytest.raises(RuntimeError, match="disk I/O error"):
        cb.flush()
    with pytest.raises(RuntimeError, match="MLflow store could not be built"):
        cb.on_trial_result(0, [], t, _payload(t, 11, 20))
    assert len(read_curves(str(tmp_path), sweep="s")) == 10 + 1  # 10 train + 1 val point
    assert list(read_trials(str(tmp_path), sweep="s").last_step) == [10]


@pytest.mark.parametrize("as_text", [True, False])
def test_result_is_one_mlflow_transaction_with_config_params_and_changed_tags(sinks,
                                                                              monkeypatch,
                                                                              as_text):
    """A result: one transaction straight into the sqlite tables (store/mlflow_metrics.py)
    with its points, the resolved config of the first report (JSON text, as the worker sends
    it so that Tune keeps no statistics of its keys; a dict is read too) and the tags that
    changed; a trial's start: its run and one transaction of params and tags. Nothing goes
    through MLflow's client, nothing is read back."""
    import json

    ml, pq, parent, uri, root = sinks
    calls = []
    real_write, real_create = ml._points.write, ml._points.create_run

    def write(run_id, metrics=(), params=(), tags=(), end=None):
        calls.append(("write", len(metrics), len(params), len(tags), end is not None))
        return real_write(run_id, metrics, params, tags, end)

    def create(*a, **k):
        calls.append(("create",))
        return real_create(*a, **k)

    monkeypatch.setattr(ml._points, "write", write)
    monkeypatch.setattr(ml._points, "create_run", create)
    for name in ("log_batch", "create_run", "set_terminated", "get_run"):
        monkeypatch.setattr(ml.client, name, lambda *a, _n=name, **k: pytest.fail(
            f"MLflow client {_n}"))
    cb = SinkCallback(parquet=pq, mlflow=ml, metric="val/loss", clock=Clock())
    t = FakeTrial("t1", {"optim.lr": 1e-3, "train.seed": 0})
    cb.on_trial_start(0, [], t)
    assert [c[0] for c in calls] == ["create", "write"]
    calls.clear()
    config = {f"k{i}": i for i in range(150)}  # more than MLflow's 100 params a batch
    first = _payload(t, 1, 10)
    first["_config"] = json.dumps(config) if as_text else config
    cb.on_trial_result(0, [], t, first)
    # 10 train + 1 val points (the scalars at 10: the same keys) and the 150 params, one write
    assert [c[:3] for c in calls] == [("write", 11, 150)]
    calls.clear()
    cb.on_trial_result(0, [], t, _payload(t, 11, 20))
    assert calls == [("write", 11, 0, 0, False)]  # no params again, no unchanged tag
    calls.clear()
    cb.on_trial_result(0, [], t, _payload(t, 21, 30, status="completed"))
    assert calls == [("write", 11, 0, 1, False)]  # the status tag
    calls.clear()
    cb.on_trial_complete(0, [], t)
    assert [c[0] for c in calls] == ["write"] and calls[0][4]  # the final tags with the end
    cb.on_trial_complete(0, [], t)
    monkeypatch.undo()
    run = MlflowClient(uri).get_run(ml.run_id("t1"))
    assert {k: run.data.params[k] for k in config} == {k: str(v) for k, v in config.items()}
    assert run.data.params["optim.lr"] == "0.001"
    assert run.data.tags["geosweep.status"] == "completed"
    assert run.info.status == "FINISHED"
    hist = MlflowClient(uri).get_metric_history(ml.run_id("t1"), "Loss/train")
    assert sorted(m.step for m in hist) == list(range(1, 31))


def _count_mlflow_calls(ml, monkeypatch) -> list[str]:
    """The sink's writes: MLflow client calls by name, the sqlite writer's as ``direct.*``."""
    calls: list[str] = []
    for owner, names, prefix in ((ml.client, ("create_run", "log_batch", "set_terminated",
                                              "update_run"), ""),
                                 (ml._points, ("create_run", "write"), "direct.")):
        for name in names:
            real = getattr(owner, name)

            def spy(*a, _real=real, _name=prefix + name, **k):
                calls.append(_name)
                return _real(*a, **k)

            monkeypatch.setattr(owner, name, spy)
    return calls


def _mlflow_state(uri: str, run_id: str) -> tuple:
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    hist = {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k))
            for k in run.data.metrics}
    tags = {k: v for k, v in run.data.tags.items() if k != "mlflow.parentRunId"}
    return run.info.status, run.data.params, tags, hist


def test_background_writer_batches_a_trials_mlflow_writes(sinks, tmp_path_factory,
                                                          monkeypatch):
    """Queued behind a busy writer, a trial's start, 3 results and end cost the store a run and
    ONE transaction (its params, tags, every point, its final tags and its end); the run is
    the one the synchronous writer (a write per event) leaves, point for point."""
    import threading

    ml, pq, parent, uri, root = sinks
    calls = _count_mlflow_calls(ml, monkeypatch)
    gate = threading.Event()
    bg = SinkCallback(parquet=pq, mlflow=ml, metric="val/loss", clock=lambda: 1000.0,
                      background=True, batch_s=3600)
    bg._defer(lambda snap: gate.wait(30), FakeTrial("hold"))
    # the synchronous reference, on a store of its own
    sync_dir = tmp_path_factory.mktemp("sync")
    shutil.copy(os.path.join(os.path.dirname(root), "mlflow.db"), sync_dir / "mlflow.db")
    uri2, _ = default_tracking(str(sync_dir))
    ml2 = MlflowSink(uri2, "geosweep", "sw")
    ml2.start_parent("name: sw\n", {"sweep": "sw"}, {"git": {"sha": "x"}})
    sync = SinkCallback(parquet=ParquetSink(str(sync_dir / "pq"), "sw"), mlflow=ml2,
                        metric="val/loss", clock=lambda: 1000.0)
    for cb in (bg, sync):
        t = FakeTrial("t1", {"optim.lr": 1e-3, "train.seed": 0})
        cb.on_trial_start(0, [], t)
        first = _payload(t, 1, 10)
        first["_config"] = {"optim.lr": 1e-3, "train.steps": 30}
        cb.on_trial_result(0, [], t, first)
        cb.on_trial_result(0, [], t, _payload(t, 11, 20))
        cb.on_trial_result(0, [], t, _payload(t, 21, 30, status="completed"))
        cb.on_trial_complete(0, [], t)
    gate.set()
    bg.flush()
    assert calls == ["direct.create_run", "direct.write"]
    assert _mlflow_state(uri, ml.run_id("t1")) == _mlflow_state(uri2, ml2.run_id("t1"))


def test_tune_snapshot_writes_out_mlflow_batches(sinks):
    """A running trial's batched MLflow points are in the store when Tune's experiment
    snapshot returns (a driver killed after it must not lose them: its checkpoint is past
    them); a running trial's Parquet record is refreshed once per batch period, its curve
    parts at every result, its record at its end."""
    from ray.tune.callback import CallbackList

    ml, pq, parent, uri, root = sinks
    cb = SinkCallback(parquet=pq, mlflow=ml, metric="val/loss", clock=Clock(),
                      background=True, batch_s=3600)
    t = FakeTrial("t1", {"optim.lr": 1e-3, "train.seed": 0})
    cb.on_trial_start(0, [], t)
    cb.flush()  # the start's record is on disk
    cb.on_trial_result(0, [], t, _payload(t, 1, 10))
    cb.on_trial_result(0, [], t, _payload(t, 11, 20))
    CallbackList([cb]).save_to_dir(root)
    run = ml.run_id("t1")
    hist = MlflowClient(uri).get_metric_history(run, "Loss/train")
    assert sorted(m.step for m in hist) == list(range(1, 21))
    rec = read_trials(root, sweep="sw").iloc[0]
    assert rec["status"] == "running" and pd.isna(rec["last_step"])  # the start's record
    assert len(read_curves(root, sweep="sw").query("split == 'train'")) == 20
    cb.on_trial_complete(0, [], t)
    cb.flush()
    assert read_trials(root, sweep="sw").iloc[0]["last_step"] == 20


def test_tune_keeps_no_curve_in_the_trials_last_result(tmp_path):
    """Tune stores the result a callback saw as the trial's last_result and pickles it into
    every experiment snapshot: the sink takes the curve, rows, config and the rest of its own
    payload (timing, params, arm, seed, node, divergence, world size) out of it (its writer
    keeps its own copy) and leaves what the searcher and the progress line read."""
    cb = SinkCallback(parquet=ParquetSink(str(tmp_path), "s"), sweep="s", background=True)
    t = FakeTrial("t1", {"optim.lr": 1e-3, "train.seed": 0})
    cb.on_trial_start(0, [], t)
    result = _payload(t, 1, 10)
    result["_config"] = "{}"
    result_arm = result["_arm"]
    cb.on_trial_result(0, [], t, result)
    assert not {"_curve", "_rows", "_config", "_timing", "_trial_params", "_arm", "_seed",
                "_node", "_divergence", "_world_size"} & set(result)
    assert result["_status"] == "running" and result["val/loss"] == 2.0
    assert "train/loss" not in result  # a scalar only the sink reads (the metric stays)
    assert result["step"] == 10 and result["lr"] == 1e-3 and result["config"]
    cb.flush()
    rec = cb.records()[0]  # the writer's copy had them all
    assert rec["arm"] == result_arm and rec["seed"] == 0 and rec["timing"]
    assert rec["scalars"]["train/loss"] == 1.0
    assert len(read_curves(str(tmp_path), sweep="s")) == 11
    assert len(read_metrics(str(tmp_path), sweep="s")) == 3


def test_the_result_kept_with_a_checkpoint_is_stripped_as_the_result_was(tmp_path):
    """Tune keeps a second, whole copy of a result that carried a checkpoint (what the
    trial's ``save`` returns) and encodes it into every snapshot while the checkpoint is kept:
    the sink strips it after Tune registered it, and has Tune encode the trial anew."""
    cb = SinkCallback(parquet=ParquetSink(str(tmp_path), "s"), sweep="s")
    t = FakeTrial("t1", {"optim.lr": 1e-3, "train.seed": 0})
    kept = _payload(t, 1, 10)
    invalidated = []
    t.latest_checkpoint_result = SimpleNamespace(checkpoint=object(), metrics=kept)
    t.invalidate_json_state = lambda: invalidated.append("trial")
    t.run_metadata = SimpleNamespace(invalidate_cache=lambda: invalidated.append("metadata"))
    cb.on_trial_save(0, [], t)
    assert not {"_curve", "_rows", "_timing", "train/loss"} & set(kept)
    assert kept["val/loss"] == 2.0 and kept["step"] == 10 and kept["_status"] == "running"
    assert invalidated == ["trial", "metadata"]
    cb.on_trial_save(0, [], t)  # nothing left to strip: Tune's cached encoding stays
    assert invalidated == ["trial", "metadata"]
    t.latest_checkpoint_result = None  # no checkpoint kept
    cb.on_trial_save(0, [], t)
