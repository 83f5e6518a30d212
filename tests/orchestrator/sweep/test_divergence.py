"""Divergence rules: each rule fires at the expected step, and only then."""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError

from orchestrator.spec.divergence_rules import DivergenceRules
from orchestrator.sweep.divergence import DivergenceMonitor, penalty_value
from workloads.report import StepInfo


def _run(rules: DivergenceRules, losses, grads=None, logits=None, extras=None, params=None):
    """Feed steps 1..n; return (reason, step) of the first divergence, or None."""
    mon = DivergenceMonitor(rules)
    for i, loss in enumerate(losses):
        ex = dict(extras[i]) if extras is not None else {}
        if logits is not None:
            ex["max_logit"] = logits[i]
        gn = 1.0 if grads is None else grads[i]
        pm = None if params is None else params[i]
        d = mon.check(StepInfo(step=i + 1, loss=loss, grad_norm=gn, lr=1e-3, extras=ex,
                               param_max=pm))
        if d is not None:
            return d.reason, d.step
    return None


def _decreasing(n: int, start=10.8, end=2.0, tau=10.0, noise=0.05, seed=0) -> list[float]:
    rng = random.Random(seed)
    return [end + (start - end) * math.exp(-i / tau) + rng.gauss(0, noise) for i in range(n)]


# initial exactly 10.8; best EMA ~2.0 by step 60. The start reference is min(10.8, lower median
# of the first 5 losses = 9.17) = 9.17, so the loss_vs_initial bound is max(9.17 + 2,
# 1.5 x 9.17) = 13.76.
BASE = [10.8] + _decreasing(60)[1:]
REF = sorted(BASE[:5])[2]
BOUND = max(REF + 2.0, 1.5 * REF)
_OFF = {"loss_factor_vs_best": None, "loss_margin_vs_initial": None}


def _flat(n, lo=3.0, hi=3.1):  # alternating batch noise: median 3.0, MAD 0.05
    return [lo if i % 2 == 0 else hi for i in range(n)]


CASES = [
    # name, rules, losses, grads, logits, expected (reason, step) or None
    ("clean", DivergenceRules(), BASE, None, None, None),
    ("nan_loss", DivergenceRules(), BASE[:9] + [math.nan], None, None, ("nonfinite_loss", 10)),
    ("inf_loss_at_step_2", DivergenceRules(warmup_steps=20), [5.0, math.inf], None, None,
     ("nonfinite_loss", 2)),
    ("nan_grad", DivergenceRules(), BASE[:5], [1.0] * 4 + [math.nan], None, ("nonfinite_grad", 5)),
    ("nonfinite_off", DivergenceRules(nonfinite=False), [5.0, math.nan, 5.0], None, None, None),
    # above BOUND for three consecutive steps -> fires on the third (15 is also > 4 x best;
    # loss_vs_initial takes precedence)
    ("vs_initial", DivergenceRules(loss_factor_vs_best=None), BASE + [15.0] * 5, None, None,
     ("loss_vs_initial", 63)),
    ("vs_initial_below_bound", DivergenceRules(loss_factor_vs_best=None), BASE + [13.5] * 5,
     None, None, None),
    # no warm-up by default: ref = min(10, median(10, 20, 20, 20) = 20) = 10, bound 15
    ("vs_initial_from_step_1", DivergenceRules(), [10.0, 20.0, 20.0, 20.0], None, None,
     ("loss_vs_initial", 4)),
    ("vs_initial_not_in_warmup", DivergenceRules(warmup_steps=5, loss_factor_vs_best=None),
     [10.0, 20.0, 20.0, 20.0, 9.0], None, None, None),
    # a large start: +2 nats would be noise, the 1.5 x factor is not
    ("huge_start_noise", DivergenceRules(loss_factor_vs_best=None),
     [1000.0 + 40.0 * (-1) ** i for i in range(40)], None, None, None),
    ("huge_start_blowup", DivergenceRules(loss_factor_vs_best=None),
     [1000.0 + 40.0 * (-1) ** i for i in range(40)] + [1600.0] * 3, None, None,
     ("loss_vs_initial", 43)),
    # best ~2.0 -> factor 4 bound ~8.1 < 9 < BOUND
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
    # spike bound: median 3.05 + max(6 x 1.4826 x 0.05, 0.1) = 3.495; three steps above fire
    ("spike", DivergenceRules(spike_z=6.0, **_OFF), _flat(20) + [3.6] * 3, None, None,
     ("loss_spike", 23)),
    ("spike_single", DivergenceRules(spike_z=6.0, **_OFF), _flat(20) + [3.6, 3.0] * 3, None,
     None, None),
    ("spike_below_bound", DivergenceRules(spike_z=6.0, **_OFF), _flat(20) + [3.4] * 5, None,
     None, None),
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
        # worst: clamped to [lo, 10 lo], lo = max(10.8 + 2, 1.5 x 10.8) = 16.2
        ("worst", 10.8, 3.0, 50.0, 50.0),
        ("worst", 10.8, 3.0, None, 16.2),
        ("worst", 10.8, 3.0, 5.0, 16.2),
        ("worst", 10.8, 3.0, 1e30, 162.0),
        ("worst", None, None, None, 1e6),
        (7.5, 10.8, 3.0, 50.0, 7.5),
        ("initial_loss", None, None, None, 1e6),
        ("initial_loss", math.nan, 3.0, None, 3.0),
    ],
)
def test_penalty_value(penalty, initial, best, worst, expected):
    got = penalty_value(DivergenceRules(penalty=penalty), initial, best, worst)
    assert got == pytest.approx(expected, rel=1e-12)


