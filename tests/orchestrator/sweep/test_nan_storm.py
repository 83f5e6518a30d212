"""A NaN storm (issue 7, section 5; made machine-independent in issue 17): about half the
trials of a sweep blow up; the sweep still completes, every trial is classified (healthy lrs
completed, exploding lrs diverged), the searcher proposes every trial it was asked for, and the
healthy trials are untouched (full curves, same final loss as the same config trained alone).

The outcome must not depend on floating-point luck (thread count, load, CPU). The old test
relied on fp32 overflowing within 30 steps at lr 30 with every rule but the non-finite one
off; on another machine it did not, and the trial ended "completed" at val loss 104,296.
Now, with the default rules (AdamW, no clipping, warm-up over the whole budget):
- lr 1e30: the first AdamW step moves every weight by ~lr/30 = 3e28, so at step 2 every
  attention logit is a sum of products of ~1e28 x 1e28 > 3.4e38 = fp32 max: the loss is NaN
  (or the grad inf) at step 2 whatever the summation order. Asserted: nonfinite_*, step 2.
- lr 30 and 1000: the loss leaves the ``loss_vs_initial`` bound (~6.65) by orders of magnitude
  within two steps (measured: 18, 77, 103 at lr 30; 1.9e4 at lr 1000 at step 2). Whichever
  rule fires first (a non-finite value, grad_explosion, a loss rule), the trial is diverged by
  step 6; and the final-loss check would catch it at the end even if every per-step rule missed.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
STEPS, EVAL_EVERY, SAMPLES = 30, 10, 8
HEALTHY = (1.0e-3, 2.0e-3, 3.0e-3)
EXPLODING = (30.0, 1000.0, 1e30)  # diverged by step 6 whatever the machine (docstring)
CERTAIN_NAN = 1e30  # non-finite at step 2 by construction
DIVERGED_BY = 6

SPEC = f"""
name: nanstorm
workload:
  preset: gpt-debug
  overrides: {{optim.grad_clip: 0.0, optim.warmup_steps: {STEPS}}}
space:
  optim.lr: {{choice: [{", ".join(map(str, HEALTHY + EXPLODING))}]}}
