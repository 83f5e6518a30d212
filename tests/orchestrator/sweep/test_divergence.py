"""Divergence rules: each rule fires at the expected step, and only then."""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError

from orchestrator.sweep.divergence import DivergenceMonitor, DivergenceRules, penalty_value
from workloads.report import StepInfo


def _run(rules: DivergenceRules, losses, grads=None, logits=None):
    """Feed steps 1..n; return (reason, step) of the first divergence, or None."""
    mon = DivergenceMonitor(rules)
    for i, loss in enumerate(losses):
        extras = {} if logits is None else {"max_logit": logits[i]}
        gn = 1.0 if grads is None else grads[i]
        d = mon.check(StepInfo(step=i + 1, loss=loss, grad_norm=gn, lr=1e-3, extras=extras))
        if d is not None:
            return d.reason, d.step
    return None


def _decreasing(n: int, start=10.8, end=2.0, tau=10.0, noise=0.05, seed=0) -> list[float]:
    rng = random.Random(seed)
    return [end + (start - end) * math.exp(-i / tau) + rng.gauss(0, noise) for i in range(n)]


BASE = [10.8] + _decreasing(60)[1:]  # initial exactly 10.8; best EMA ~2.0 by step 60

CASES = [
    # name, rules, losses, grads, logits, expected (reason, step) or None
    ("clean", DivergenceRules(), BASE, None, None, None),
    ("nan_loss", DivergenceRules(), BASE[:9] + [math.nan], None, None, ("nonfinite_loss", 10)),
    ("inf_loss_in_warmup", DivergenceRules(), [5.0, math.inf], None, None, ("nonfinite_loss", 2)),
    ("nan_grad", DivergenceRules(), BASE[:5], [1.0] * 4 + [math.nan], None, ("nonfinite_grad", 5)),
    ("nonfinite_off", DivergenceRules(nonfinite=False), [5.0, math.nan, 5.0], None, None, None),
    # initial 10.8 + margin 2 = 12.8: three consecutive steps above -> fires on the third
    # (13 is also > 4 x best; the initial-loss rule is checked first)
    ("vs_initial", DivergenceRules(loss_factor_vs_best=None), BASE + [13.0] * 5, None, None,
     ("loss_vs_initial", 63)),
    ("vs_initial_not_in_warmup", DivergenceRules(loss_factor_vs_best=None),
     [10.0, 20.0, 20.0, 20.0, 9.0], None, None, None),
    # best ~2.0 -> factor 4 bound ~8.1 < 9 < initial + margin
    ("vs_best", DivergenceRules(), BASE + [9.0] * 5, None, None, ("loss_vs_best", 63)),
    ("vs_best_single_spike", DivergenceRules(), BASE + [9.0, 2.0, 9.0, 2.0, 9.0], None,
     None, None),
    ("vs_best_patience_1", DivergenceRules(patience=1), BASE + [9.0], None, None,
     ("loss_vs_best", 61)),
    # tiny best: 4x best is noise, min_delta keeps it quiet
    ("tiny_best_min_delta", DivergenceRules(), [0.02] * 40 + [0.09] * 5, None, None, None),
    ("grad_abs", DivergenceRules(), BASE[:30], [1.0] * 29 + [2e4], None, ("grad_explosion", 30)),
    ("grad_median", DivergenceRules(grad_norm_max=None, grad_norm_factor_vs_median=10.0),
     BASE[:40], [1.0 + 0.1 * (i % 3) for i in range(35)] + [50.0] * 5, None,
     ("grad_explosion", 38)),
    ("logit_bound", DivergenceRules(max_logit=100.0), BASE[:10], None,
     [10.0] * 9 + [150.0], ("logit_bound", 10)),
    ("logit_off", DivergenceRules(), BASE[:10], None, [1e9] * 10, None),
]


@pytest.mark.parametrize(
    "name,rules,losses,grads,logits,expected", CASES, ids=[c[0] for c in CASES]
)
def test_rules(name, rules, losses, grads, logits, expected):
    assert _run(rules, losses, grads, logits) == expected


@pytest.mark.parametrize("seed", range(5))
def test_no_false_positive_on_noisy_decreasing_curve(seed):
    # LM-like: 10.8 -> 3.0 with heavy per-batch noise and grad norms varying 10x
    rng = random.Random(100 + seed)
    losses = _decreasing(2000, noise=0.4, seed=seed)
    grads = [rng.uniform(0.3, 3.0) for _ in losses]
    rules = DivergenceRules(grad_norm_factor_vs_median=20.0)
    assert _run(rules, losses, grads) is None


def test_best_uses_ema_not_a_lucky_batch():
    mon = DivergenceMonitor(DivergenceRules(ema_beta=0.9))
    for i, loss in enumerate([4.0] * 30 + [0.5] + [4.0] * 5):
        mon.check(StepInfo(step=i + 1, loss=loss, grad_norm=1.0, lr=0.1))
    # bias-corrected EMA after 30 x 4.0 then 0.5: 4 - 0.1 * 3.5 / (1 - 0.9^31)
    assert mon.best_loss == pytest.approx(4.0 - 0.35 / (1 - 0.9**31), abs=1e-9)
    assert mon.initial_loss == 4.0 and mon.worst_loss == 4.0


def test_state_dict_round_trip_continues_identically():
    rules = DivergenceRules(grad_norm_factor_vs_median=10.0)
    losses = BASE + [9.0] * 5
    grads = [1.0] * len(losses)
    full = DivergenceMonitor(rules)
    out_full = [full.check(StepInfo(i + 1, x, g, 1e-3)) for i, (x, g) in
                enumerate(zip(losses, grads))]
    first = DivergenceMonitor(rules)
    for i in range(61):  # stop after one strike of the blow-up
        first.check(StepInfo(i + 1, losses[i], grads[i], 1e-3))
    resumed = DivergenceMonitor(rules)
    resumed.load_state_dict(first.state_dict())
    out_resumed = [resumed.check(StepInfo(i + 1, losses[i], grads[i], 1e-3))
                   for i in range(61, len(losses))]
    assert out_resumed == out_full[61:]
    assert out_resumed[1].reason == "loss_vs_best" and out_resumed[1].step == 63
    assert resumed.state_dict() == full.state_dict()


@pytest.mark.parametrize(
    "penalty,initial,best,worst,expected",
    [
        ("initial_loss", 10.8, 3.0, 50.0, 10.8),
        ("worst", 10.8, 3.0, 50.0, 50.0),
        ("worst", 10.8, 3.0, None, 10.8),
        (7.5, 10.8, 3.0, 50.0, 7.5),
        ("initial_loss", None, None, None, 1e6),
        ("initial_loss", math.nan, 3.0, None, 3.0),
    ],
)
def test_penalty_value(penalty, initial, best, worst, expected):
    assert penalty_value(DivergenceRules(penalty=penalty), initial, best, worst) == expected


def test_monitor_penalty_is_initial_loss_scale():
    mon = DivergenceMonitor()
    for i, loss in enumerate(BASE[:30] + [math.nan]):
        d = mon.check(StepInfo(i + 1, loss, 1.0, 1e-3))
    assert d.reason == "nonfinite_loss"
    assert mon.penalty() == BASE[0]


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"loss_factor_vs_best": 0.5}, "loss_factor_vs_best"),
        ({"patience": 0}, "patience"),
        ({"ema_beta": 1.0}, "ema_beta"),
        ({"penalty": "median"}, "penalty"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_invalid_rules_name_the_field(kwargs, field):
    with pytest.raises(ValidationError) as e:
        DivergenceRules(**kwargs)
    assert field in str(e.value)