def test_monitor_penalty_is_initial_loss_scale():
    mon = DivergenceMonitor()
    for i, loss in enumerate(BASE[:30] + [math.nan]):
        d = mon.check(StepInfo(i + 1, loss, 1.0, 1e-3))
    assert d.reason == "nonfinite_loss"
    assert mon.penalty() == BASE[0]


def test_worst_penalty_differs_from_initial_and_ranks_blowups():
    def penalty(losses, kind):
        mon = DivergenceMonitor(DivergenceRules(penalty=kind))
        for i, loss in enumerate(losses):
            mon.check(StepInfo(i + 1, loss, 1.0, 1e-3))
        return mon.penalty()

    mild, wild = [4.4, 4.3, 7.0, 7.0, 7.0], [4.4, 618.0, 1439.0, 1514.0]
    assert penalty(mild, "initial_loss") == penalty(wild, "initial_loss") == 4.4
    # lo = max(4.4 + 2, 6.6) = 6.6; mild saw 7.0, wild saw 1514 -> capped at 66
    assert penalty(mild, "worst") == pytest.approx(7.0)
    assert penalty(wild, "worst") == pytest.approx(66.0)


def _feed(mon, losses, chance=None):
    for i, loss in enumerate(losses):
        d = mon.check(StepInfo(i + 1, loss, 1.0, 1e-3, chance_loss=chance))
        assert d is None
    return mon


@pytest.mark.parametrize(
    "chance,val,final,expected",
    [
        (None, 13.5, True, None),  # BOUND = 13.76
        (None, 14.0, True, "final_loss"),
        (None, 1e5, False, None),  # only the last eval is held to the bound
        (None, math.nan, False, "nonfinite_loss"),
        (None, math.inf, True, "nonfinite_loss"),
        # ln(65) = 4.17 caps the reference: bound max(6.17, 1.5 x 4.17 = 6.26)
        (math.log(65), 6.2, True, None),
        (math.log(65), 6.3, True, "final_loss"),
    ],
)
def test_check_eval(chance, val, final, expected):
    mon = _feed(DivergenceMonitor(), BASE, chance)
    d = mon.check_eval(60, val, final)
    assert (d.reason if d else None) == expected
    if d is not None:
        assert d.step == 60 and (d.value == val or math.isnan(val))


