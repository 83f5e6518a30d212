"""Final checkpoints in a sweep folder, weights as MLflow artifacts, and load_model.

``make_sweep`` (tests/orchestrator/fake_sweep.py, shared with evaluation/test_eval.py) builds a
sweep folder without Ray: spec.yaml, sweep.json, an MLflow store with parent + child runs,
Parquet trial records, and training checkpoints in Tune's ``in_trial`` layout; trial 2 diverged
and has none.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fake_sweep import TRIALS, FakeSweep, make_sweep

from orchestrator.spec.sweep_spec import SpecError
from orchestrator.spec.yaml_reader import load_spec
from orchestrator.store.checkpoints import checkpoint_step, final_checkpoint, trial_checkpoints
from orchestrator.store.weights import best_record, keep_weights, load_model, model_from_checkpoint

torch.set_num_threads(1)

@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> FakeSweep:
    return make_sweep(tmp_path_factory.mktemp("weights"))


def _client(sw: FakeSweep):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=sw.uri)


def _x(cfg, n: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, cfg.model.vocab_size, (n, cfg.model.block_size), generator=g)


# --- checkpoint discovery --------------------------------------------------------------------


def test_final_checkpoint_is_the_highest_step_in_tune_layout(sweep):
    tid = "abc12_00000"
    found = trial_checkpoints(sweep.root, tid)
    assert [checkpoint_step(p) for p in found] == [4, 8]
    assert final_checkpoint(sweep.root, tid) == found[-1]
    assert final_checkpoint(sweep.root, "abc12_00002") is None  # diverged: none saved
    assert final_checkpoint(sweep.root, "abc12_0000") is None  # a prefix is not an id


def test_final_checkpoint_in_train_executor_layout_and_incomplete_entries(tmp_path):
    from workloads.checkpoint import save_checkpoint

    tid = "f00d1_00003"
    train = tmp_path / "ray" / "train" / f"train-{tid}"
    save_checkpoint(train / "checkpoint_2026-11-30_04-00-00.000000", 6, {"step": 6})
    save_checkpoint(train / "checkpoint_2026-11-30_04-00-09.000000", 12, {"step": 12})
    half = train / "checkpoint_2026-11-30_04-00-10.000000" / "step-00000018"
    half.mkdir(parents=True)  # no state.pt: never picked
    assert checkpoint_step(final_checkpoint(tmp_path, tid)) == 12
    assert [checkpoint_step(p) for p in trial_checkpoints(tmp_path, tid)] == [6, 12]
    with pytest.raises(ValueError, match="step-<8 digits>"):
        checkpoint_step(tmp_path / "checkpoint_000000")
    # an extension experiment (ray/tune-2) holds the trials it added; other folders never count
    ext = "beef7_00001"
    save_checkpoint(tmp_path / "ray" / "tune-2" / f"trial_driver_{ext}_1_x" / "checkpoint_000000",
                    30, {"step": 30})
    save_checkpoint(tmp_path / "ray" / "other" / f"trial_driver_{ext}_1_x" / "checkpoint_000000",
                    40, {"step": 40})
    assert checkpoint_step(final_checkpoint(tmp_path, ext)) == 30


# --- weights round trip --------------------------------------------------------------------


def test_model_from_checkpoint_is_the_saved_model(sweep):
    tid = "abc12_00001"
    model, cfg, step = model_from_checkpoint(final_checkpoint(sweep.root, tid))
    assert step == 8 and not model.training
    x = _x(cfg)
    assert torch.equal(model(x)[0], sweep.models[tid](x)[0])


@pytest.mark.timeout(120)
def test_trial_runs_of_a_few_trials_are_the_whole_searchs(sweep):
    """keep_weights looks up only the trials it keeps: the same run ids as the whole search."""
    from orchestrator.store.runs import trial_runs

    client = _client(sweep)
    full = trial_runs(client, "fake")
    assert set(full) == set(TRIALS)
    for tid in TRIALS:
        assert trial_runs(client, "fake", trials=[tid]) == {tid: full[tid]}
    assert trial_runs(client, "fake", trials=list(TRIALS)) == full
    assert trial_runs(client, "fake", trials=["no_such_trial"]) == {}
    # a quote is never put in a filter: the whole search, cut to the trials asked for
    assert trial_runs(client, "fake", trials=["x' or '1'='1"]) == {}


@pytest.mark.timeout(120)
def test_logged_weights_load_with_one_call_and_identical_logits(sweep):
    from safetensors import safe_open

    from orchestrator.store.runs import trial_runs
    from orchestrator.store.weights import log_weights

    tid = "abc12_00000"
    client = _client(sweep)
    run_id = trial_runs(client, "fake")[tid]
    uri = log_weights(client, run_id, final_checkpoint(sweep.root, tid), trial=tid, sweep="fake")
    assert uri == f"runs:/{run_id}/model"
    names = {f.path for f in client.list_artifacts(run_id, "model")}
    assert names == {"model/model.safetensors", "model/config.json", "model/tokenizer.json",
                     "model/README.txt"}
    ref = sweep.models[tid]
    for got in (load_model(uri, tracking_uri=sweep.uri),
                load_model(uri, tracking_uri=str(sweep.root))):  # a sweep folder works too
        model, cfg = got
        assert not model.training and cfg.optim.lr == 1e-3
        assert model.wte.weight is model.lm_head.weight  # still tied after loading
        x = _x(cfg)
        assert torch.equal(model(x)[0], ref(x)[0])
    local = Path(client.download_artifacts(run_id, "model", str(sweep.root / "dl")))
    with safe_open(str(local / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert len(keys & {"wte.weight", "lm_head.weight"}) == 1  # the tied tensor stored once
    tok = json.loads((local / "tokenizer.json").read_text())
    assert tok["tokenizer"] == "char" and len(tok["char_vocab"]) == cfg.model.vocab_size
    for ref_path in (local, local.parent, final_checkpoint(sweep.root, tid)):
        model, cfg = load_model(ref_path)
        assert torch.equal(model(x)[0], ref(x)[0])
    # logging again replaces the files: still one copy
    log_weights(client, run_id, final_checkpoint(sweep.root, tid))
    assert len(client.list_artifacts(run_id, "model")) == 4


@pytest.mark.timeout(120)
def test_weights_the_trial_prepared_are_logged_as_it_wrote_them(sweep, tmp_path):
    """A trial writes its final weights beside its final checkpoint (prepare_weights, what
    the worker does at its last report); log_weights logs those files, byte for byte what it
    builds itself from the checkpoint, with its README."""
    import shutil

    from orchestrator.store.runs import trial_runs
    from orchestrator.store.weights import log_weights, prepare_weights

    tid = "abc12_00001"
    ckpt = final_checkpoint(sweep.root, tid)
    client = _client(sweep)
    run_id = trial_runs(client, "fake")[tid]
    log_weights(client, run_id, ckpt, trial=tid, sweep="fake")  # built here (no files)
    built = Path(client.download_artifacts(run_id, "model", str(tmp_path / "built")))
    # the trial's own copy: the same checkpoint folder, with model/ beside step-<08d>/
    ray_ckpt = tmp_path / "checkpoint_000009"
    shutil.copytree(ckpt, ray_ckpt / ckpt.name)
    folder = prepare_weights(ray_ckpt / ckpt.name, ray_ckpt)
    assert folder == ray_ckpt / "model" and not (folder / "README.txt").exists()
    import orchestrator.store.weights as W

    def no_build(path):
        raise AssertionError("rebuilt the model although the trial prepared its weights")

    orig, W.model_from_checkpoint = W.model_from_checkpoint, no_build
    try:
        log_weights(client, run_id, ray_ckpt / ckpt.name, trial=tid, sweep="fake")
    finally:
        W.model_from_checkpoint = orig
    logged = Path(client.download_artifacts(run_id, "model", str(tmp_path / "logged")))
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted(p.name for p in logged.iterdir()) == [
        "README.txt", "config.json", "model.safetensors", "tokenizer.json"]
    for n in names:
        assert (built / n).read_bytes() == (logged / n).read_bytes(), n


def test_untied_model_round_trip(tmp_path):
    from orchestrator.store.weights import save_weights
    from workloads.config import apply_overrides, preset
    from workloads.models import build_model

    cfg = apply_overrides(preset("gpt-debug"), {"model.tie_embeddings": False,
                                                "model.vocab_size": 50})
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    save_weights(model, cfg, tmp_path / "model")
    got, got_cfg = load_model(tmp_path)
    assert got.wte.weight is not got.lm_head.weight
    x = _x(got_cfg)
    assert torch.equal(got(x)[0], model(x)[0])


def test_mlp_round_trip_has_no_tokenizer(tmp_path):
    from orchestrator.store.weights import save_weights
    from workloads.config import preset
    from workloads.models import build_model

    cfg = preset("mlp-debug")
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    folder = save_weights(model, cfg, tmp_path / "model")
    assert not (folder / "tokenizer.json").exists()
    got, got_cfg = load_model(folder)
    x = torch.randn(3, cfg.model.d_in)
    assert got_cfg.model == cfg.model and torch.equal(got(x)[0], model(x)[0])


def test_load_model_bad_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model folder"):
        load_model(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(tmp_path)


# --- keep_weights --------------------------------------------------------------------------


def _records():
    return [{"trial": t, "status": s, "final_val_loss": v} for t, (s, _, v) in TRIALS.items()]


def test_best_record_follows_mode():
    assert best_record(_records(), "min")["trial"] == "abc12_00001"
    assert best_record(_records(), "max")["trial"] == "abc12_00000"
    assert best_record([{"trial": "x", "status": "diverged", "final_val_loss": 1.0}]) is None


@pytest.mark.timeout(120)
def test_keep_weights_policies(tmp_path):
    sw = make_sweep(tmp_path)
    client = _client(sw)
    lines: list[str] = []
    none = sw.spec.model_copy(update={"tracking": sw.spec.tracking.model_copy(
        update={"keep_weights": "none"})})
    assert keep_weights(none, sw.root, _records(), client, printer=lines.append) == {}
    assert sw.spec.tracking.keep_weights == "best"  # the default
    kept = keep_weights(sw.spec, sw.root, _records(), client, printer=lines.append)
    assert list(kept) == ["abc12_00001"]  # the lowest final val loss
    assert any("best trial's weights: runs:/" in ln for ln in lines)
    every = sw.spec.model_copy(update={"tracking": sw.spec.tracking.model_copy(
        update={"keep_weights": "all"})})
    recs = _records() + [{"trial": "zzz99_00009", "status": "completed", "final_val_loss": 3.0}]
    kept = keep_weights(every, sw.root, recs, client, printer=lines.append)
    assert sorted(kept) == ["abc12_00000", "abc12_00001"]  # never the diverged one
    assert any("zzz99_00009 not kept" in ln for ln in lines)  # no run, no checkpoint: warned
    run = client.get_run(kept["abc12_00000"].split("/")[1])
    assert run.data.tags["geosweep.weights"] == "model/ (step 8)"


def test_keep_weights_spec_value_is_checked(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nworkload: {preset: gpt-debug}\nspace: {}\n"
                   "tracking: {keep_weights: some}\n")
    with pytest.raises(SpecError) as e:
        load_spec(str(bad))
    msg = str(e.value)
    assert "\n" not in msg and "tracking.keep_weights" in msg and "'best', 'all' or 'none'" in msg
