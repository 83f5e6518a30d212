"""The training loop: golden losses, bitwise determinism, checkpoint resume, reports, monitors."""

from __future__ import annotations

import math

import pytest

from workloads.config import apply_overrides, preset
from workloads.report import Divergence, StepInfo
from workloads.train import run

# Pinned on CPU (torch 2.13, 1 thread, metrics off): the first 10 training losses. A change
# here means the model, init, data order or optimizer changed: update only on purpose.
GOLDEN = {
    "gpt-debug": [4.434535, 4.353918, 4.245842, 4.099981, 3.947764, 3.827914, 3.697914, 3.65988,
                  3.711118, 3.545228],
    "mlp-debug": [2.256495, 2.22927, 2.01343, 2.003177, 1.848437, 1.784974, 1.709574, 1.551754,
                  1.416971, 1.410346],
    # the pre-depth-scaling init (model.init fan_in) still gives the losses pinned before it
    "mlp-debug fan_in": [2.291568, 2.286624, 1.959556, 1.940626, 1.782475, 1.704972, 1.679046,
                         1.507499, 1.281586, 1.292021],
}


def _cfg(name: str, **over):
    base = {"train.metrics_every": 0}
    base.update(over)
    return apply_overrides(preset(name), base)


@pytest.mark.parametrize("name", ["gpt-debug", "mlp-debug", "mlp-debug fan_in"])
def test_golden_losses(name):
    over = {"model.init": "fan_in"} if name.endswith("fan_in") else {}
    res = run(_cfg(name.split()[0], **{"train.steps": 10, "train.eval_every": 0}, **over))
    assert len(res.train_losses) == 10
    assert res.train_losses == pytest.approx(GOLDEN[name], rel=1e-4, abs=1e-5)


def test_initial_loss_near_log_vocab():
    res = run(_cfg("gpt-debug", **{"train.steps": 1}))
    # char-level Shakespeare: vocab = number of distinct characters
    from workloads.data import load_tokens

    vocab = load_tokens(preset("gpt-debug").data).vocab_size
    assert abs(res.initial_loss - math.log(vocab)) < 0.3


@pytest.mark.parametrize("name", ["gpt-debug", "mlp-debug"])
def test_same_seed_same_losses_bitwise(name):
    a = run(_cfg(name, **{"train.steps": 8, "train.eval_every": 4}))
    b = run(_cfg(name, **{"train.steps": 8, "train.eval_every": 4}))
    assert a.train_losses == b.train_losses
    c = run(_cfg(name, **{"train.steps": 8, "train.eval_every": 4, "train.seed": 1}))
    assert c.train_losses != a.train_losses


class _Killed(Exception):
    pass


@pytest.mark.parametrize("name", ["gpt-debug", "mlp-debug"])
def test_resume_matches_uninterrupted(tmp_path, name):
    over = {"train.steps": 12, "train.eval_every": 4, "train.checkpoint_every": 4,
            "train.metrics_every": 4}
    full = run(_cfg(name, **over))
    ck = str(tmp_path / "ck")

    def kill_after_8(rep):  # the process dies right after the step-8 checkpoint
        if rep.step == 8:
            raise _Killed

    with pytest.raises(_Killed):
        run(_cfg(name, **over), report=kill_after_8, checkpoint_dir=ck)
    resumed = run(_cfg(name, **over), checkpoint_dir=ck, resume=True)
    assert resumed.train_losses == pytest.approx(full.train_losses[8:], abs=1e-6)
    assert resumed.final_val_loss == pytest.approx(full.final_val_loss, abs=1e-6)