def test_issue17_completed_with_huge_val_loss_is_diverged():
    # every per-step rule off, as the old NaN-storm test had it: the final check still fires
    rules = DivergenceRules(grad_norm_max=None, loss_margin_vs_initial=None,
                            loss_factor_vs_best=None)
    mon = _feed(DivergenceMonitor(rules), [4.43, 618.0, 1439.0] + [7000.0] * 27, math.log(65))
    d = mon.check_eval(30, 104_296.0, final=True)
    assert d.reason == "final_loss" and d.step == 30 and d.value == 104_296.0
    assert mon.final_reference == pytest.approx(math.log(65))


def test_nonfinite_param_fires_at_step_1():
    assert _run(DivergenceRules(warmup_steps=50), [4.0, 4.0], params=[1.0, math.inf]) == \
        ("nonfinite_param", 2)
    assert _run(DivergenceRules(), [4.0], params=[math.nan]) == ("nonfinite_param", 1)
    assert _run(DivergenceRules(), [4.0, 4.0], params=[1e30, 3e38]) is None  # huge, finite


def test_verdict_records_rule_step_value():
    mon = DivergenceMonitor()
    for i, loss in enumerate([10.0, 20.0, 20.0, 21.0]):
        d = mon.check(StepInfo(i + 1, loss, 1.0, 1e-3))
    assert (d.reason, d.step, d.value) == ("loss_vs_initial", 4, 21.0)
    assert d.detail == "loss=21 > 15"


@pytest.mark.parametrize(
    "rules,extras,expected",
    [
        # sigma_max(W_Q) measured at step 1 (1.5), then grows
        (DivergenceRules(sigma_q_growth=3.0), [{"sigma_max_q": 1.5}, {}, {"sigma_max_q": 4.4},
                                               {"sigma_max_q": 4.6}], ("sigma_growth", 4)),
        (DivergenceRules(), [{"sigma_max_q": 1.5}, {"sigma_max_q": 100.0}], None),
        (DivergenceRules(update_ratio_max=0.5), [{"update_ratio": 1e-3}, {"update_ratio": 0.6}],
         ("update_ratio", 2)),
        (DivergenceRules(update_ratio_max=0.5), [{"update_ratio": 0.4}] * 3, None),
    ],
)
def test_signal_rules(rules, extras, expected):
    assert _run(rules, [4.0] * len(extras), extras=extras) == expected


def test_signals_are_asked_for_only_when_a_rule_needs_them():
    assert all(not DivergenceMonitor().signals(s) for s in range(1, 50))
    mon = DivergenceMonitor(DivergenceRules(max_logit=50.0, update_ratio_max=1.0,
                                            signal_every=10))
    asked = {s: mon.signals(s) for s in range(1, 31)}
    assert [s for s, w in asked.items() if w] == [1, 10, 20, 30]
    assert asked[10] == {"max_logit", "update_ratio"}


def test_legacy_checkpoint_state_loads():
    rules = DivergenceRules()
    full = _feed(DivergenceMonitor(rules), BASE[:20])
    legacy = {k: v for k, v in full.state_dict().items()
              if k not in ("early", "losses", "chance_loss", "sigma_q0")}
    mon = DivergenceMonitor(rules)
    mon.load_state_dict(legacy)
    assert mon.reference == BASE[0] and mon.best_loss == full.best_loss


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"loss_factor_vs_best": 0.5}, "loss_factor_vs_best"),
        ({"patience": 0}, "patience"),
        ({"ema_beta": 1.0}, "ema_beta"),
        ({"penalty": "median"}, "penalty"),
        ({"sigma_q_growth": 1.0}, "sigma_q_growth"),
        ({"signal_every": 0}, "signal_every"),
        ({"final_margin": -1.0}, "final_margin"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_invalid_rules_name_the_field(kwargs, field):
    with pytest.raises(ValidationError) as e:
        DivergenceRules(**kwargs)
    assert field in str(e.value)
