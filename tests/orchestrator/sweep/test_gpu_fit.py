"""GPU trials without a GPU: which executor a GPU trial gets, what it asks Ray for, the memory
check of a packed plan (device memory injected), and the trial's own device checks."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from tiny_spec import ROOT, cli_env, spec_with

from orchestrator.spec.yaml_reader import spec_from_dict
from orchestrator.sweep import worker
from orchestrator.sweep.gpu_fit import (
    GpuFitError,
    check_gpu_fit,
    local_gpu_bytes,
    plan_configs,
    trial_gpu_bytes,
    visible_devices_match,
)
from orchestrator.sweep.trial import resolve_executor, trial_resources
from workloads.config import GPTConfig, apply_overrides, preset
from workloads.model_size import approx_params

GiB = 2**30


def _res(**kw):
    base = dict(workers_per_trial=1, cpus_per_worker=1.0, gpus_per_worker=0.0, custom={},
                executor="auto", max_failures=1)
    return SimpleNamespace(**{**base, **kw})


# --- executor and resources ------------------------------------------------------------------
@pytest.mark.parametrize("gpus", [0.0, 0.25, 0.5, 1.0, 2.0])
def test_auto_runs_every_single_worker_trial_in_the_trial(gpus):
    r = _res(gpus_per_worker=gpus, cpus_per_worker=0.25)
    assert resolve_executor(r) == "in_trial"
    want = {"CPU": 0.25, **({"GPU": gpus} if gpus else {})}
    assert trial_resources(r) == want  # the Tune trial itself holds the GPU share


def test_auto_takes_ray_train_for_several_workers_and_explicit_choices_stay():
    assert resolve_executor(_res(workers_per_trial=2, gpus_per_worker=1.0)) == "train"
    assert trial_resources(_res(workers_per_trial=2, gpus_per_worker=1.0)) == {"CPU": 0.01}
    assert resolve_executor(_res(gpus_per_worker=0.5, executor="train")) == "train"


# --- the estimate ------------------------------------------------------------------------------
def _gpt(B=4, dtype="float32", **model):
    cfg = preset("gpt-debug")
    cfg.model = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=100, **model)
    cfg.train.batch_size, cfg.train.dtype = B, dtype
    return cfg


def test_estimate_counts_state_activations_logits_and_context():
    cfg = _gpt()
    n = approx_params(cfg.model)
    tokens = 4 * 32
    want = 16 * n + 2 * 72 * tokens * 64 + tokens * 100 * 12 + GiB  # AdamW fp32
    assert trial_gpu_bytes(cfg) == want
    bf = _gpt(dtype="bf16")  # + bf16 weight copies; half the activations; bf16 logits
    assert trial_gpu_bytes(bf) == 18 * n + 2 * 50 * tokens * 64 + tokens * 100 * 10 + GiB
    assert trial_gpu_bytes(_gpt(B=8)) - GiB > 1.9 * (trial_gpu_bytes(cfg) - GiB - 16 * n)


def test_gpt2_small_estimate_is_of_the_order_of_what_it_uses():
    # gpt2-small, B=12, T=1024, bf16: ~2.2 GB of state (bf16 copies included), ~5.7 GB of
    # activations, ~6.2 GB of logits, 1 GiB of context: 13.5 GiB
    assert 9 * GiB < trial_gpu_bytes(preset("gpt2-small")) < 14 * GiB


# --- the check -------------------------------------------------------------------------------
def test_a_plan_that_fits_passes_and_one_that_does_not_is_one_line_with_the_estimate():
    small = preset("gpt2-small")
    check_gpu_fit([("workload gpt2-small", small)], 0.5, 80 * GiB)
    with pytest.raises(GpuFitError) as e:
        check_gpu_fit([("workload gpt2-small", small)], 0.25, 40 * GiB, where="H100")
    msg = str(e.value)
    assert "\n" not in msg
    est = trial_gpu_bytes(small) / GiB
    assert msg.startswith("resources.gpus_per_worker=0.25: workload gpt2-small needs "
                          f"~{est:.1f} GiB")
    assert "its share of a 40.0 GiB H100 is 10.0 GiB" in msg
    assert "raise resources.gpus_per_worker" in msg
    with pytest.raises(GpuFitError, match="lower train.batch_size or the model size"):
        check_gpu_fit([("w", small)], 1.0, 8 * GiB)
    check_gpu_fit([("w", small)], 0.0, 1)  # no GPU asked: nothing to check


def test_the_largest_batch_of_the_space_is_checked():
    spec = spec_from_dict({"name": "g", "workload": {"preset": "gpt2-small"},
                           "space": {"train.batch_size": {"grid": [4, 64]},
                                     "optim.lr": {"grid": [1e-3, 2e-3]}},
                           "resources": {"gpus_per_worker": 0.5}})
    cfgs = plan_configs(spec.base_config(), spec.space, apply_overrides)
    assert [label for label, _ in cfgs] == ["workload gpt2-small", "space.train.batch_size=4",
                                            "space.train.batch_size=64"]
    with pytest.raises(GpuFitError, match=r"space.train.batch_size=64 needs .* at B=64\)"):
        check_gpu_fit(cfgs, 0.5, 80 * GiB)


def test_device_memory_injected_or_probed():
    assert local_gpu_bytes({"GEOSWEEP_GPU_MEMORY_GB": "80"}) == 80 * GiB
    assert local_gpu_bytes({}, probe=False) is None
    with pytest.raises(GpuFitError, match="GEOSWEEP_GPU_MEMORY_GB='lots': not a number"):
        local_gpu_bytes({"GEOSWEEP_GPU_MEMORY_GB": "lots"})


@pytest.mark.timeout(120)
def test_cli_refuses_a_packed_plan_that_cannot_fit_before_ray_starts(tmp_path):
    spec = tmp_path / "g.yaml"
    spec.write_text(spec_with(workload="{preset: gpt2-small}",
                              resources="{gpus_per_worker: 0.25, cpus_per_worker: 0.5}"))
    out = tmp_path / "out"
    # two GPUs of 16 GiB as far as the driver can tell; gpt2-small needs ~13.5 GiB, a quarter 4
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", str(spec), "--out", str(out)],
        capture_output=True, text=True, timeout=110, cwd=ROOT,
        env=cli_env(CUDA_VISIBLE_DEVICES="0,1", GEOSWEEP_GPU_MEMORY_GB="16"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "resources.gpus_per_worker=0.25: workload gpt2-small needs ~" in lines[0]
    assert "its share of a 16.0 GiB GPU is 4.0 GiB" in lines[0]
    from orchestrator.store.lock import LOCK_FILE

    # nothing written but the folder's lock (a rerun with a fitting plan just runs)
    assert [p.name for p in (out / "tiny").iterdir()] == [LOCK_FILE]


# --- in the trial's process ------------------------------------------------------------------
def test_visible_devices_match_ray_ids():
    assert visible_devices_match("1", [1])
    assert visible_devices_match("0,1", ["1", "0"])
    assert not visible_devices_match("0,1", [1])  # sees a GPU that is not its own
    assert not visible_devices_match(None, [0])  # NOSET: sees every GPU


def _fake_ray(monkeypatch, ids):
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: ids)


def test_trial_refuses_to_run_on_gpus_ray_did_not_give_it(monkeypatch):
    _fake_ray(monkeypatch, [1])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(RuntimeError, match=r"CUDA_VISIBLE_DEVICES=None .* GPU\(s\) \[1\]"):
        worker._claim_gpus(preset("gpt-debug"), 0.5, "in_trial", "arm")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert worker._claim_gpus(preset("gpt-debug"), 0.5, "in_trial", "arm") == "1"


def test_outside_ray_no_gpu_is_claimed_and_no_ray_is_started(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get_gpu_ids", lambda: pytest.fail("would start a Ray"))
    cfg = preset("gpt-debug")
    assert worker._claim_gpus(cfg, 0.0, "in_trial", "arm") == ""
    assert cfg.train.device == "cpu" and not ray.is_initialized()


def test_a_gpu_less_trial_trains_on_cpu_even_where_gpus_are_visible(monkeypatch):
    _fake_ray(monkeypatch, [])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # Ray 2.60 leaves it for zero GPUs
    cfg = preset("gpt-debug")
    assert worker._claim_gpus(cfg, 0.0, "in_trial", "arm") == ""
    assert cfg.train.device == "cpu"
    pinned = preset("gpt-debug")
    pinned.train.device = "cuda:1"  # the user's explicit choice stays
    worker._claim_gpus(pinned, 0.0, "in_trial", "arm")
    assert pinned.train.device == "cuda:1"
