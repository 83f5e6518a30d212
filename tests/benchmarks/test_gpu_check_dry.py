"""benchmarks/gpu_check.sh --cpu: the GPU path's device check, run dry on the CPU at tiny sizes
so that it cannot rot between the rare runs on a GPU. Every check runs (a: a real `geosweep
run` of gpu_smoke on a local Ray), prints its table, and the JSON line comes last."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from workloads.config import ManifoldConfig

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.mark.timeout(400)
def test_gpu_check_runs_dry_on_cpu(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), RAY_USAGE_STATS_ENABLED="0",
               PYTHONUNBUFFERED="1")
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    out = json.loads(last)
    assert (tmp_path / "gpu_check.json").read_text().strip() == last
    assert (tmp_path / "gpu_check.log").exists()
    assert out["mode"] == "cpu" and set(out["checks"]) == {"a", "b", "c", "d"}
    rows = [r for rs in out["checks"].values() for r in rs]
    assert not [r for r in rows if r["status"] in ("error", "stopped", "DIFF")], rows
    # (a) the sweep ran its 2 trials; back to back ran the same 2
    sweep, solo = out["checks"]["a"]
    assert sweep["status"] == "ok" and sweep["trials"] == sweep["completed"] == 2
    assert sweep["overhead_per_trial_s"] >= 0 and sweep["sweep_s"] > sweep["trials_phase_s"]
    assert solo["solo_n"] == 2 and solo["sweep_vs_back_to_back"] > 0
    # (b) compiled = eager within fp32 rounding
    (b,) = out["checks"]["b"]
    assert b["status"] == "ok" and b["loss_rel"] < 1e-5 and b["grad_rel"] < 1e-5
    # (c) every family eager at both batch sizes, and one compiled row
    c = {r["name"]: r for r in out["checks"]["c"]}
    assert len(c) == 17 and all(r["status"] == "ok" for r in c.values())
    assert c["pre_ln B=2"]["vs_pre_ln"] == 1.0 and c["pre_ln+compile B=2"]["compile_s"] > 0
    assert all(r["tokens_per_s"] > 0 and r["est_mem_gb"] > 1 for r in c.values())
    # (d) AdamW and Muon timed; the Manifold Muon rows run where the dual-mode key exists
    d = {r["name"]: r for r in out["checks"]["d"]}
    assert d["pre_ln/muon B=2"]["vs_adamw"] > 0 and d["pre_ln/muon B=2"]["vs_muon"] == 1.0
    mm = [r for k, r in d.items() if "mmuon" in k]
    assert len(mm) == 4
    if "dual_mode" in {f.name for f in dataclasses.fields(ManifoldConfig)}:
        ran = [r for r in mm if r["status"] == "ok"]
        assert ran and all(r["vs_muon"] > 0 for r in ran), mm
        assert all(r in ran or r["note"].startswith("budget") for r in mm), mm
    else:
        assert all(r["status"] == "skipped" and "dual_mode" in r["note"] for r in mm), mm
    assert all(t["verdict"] == "dry run" for t in out["targets"])
    assert "== summary ==" in proc.stdout