def test_reports_carry_every_step_once():
    reports = []
    run(_cfg("gpt-debug", **{"train.steps": 10, "train.eval_every": 4,
                             "train.metrics_every": 4}), report=reports.append)
    assert [r.step for r in reports] == [4, 8, 10]
    assert reports[-1].done and not reports[0].done
    steps = [p.step for r in reports for p in r.curve if p.split == "train" and p.metric == "loss"]
    assert steps == list(range(1, 11))
    vals = [p for r in reports for p in r.curve if p.split == "val"]
    assert {p.step for p in vals} == {4, 8, 10}
    assert reports[0].rows, "metric rows expected at the first report"
    assert {"step", "metric", "module", "layer", "next_layer", "value"} <= set(reports[0].rows[0])


@pytest.mark.parametrize("every, want", [(3, [3, 4, 6, 8, 9, 10]), (0, [4, 8, 10])])
def test_curve_every_samples_the_train_curve_and_keeps_every_report_step(every, want):
    """``train.curve_every`` k: the per-step train curve (loss, grad_norm, lr) at every k-th
    step and at each report (0: at reports only); the losses it keeps are the every-step run's
    and the run's own loss list (the divergence monitor's input) still has every step."""
    full, sampled = [], []
    base = {"train.steps": 10, "train.eval_every": 4}
    ref = run(_cfg("gpt-debug", **base), report=full.append)
    res = run(_cfg("gpt-debug", **base, **{"train.curve_every": every}), report=sampled.append)
    for metric in ("loss", "grad_norm", "lr"):
        got = {p.step: p.value for r in sampled for p in r.curve
               if p.split == "train" and p.metric == metric}
        assert sorted(got) == want
        every_step = {p.step: p.value for r in full for p in r.curve
                      if p.split == "train" and p.metric == metric}
        assert got == {s: every_step[s] for s in want}
    assert res.train_losses == ref.train_losses and len(res.train_losses) == 10


def test_curve_every_must_not_be_negative():
    from workloads.validate import ConfigError, validate

    with pytest.raises(ConfigError, match="train.curve_every"):
        validate(_cfg("gpt-debug", **{"train.curve_every": -1}))


def test_metrics_between_reports_arrive_with_the_next_report():
    """metrics_every 2 < eval_every 6: rows of steps 2, 4 ride with the step-6 report, and the
    loss trajectory is the one without metrics (collecting uses no global RNG)."""
    over = {"train.steps": 12, "train.eval_every": 6, "train.metrics_every": 2}
    reports = []
    res = run(_cfg("mlp-debug", **over), report=reports.append)
    steps = [sorted({r["step"] for r in rep.rows}) for rep in reports]
    assert steps == [[0, 2, 4, 6], [8, 10, 12]]  # step 0: the gradient coherence at init
    plain = run(_cfg("mlp-debug", **{**over, "train.metrics_every": 0}))
    assert res.train_losses == plain.train_losses


class _StopAt:
    """A monitor that declares divergence at a fixed step (the rules are tested elsewhere)."""

    def __init__(self, step):
        self.step, self.seen = step, []

    def check(self, info: StepInfo):
        self.seen.append(info.step)
        return Divergence("loss_vs_best", info.step) if info.step == self.step else None

    def state_dict(self):
        return {}

    def load_state_dict(self, s):
        pass


def test_monitor_asked_every_step_and_stops_at_once():
    mon = _StopAt(3)
    reports = []
    res = run(_cfg("gpt-debug", **{"train.steps": 20, "train.eval_every": 10}),
              report=reports.append, monitor=mon)
    assert mon.seen == [1, 2, 3]
    assert res.divergence is not None and res.divergence.step == 3
    assert len(reports) == 1 and reports[0].divergence.step == 3 and reports[0].done


def test_huge_lr_diverges_with_real_rules():
    from orchestrator.spec.divergence_rules import DivergenceRules
    from orchestrator.sweep.divergence import DivergenceMonitor

    mon = DivergenceMonitor(DivergenceRules(warmup_steps=2))
    res = run(_cfg("gpt-debug", **{"train.steps": 60, "train.eval_every": 60, "optim.lr": 50.0,
                                   "optim.warmup_steps": 0, "optim.grad_clip": 0.0}), monitor=mon)
    assert res.divergence is not None
    assert res.steps < 60
