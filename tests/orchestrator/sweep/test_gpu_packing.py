"""Packed GPU trials on a real local Ray with 2 logical GPUs (``num_gpus=2``, no GPU needed):
4 trials at ``gpus_per_worker: 0.5`` run at once, in their own Tune trial process (the
``auto`` executor), each with the ``CUDA_VISIBLE_DEVICES`` of the GPU Ray gave it, two per
GPU and never more. The trial itself checks that its CUDA_VISIBLE_DEVICES is exactly its
Ray GPU (orchestrator/sweep/worker.py) and fails otherwise; its node label names it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter

import pytest
from tiny_spec import ROOT, cli_env

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DRIVER = textwrap.dedent("""
    import json, sys, threading, time
    from cluster.local import worker_env, ray_env
    from cluster.ray_loopback import loopback_env
    ray_env(); loopback_env()
    import ray
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": worker_env()})
    from orchestrator.spec.yaml_reader import spec_from_dict
    from orchestrator.sweep.tuner import run_sweep
    spec = spec_from_dict({
        "name": "packed", "workload": {"preset": "gpt-debug"},
        "space": {"optim.lr": {"grid": [1e-3, 2e-3, 3e-3, 4e-3]}}, "seeds": [0],
        "search": {"algorithm": "grid", "max_concurrent": 4},
        "budget": {"steps": STEPS, "eval_every": STEPS // 2, "metrics_every": 0},
        "resources": {"cpus_per_worker": 0.25, "gpus_per_worker": 0.5},
    })
    free = []  # GPUs Ray has free, sampled while the sweep runs
    done = threading.Event()
    def sample():
        while not done.wait(0.2):
            free.append(ray.available_resources().get("GPU", 0.0))
    threading.Thread(target=sample, daemon=True).start()
    res = run_sweep(spec, sys.argv[1], printer=lambda s: None)
    done.set()
    print("RESULT " + json.dumps({"free_min": min(free) if free else None, "records": [
        {k: r.get(k) for k in ("trial", "status", "node", "started_at", "ended_at", "error")}
        for r in res.records]}))
""")


@pytest.mark.timeout(420)
def test_four_half_gpu_trials_share_two_logical_gpus(tmp_path):
    # ~400 steps of gpt-debug: tens of seconds of training with 4 trials on 2 cores, far longer
    # than the few seconds between the first trial's start and the last one's
    proc = subprocess.run([sys.executable, "-c", DRIVER.replace("STEPS", "400"),
                           str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=400, cwd=ROOT, env=cli_env(OMP_NUM_THREADS="1"))
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(line.removeprefix("RESULT "))
    recs = out["records"]
    assert [r["status"] for r in recs] == ["completed"] * 4, recs
    # each trial's CUDA_VISIBLE_DEVICES (checked against ray.get_gpu_ids() in the trial)
    gpus = [r["node"].rsplit(" gpu ", 1)[1] for r in recs]
    assert Counter(gpus) == {"0": 2, "1": 2}, gpus  # two halves per GPU, never three
    # all four ran at the same time: one moment inside every trial's run
    assert max(r["started_at"] for r in recs) < min(r["ended_at"] for r in recs), recs
    assert out["free_min"] == 0.0  # both GPUs fully held at once
