"""MLflow sink against a real sqlite store: structure, idempotence, complete histories."""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
from mlflow import MlflowClient

from orchestrator.store.mlflow import MlflowSink, default_tracking, flatten_params

pytestmark = pytest.mark.timeout(120)

SPEC = "name: sw\nworkload: {preset: gpt-debug}\n"
PROV = {"git": {"sha": "abc123", "dirty": True}, "python": "3.11", "command": "geosweep run"}


def _points(first: int, last: int, offset: float = 0.0) -> list[dict]:
    pts = [{"step": s, "split": "train", "metric": "loss", "value": 10.0 / s + offset,
            "wall_time": 0.01 * s} for s in range(first, last + 1)]
    pts += [{"step": s, "split": "val", "metric": "loss", "value": 5.0 / s,
             "wall_time": 0.01 * s} for s in range(first, last + 1) if s % 100 == 0]
    return pts


@pytest.fixture()
def store(tmp_path, tmp_path_factory):
    """A fresh sqlite store per test, copied from one migrated per session (~15 s saved)."""
    template = tmp_path_factory.getbasetemp() / "mlflow-template.db"
    if not template.exists():
        MlflowClient(f"sqlite:///{template}").search_experiments()
    uri, art = default_tracking(str(tmp_path / "sweep"))
    os.makedirs(tmp_path / "sweep")
    shutil.copy(template, tmp_path / "sweep" / "mlflow.db")
    return uri, art


def test_parent_child_structure_tags_params_and_spec(store, tmp_path):
    uri, art = store
    sink = MlflowSink(uri, "geosweep-test", "sw")
    parent = sink.start_parent(SPEC, {"search": {"algorithm": "grid"}, "seeds": [0, 1]}, PROV)
    child = sink.start_child("t_00000", {"optim.lr": 1e-3, "model.residual.p": math.inf,
                                         "long": "x" * 7000, "optim.manifold.assignment":
                                         {"blocks.*.attn": "stiefel"}},
                             {"geosweep.arm": "lr=0.001", "geosweep.seed": 0})
    sink.end_child("t_00000", "diverged", {"geosweep.divergence.reason": "nonfinite_loss",
                                           "geosweep.divergence.step": 17})
    client = MlflowClient(uri)
    c = client.get_run(child)
    assert c.data.tags["mlflow.parentRunId"] == parent
    assert c.data.tags["geosweep.trial_id"] == "t_00000"
    assert c.data.tags["geosweep.status"] == "diverged"
    assert c.data.tags["geosweep.divergence.step"] == "17"
    assert c.data.tags["geosweep.seed"] == "0"
    assert c.info.status == "FAILED" and c.info.run_name == "t_00000"  # diverged = FAILED
    assert c.data.params["optim.lr"] == "0.001"
    assert c.data.params["model.residual.p"] == "inf"
    assert len(c.data.params["long"]) == 6000
    assert c.data.params["optim.manifold.assignment.blocks._.attn"] == "stiefel"

    p = client.get_run(parent)
    assert p.data.params == {"search.algorithm": "grid", "seeds": "[0, 1]"}
    assert p.data.tags["geosweep.git.sha"] == "abc123"
    assert p.data.tags["geosweep.git.dirty"] == "True"
    assert p.data.tags["geosweep.command"] == "geosweep run"
    arts = {a.path for a in client.list_artifacts(parent)}
    assert arts == {"spec.yaml", "provenance.json"}
    path = client.download_artifacts(parent, "spec.yaml", str(tmp_path / "dl"))
    assert open(path).read() == SPEC
    # artifacts live next to the database, not in ./mlruns
    assert p.info.artifact_uri.startswith(art) or art in p.info.artifact_uri
    assert os.path.exists(os.path.join(art))