seeds: [0]
search: {{algorithm: random, num_samples: {SAMPLES}, max_concurrent: 2, seed: 3}}
budget: {{steps: {STEPS}, eval_every: {EVAL_EVERY}, metrics_every: 0}}
resources: {{workers_per_trial: 1, cpus_per_worker: 1}}
"""


@pytest.fixture(scope="module")
def storm(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nanstorm")
    spec = tmp / "nanstorm.yaml"
    spec.write_text(SPEC)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(spec), "--out",
                           str(tmp / "out")], capture_output=True, text=True, timeout=600,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from orchestrator.store.parquet import read_curves, read_trials

    root = tmp / "out" / "nanstorm" / "parquet"
    trials = read_trials(str(root), sweep="nanstorm")
    curves = read_curves(str(root), sweep="nanstorm")
    print(trials[["trial", "optim.lr", "status", "divergence_reason", "divergence_step",
                  "final_val_loss"]].sort_values("optim.lr").to_string(index=False))
    return trials, curves, proc


@pytest.mark.timeout(900)
def test_every_proposed_trial_ran(storm):
    trials, _, proc = storm
    assert len(trials) == SAMPLES, trials[["trial", "status"]]
    assert trials["trial"].nunique() == SAMPLES
    assert set(trials["status"]) <= {"completed", "diverged"}, trials["status"].tolist()
    lrs = trials["optim.lr"].astype(float)
    assert set(lrs) <= set(HEALTHY + EXPLODING)
    n_bad = int(lrs.isin(EXPLODING).sum())
    # "about half": the draw is fixed by search.seed; both groups must be well represented
    assert 3 <= n_bad <= SAMPLES - 3, sorted(lrs)
    assert f"{SAMPLES - n_bad} completed" in proc.stdout and f"{n_bad} diverged" in proc.stdout


@pytest.mark.timeout(900)
def test_every_trial_is_classified(storm):
    trials, _, _ = storm
    lrs = trials["optim.lr"].astype(float)
    expected = ["diverged" if lr in EXPLODING else "completed" for lr in lrs]
    assert trials["status"].tolist() == expected, trials[["optim.lr", "status"]]


@pytest.mark.timeout(900)
def test_exploding_trials_are_diverged(storm):
    trials, curves, _ = storm
    bad = trials[trials["optim.lr"].astype(float).isin(EXPLODING)]
    assert (bad["status"] == "diverged").all(), bad[["optim.lr", "status"]]
    allowed = {"nonfinite_loss", "nonfinite_grad", "nonfinite_param", "grad_explosion",
               "loss_vs_initial", "loss_vs_best"}
    assert bad["divergence_reason"].isin(allowed).all(), \
        bad[["optim.lr", "divergence_reason", "divergence_detail"]]
    steps = bad["divergence_step"].astype(int)
    assert ((steps >= 2) & (steps <= DIVERGED_BY)).all(), bad[["optim.lr", "divergence_step"]]
    nan = bad[bad["optim.lr"].astype(float) == CERTAIN_NAN]
    assert len(nan) >= 1, "the seeded draw includes the certain-NaN lr"
    assert nan["divergence_reason"].isin(["nonfinite_loss", "nonfinite_grad"]).all()
    assert (nan["divergence_step"].astype(int) == 2).all()
    assert steps.nunique() >= 2, "the trials should blow up at different steps"
    for _, t in bad.iterrows():
        c = curves[(curves["trial"] == t["trial"]) & (curves["split"] == "train")
                   & (curves["metric"] == "loss")]
        # the curve stops at the divergence step, each step once, and its last point is the
        # step that fired (non-finite loss, or a finite loss with a non-finite gradient)
        assert sorted(c["step"]) == list(range(1, int(t["divergence_step"]) + 1))
        assert all(math.isfinite(v) for v in c.sort_values("step")["value"].iloc[:-1]) or \
            t["divergence_reason"] == "nonfinite_loss"


@pytest.mark.timeout(900)
def test_healthy_trials_untouched(storm):
    trials, curves, _ = storm
    good = trials[trials["optim.lr"].astype(float).isin(HEALTHY)]
    assert (good["status"] == "completed").all(), good[["optim.lr", "status"]]
    assert good["divergence_reason"].isna().all()
    for _, t in good.iterrows():
        c = curves[curves["trial"] == t["trial"]]
        loss = c[(c["split"] == "train") & (c["metric"] == "loss")]
        assert sorted(loss["step"]) == list(range(1, STEPS + 1))
        assert all(math.isfinite(v) for v in loss["value"])
        val = c[(c["split"] == "val") & (c["metric"] == "loss")]
        assert sorted(val["step"]) == list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))
        assert float(val["value"].iloc[-1]) < float(loss.sort_values("step")["value"].iloc[0])

    # Independent reference: the same config trained alone, in this process, without Ray.
    import torch

    from orchestrator.spec.divergence_rules import DivergenceRules
    from orchestrator.spec.yaml_reader import spec_from_text
    from orchestrator.sweep.divergence import DivergenceMonitor
    from workloads.train import run

    torch.set_num_threads(1)
    spec = spec_from_text(SPEC)
    t = good.iloc[0]
    cfg = spec.trial_config({"optim.lr": float(t["optim.lr"]), "train.seed": 0})
    ref = run(cfg, monitor=DivergenceMonitor(DivergenceRules(**spec.divergence.model_dump())))
    assert ref.divergence is None
    assert math.isclose(float(t["final_val_loss"]), ref.final_val_loss, rel_tol=1e-4), \
        (float(t["final_val_loss"]), ref.final_val_loss)