def test_resume_reuses_parent_and_child(store, monkeypatch):
    uri, _ = store
    a = MlflowSink(uri, "e", "sw")
    parent = a.start_parent(SPEC, {"x": 1}, PROV)
    child = a.start_child("t1", {"optim.lr": 0.1})
    a.log_curve("t1", _points(1, 50))
    # a fresh driver process (crash + resume): same runs, no duplicates
    b = MlflowSink(uri, "e", "sw")
    assert b.start_parent(SPEC, {"x": 1, "y": 2}, PROV) == parent
    # the sweep's children were read once by start_parent: a trial start searches nothing
    searches = []
    real = b.client.search_runs
    monkeypatch.setattr(b.client, "search_runs", lambda *a, **k: searches.append(1) or real(
        *a, **k))
    assert b.start_child("t1", {"optim.lr": 0.1}) == child
    assert b.start_child("t1", {"optim.lr": 0.1}) == child
    other = b.start_child("t2", {"optim.lr": 0.2})
    assert searches == [] and other != child
    # the resumed trial re-reports steps 41..50 (lost segment) then continues to 60
    assert b.log_curve("t1", _points(41, 60, offset=1.0)) == 10
    client = MlflowClient(uri)
    runs = client.search_runs([b.experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted([parent, child, other])
    hist = client.get_metric_history(child, "Loss/train")  # train/loss: docs/metrics.md §N
    assert sorted(m.step for m in hist) == list(range(1, 61))
    assert client.get_run(parent).data.params == {"x": "1", "y": "2"}
    # another sweep in the same experiment gets its own parent
    c = MlflowSink(uri, "e", "other")
    assert c.start_parent(SPEC, {}, PROV) != parent


def _metric_calls(sink, path: str, monkeypatch) -> list[int]:
    """How many points each metric write carries: MLflow's log_batch (``mlflow``: the path of
    a server store, or a pickled sink) or the sqlite tables directly (``direct``: the sweep's
    own sqlite store, store/mlflow_metrics.py)."""
    calls: list[int] = []
    if path == "mlflow":
        sink._points.close()
        sink._points = None
        real = sink.client.log_batch

        def spy(run_id, metrics=(), params=(), tags=()):
            calls.append(len(metrics))
            return real(run_id, metrics=metrics, params=params, tags=tags)

        monkeypatch.setattr(sink.client, "log_batch", spy)
    else:
        assert sink._points is not None
        real_write = sink._points.write

        def spy_write(run_id, metrics=(), params=(), tags=(), end=None):
            if metrics:
                calls.append(len(metrics))
            return real_write(run_id, metrics, params, tags, end)

        monkeypatch.setattr(sink._points, "write", spy_write)
        monkeypatch.setattr(sink.client, "log_batch", lambda *a, metrics=(), **k: (
            pytest.fail("points through MLflow's log_batch") if metrics else None))
    return calls


@pytest.mark.parametrize("path", ["direct", "mlflow"])
def test_batched_history_complete(store, monkeypatch, path):
    uri, _ = store
    sink = MlflowSink(uri, "e", "sw")
    sink.start_parent(SPEC, {}, PROV)
    child = sink.start_child("t1", {})
    calls = _metric_calls(sink, path, monkeypatch)
    pts = _points(1, 2500)
    pts.append({"step": 2500, "split": "train", "metric": "grad_norm", "value": math.nan,
                "wall_time": 1.0})
    assert sink.log_curve("t1", pts) == 2500 + 25 + 1
    assert sink.log_curve("t1", _points(2500, 2500)) == 0  # repeated final report
    # MLflow's per-call limit of 1000 metrics; the sqlite tables take them in one transaction
    assert calls == ([1000, 1000, 526] if path == "mlflow" else [2526])
    assert sink.log_scalars("t1", {"val/acc": 0.5, "flag": True, "name": "x"}, step=2500) == 1

    client = MlflowClient(uri)
    hist = sorted(client.get_metric_history(child, "Loss/train"), key=lambda m: m.step)
    assert [m.step for m in hist] == list(range(1, 2501))
    assert [m.value for m in hist[:3]] == [10.0, 5.0, 10.0 / 3]
    assert hist[99].timestamp - hist[0].timestamp == 990  # start time + wall_time
    val = client.get_metric_history(child, "Loss/val")
    assert sorted(m.step for m in val) == list(range(100, 2501, 100))
    assert math.isnan(client.get_metric_history(child, "train/grad_norm")[0].value)
    assert client.get_metric_history(child, "val/acc")[0].value == 0.5


def test_errors_and_parent_artifact(store, tmp_path):
    uri, _ = store
    sink = MlflowSink(uri, "e", "sw")
    with pytest.raises(RuntimeError, match="start_parent"):
        sink.start_child("t1", {})
    parent = sink.start_parent(SPEC, {}, PROV)
    with pytest.raises(KeyError, match="trial_id='nope'"):
        sink.log_curve("nope", _points(1, 2))
    sink.start_child("t1", {})
    with pytest.raises(ValueError, match="status='done'"):
        sink.end_child("t1", "done")
    sink.end_child("t1", "failed", {"geosweep.error": "worker died"})
    f = tmp_path / "summary.txt"
    f.write_text("ok")
    sink.log_artifact(str(f))
    sink.set_tags(None, {"geosweep.best": 1.5})
    sink.end_parent()
    client = MlflowClient(uri)
    assert client.get_run(sink._children["t1"]).info.status == "FAILED"
    p = client.get_run(parent)
    assert p.info.status == "FINISHED" and p.data.tags["geosweep.best"] == "1.5"
    assert "summary.txt" in {a.path for a in client.list_artifacts(parent)}


def test_flatten_params():
    flat = flatten_params({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None, "f": {}})
    assert flat == {"a.b": "1", "a.c.d": "[1, 2]", "e": "None", "f": "{}"}


def test_running_children_lists_only_this_sweeps_unfinished_trials(store):
    uri, _ = store
    a = MlflowSink(uri, "e", "sw")
    a.start_parent(SPEC, {}, PROV)
    for t in ("t1", "t2", "t3"):
        a.start_child(t, {})
    a.end_child("t2", "completed")
    other = MlflowSink(uri, "e", "other")
    other.start_parent(SPEC, {}, PROV)
    other.start_child("t9", {})
    assert a.running_children() == ["t1", "t3"]
    assert other.running_children() == ["t9"]


@pytest.mark.parametrize("path", ["direct", "mlflow"])
def test_log_result_one_batch_same_points_as_separate_calls(store, monkeypatch, path):
    """A result's curve, scalars and model-wide rows: one write, and exactly the points
    (values, steps, first value per step kept) that separate log_curve/log_scalars calls keep."""
    uri, _ = store
    sink = MlflowSink(uri, "e", "sw")
    sink.start_parent(SPEC, {}, PROV)
    sep, one = sink.start_child("sep", {}), sink.start_child("one", {})
    scal = [({"train/loss": 99.0, "val/loss": 0.25}, 200), ({"cont/rank": 3.0}, 100)]
    sink.log_curve("sep", _points(1, 200))
    for sc, step in scal:
        sink.log_scalars("sep", sc, step)
    calls = _metric_calls(sink, path, monkeypatch)
    # 200 train + 2 val points, train/loss at 200 already in the curve (kept: the curve's)
    assert sink.log_result("one", _points(1, 200), scal) == 200 + 2 + 1
    assert calls == [203]
    client = MlflowClient(uri)
    for key in ("Loss/train", "Loss/val", "cont/rank"):
        a = sorted((m.step, m.value) for m in client.get_metric_history(sep, key))
        b = sorted((m.step, m.value) for m in client.get_metric_history(one, key))
        assert a == b and a
    train = {m.step: m.value for m in client.get_metric_history(one, "Loss/train")}
    assert train[200] == 10.0 / 200  # the curve's point, not the scalar's 99.0


def test_model_training_view_summary_and_failed_parent(store):
    from orchestrator.store.summary import log_sweep_summary

    uri, _ = store
    sink = MlflowSink(uri, "kind", "sw")
    client = MlflowClient(uri)
    exp = client.get_experiment(sink.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    sink.start_parent(SPEC, {}, PROV)
    recs = [{"trial": "a", "status": "completed", "objective": 2.5},
            {"trial": "b", "status": "completed", "objective": 1.5},
            {"trial": "c", "status": "diverged", "objective": 0.1},
            {"trial": "d", "status": "stopped", "objective": 3.0}]
    for r in recs:
        r["params"] = {"train.seed": 1, "optim.lr": 0.1}  # the seed's column goes last
        sink.start_child(r["trial"], r["params"], name=f"run {r['trial']}")
    out = log_sweep_summary(sink, recs, "val/loss")
    p = client.get_run(sink.parent_id)
    assert p.data.metrics["sweep/best_objective"] == 1.5  # diverged penalties never win
    assert p.data.metrics["sweep/n_completed"] == 2 and p.data.metrics["sweep/n_stopped"] == 1
    assert p.data.metrics["sweep/n_trials"] == 4 and p.data.metrics["sweep/n_failed"] == 0
    best = sink.run_id("b")
    assert p.data.tags["geosweep.best.run_id"] == best
    assert p.data.tags["geosweep.best.run_name"] == "run b"
    assert p.data.tags["geosweep.best.link"] == (
        f"#/experiments/{sink.experiment_id}/runs/{best}?workflowType=machine_learning")
    assert out["tags"]["geosweep.objective"] == "val/loss"
    assert out["tags"]["geosweep.objective_key"] == "Loss/val"
    # the parent's description: counts by status, the best trial by name with a link to it
    note = p.data.tags["mlflow.note.content"]
    assert "4 trials (2 completed, 1 diverged, 1 stopped early by the scheduler)" in note
    assert f"[run b](#/experiments/{sink.experiment_id}/runs/{best}?workflowType=" in note
    assert "`val/loss` = 1.5" in note
    assert (f"[the sweep's runs](#/experiments/{sink.experiment_id}/runs?viewStateShareKey="
            "geosweep-sw&workflowType=machine_learning)") in note
    # the sweep's shared view (geosweep ui's link): flat, sorted by the objective, every run
    # charted; status and reason first, then the losses and the params
    view = json.loads(client.get_experiment(sink.experiment_id).tags[
        "mlflow.sharedViewState.geosweep-sw"])
    assert view["selectedColumns"] == ["tags.`geosweep.status`", "tags.`geosweep.reason`",
                                       "metrics.`Loss/val`", "metrics.`Loss/train`",
                                       "params.`optim.lr`", "params.`train.seed`",
                                       "attributes.`Duration`"]
    assert view["columnOrder"] == view["selectedColumns"]
    assert view["orderByKey"] == "metrics.`Loss/val`" and view["orderByAsc"] is True
    assert view["runsHiddenMode"] == "SHOW_ALL" and "runsExpanded" not in view
    from orchestrator.store.runs import view_experiment

    assert view_experiment(uri, "sw") == sink.experiment_id
    assert view_experiment(uri, "nosuchsweep") is None
    sink.end_parent("FAILED", error="RuntimeError: boom")
    p = client.get_run(sink.parent_id)
    assert p.info.status == "FAILED" and p.data.tags["geosweep.reason"] == "RuntimeError: boom"
    # an old experiment without the tag gets it when a sink opens it
    client.create_experiment("old")
    MlflowSink(uri, "old", "sw2")
    assert client.get_experiment_by_name("old").tags["mlflow.experimentKind"] == \
        "custom_model_development"


def test_infinite_values_are_not_logged(store):
    """MLflow would store inf as 1.797e308 (issue 33 §7): such points are left out; a NaN
    (a real diverged loss) is logged."""
    uri, _ = store
    sink = MlflowSink(uri, "inf", "sw")
    sink.start_parent(SPEC, {}, PROV)
    sink.start_child("t", {"optim.lr": 1.0})
    pts = [{"step": 1, "split": "train", "metric": "loss", "value": 3.0, "wall_time": 0.1},
           {"step": 2, "split": "train", "metric": "loss", "value": math.inf, "wall_time": 0.2},
           {"step": 3, "split": "train", "metric": "loss", "value": math.nan, "wall_time": 0.3}]
    sink.log_result("t", pts, [({"val/best_loss": math.inf, "train/lr": 1.0}, 3)])
    client = MlflowClient(uri)
    run = client.get_run(sink.run_id("t"))
    assert "val/best_loss" not in run.data.metrics and run.data.metrics["train/lr"] == 1.0
    hist = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id,
                                                                         "Loss/train"))
    assert [s for s, _ in hist] == [1, 3] and hist[0][1] == 3.0 and math.isnan(hist[1][1])
    sink.end_child("t", "diverged", {"geosweep.reason": "diverged: nonfinite_loss at step 3"})
    run = client.get_run(sink.run_id("t"))
    assert run.data.tags["mlflow.note.content"] == \
        "**diverged**: diverged: nonfinite_loss at step 3"
