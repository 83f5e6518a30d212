"""The verdict rule on constructed sweeps: each reason fires alone; agrees / disagrees only
when everything passes; the MDE against scipy's power solver and a hand computation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from orchestrator.analysis.verdicts import (
    AGREES,
    DISAGREES,
    UNTESTABLE,
    _mde_pooled,
    claim_verdict,
    load_claims,
)
from orchestrator.spec.claims import Claim

LN10 = math.log(10)


def _claim(**kw) -> Claim:
    base = dict(id="c1", paper="Paper X (0000.00000)", text="arm a is lower", metric="loss",
                arm={"opt": "a"}, baseline={"opt": "b"}, direction="lower", effect=0.5,
                min_steps=100, controls=["first_loss", "ones", "small_gap"], n_classes=10)
    base.update(kw)
    return Claim(**base)


def _trials(a, b, *, steps=200, first=LN10, ones=0.05, status_a=None) -> pd.DataFrame:
    rows = []
    for arm, vals in (("a", a), ("b", b)):
        for seed, v in enumerate(vals):
            st_ = (status_a or {}).get(seed, "completed") if arm == "a" else "completed"
            rows.append({"trial": f"{arm}{seed}", "arm": f"opt={arm}", "opt": arm, "seed": seed,
                         "status": st_, "loss": v, "last_step": steps,
                         "cont0/probe_loss": first, "cont/ones_v_mean": ones,
                         "cont/grad_ones_u_mean": ones / 2})
    return pd.DataFrame(rows)


def _gap_rows(trials: pd.DataFrame, s1s2: float) -> pd.DataFrame:
    return pd.DataFrame([{"step": 200, "metric": "w.s1_s2", "module": "hidden", "layer": i,
                          "next_layer": -1, "value": s1s2, "trial": t}
                         for t in trials["trial"] for i in range(4)])


A = [1.00, 1.02, 0.98, 1.01]
B = [2.00, 2.03, 1.97, 2.01]  # a is lower by ~1.0, spread ~0.02: MDE << 0.5


def test_mde_matches_hand_and_scipy_power():
    sa, sb, n = 0.3, 0.5, 5
    mde, sp, df = _mde_pooled(sa, n, sb, n)
    hand_sp = math.sqrt((sa**2 + sb**2) / 2)
    hand = (st.t.ppf(0.975, 8) + st.t.ppf(0.8, 8)) * hand_sp * math.sqrt(2 / n)
    assert df == 8 and sp == pytest.approx(hand_sp) and mde == pytest.approx(hand)
    # t_{0.975,8} = 2.3060, t_{0.8,8} = 0.8889 (tables)
    assert mde == pytest.approx(3.1949 * hand_sp * math.sqrt(2 / n), rel=1e-3)
    # the approximation vs the exact noncentral-t power at that effect: within a few percent
    d = mde / sp
    nc = d * math.sqrt(n / 2)
    crit = st.t.ppf(0.975, df)
    power = 1 - st.nct.cdf(crit, df, nc) + st.nct.cdf(-crit, df, nc)
    assert 0.78 < power < 0.83
    assert math.isnan(_mde_pooled(0.1, 1, 0.1, 3)[0])


def test_agrees_only_when_everything_passes():
    t = _trials(A, B)
    r = claim_verdict(_claim(), t, _gap_rows(t, 2.0))
    assert r["verdict"] == AGREES, r["reasons"]
    assert r["diff"] == pytest.approx(np.mean(A) - np.mean(B))
    sp = math.sqrt((np.var(A, ddof=1) + np.var(B, ddof=1)) / 2)
    assert r["mde"] == pytest.approx((st.t.ppf(0.975, 6) + st.t.ppf(0.8, 6)) * sp
                                     * math.sqrt(2 / 4))
    assert r["p_value"] == pytest.approx(st.ttest_ind(A, B).pvalue)


def test_disagrees_when_effect_ruled_out_or_opposite():
    t = _trials(A, A[::-1])  # same means: the interval excludes 0.5
    r = claim_verdict(_claim(), t, _gap_rows(t, 2.0))
    assert r["verdict"] == DISAGREES and abs(r["diff"]) < 1e-12
    t = _trials(B, A)  # significantly the other way
    assert claim_verdict(_claim(), t, _gap_rows(t, 2.0))["verdict"] == DISAGREES


@pytest.mark.parametrize("case, needle", [
    ("mde", "MDE"), ("first", "first loss 150 far from ln(10)"), ("ones", "all-ones control high"),
    ("gap", "top-1 degenerate"), ("steps", "too few steps: ran 50, claim needs 100"),
    ("seeds", "too few completed seeds"), ("arm", "arm selector matches 0 arms"),
    ("metric", "metric nope not recorded"),
])
def test_each_reason_fires_alone(case, needle):
    t, gap, claim = _trials(A, B), 2.0, _claim()
    if case == "mde":
        t = _trials([0.0, 1.0, 2.0, 0.5], [1.0, 2.5, 0.2, 1.8])
    elif case == "first":
        t = _trials(A, B, first=150.0)
    elif case == "ones":
        t = _trials(A, B, ones=0.6)
    elif case == "gap":
        gap = 1.01
    elif case == "steps":
        t = _trials(A, B, steps=50)
    elif case == "seeds":
        t = _trials(A, B, status_a={0: "diverged", 1: "diverged", 2: "diverged"})
    elif case == "arm":
        claim = _claim(arm={"opt": "c"})
    elif case == "metric":
        claim = _claim(metric="nope")
    r = claim_verdict(claim, t, _gap_rows(t, gap))
    assert r["verdict"] == UNTESTABLE
    assert needle in r["reasons"]
    assert r["reasons"].count(";") == 0, r["reasons"]  # that reason alone


def test_missing_controls_are_reasons_and_unrequested_are_ignored():
    t = _trials(A, B).drop(columns=["cont0/probe_loss", "cont/ones_v_mean",
                                    "cont/grad_ones_u_mean"])
    r = claim_verdict(_claim(), t, None)
    assert r["verdict"] == UNTESTABLE
    for s in ("first loss not recorded", "all-ones control not recorded", "s1/s2 not recorded"):
        assert s in r["reasons"]
    assert claim_verdict(_claim(controls=[]), t, None)["verdict"] == AGREES
    # the train first loss stands in for the probe loss
    t["train/initial_loss"] = 200.0
    assert "far from ln(10)" in claim_verdict(_claim(controls=["first_loss"]), t)["reasons"]


def test_inconclusive_interval_is_not_testable():
    # MDE just under the effect but the observed diff sits between 0 and the effect
    # s = 0.1234 per arm, n = 5: half-width 0.18, MDE 0.249 < 0.3; diff -0.15
    a = [1.0 + 0.1234 * z for z in (-1.2649, -0.6325, 0.0, 0.6325, 1.2649)]
    b = [v + 0.15 for v in a]
    r = claim_verdict(_claim(effect=0.3, controls=[]), _trials(a, b))
    assert r["mde"] < 0.3
    assert r["verdict"] == UNTESTABLE and r["reasons"].startswith("inconclusive")


def test_claim_validation_and_spec_round_trip(tmp_path):
    with pytest.raises(ValueError, match="n_classes"):
        _claim(n_classes=None)
    with pytest.raises(ValueError, match="same arm"):
        _claim(baseline={"opt": "a"})
    (tmp_path / "spec.yaml").write_text(
        "name: x\nclaims:\n- {id: c1, paper: P, text: t, metric: loss, arm: {opt: a},\n"
        "   baseline: {opt: b}, direction: lower, effect: 0.5}\n")
    (c,) = load_claims(tmp_path)
    assert c.effect == 0.5 and c.controls == [] and c.min_steps == 1
    assert load_claims(tmp_path / "nothing") == []


def test_direction_higher_mirrors_lower():
    t = _trials(B, A)  # arm a is higher by ~1.0
    r = claim_verdict(_claim(direction="higher"), t, _gap_rows(t, 2.0))
    assert r["verdict"] == AGREES and r["diff"] == pytest.approx(np.mean(B) - np.mean(A))
    assert claim_verdict(_claim(direction="lower"), t, _gap_rows(t, 2.0))["verdict"] == DISAGREES


def test_ones_control_matches_the_metric_time_and_vectors():
    """A step-0 gradient claim is judged by the step-0 gradient all-ones control, an
    end-of-training weight claim by the end weight control: a high control elsewhere does not
    withhold the verdict, a high one of its own does (and the reason names the column)."""
    from orchestrator.analysis.verdicts import _ones_columns

    cols = ["cont0/grad_ones_v_mean", "cont0/ones_u_mean", "cont/grad_ones_u_mean",
            "cont/ones_v_mean", "cont/ones_u_mean", "loss"]
    assert _ones_columns("cont0/grad_resid_top1_mean", cols) == ["cont0/grad_ones_v_mean"]
    assert _ones_columns("cont/resid_top1_mean", cols) == ["cont/ones_v_mean", "cont/ones_u_mean"]
    assert _ones_columns("final_val_loss", cols) == ["cont/grad_ones_u_mean", "cont/ones_v_mean",
                                                     "cont/ones_u_mean"]
    A, B = [0.90, 0.92, 0.91], [0.20, 0.21, 0.19]
    t = _trials(A, B, ones=0.05)
    t["cont0/grad_res"] = t["loss"]
    t["cont0/grad_ones_v_mean"] = 0.05
    t["cont/ones_u_mean"] = 0.95  # the end weights lean to all-ones: not this claim's control
    c = _claim(metric="cont0/grad_res", direction="higher", effect=0.1, min_steps=1,
               controls=["ones"])
    row = claim_verdict(c, t)
    assert row["verdict"] == "agrees", row["reasons"]
    t.loc[t["arm"] == "opt=b", "cont0/grad_ones_v_mean"] = 0.6
    row = claim_verdict(c, t)
    assert row["verdict"] == "not testable here"
    assert "cont0/grad_ones_v_mean in opt=b" in row["reasons"]


def test_gap_control_reads_the_claims_own_matrices_and_time():
    """The top-1-degenerate control reads the s1/s2 of the matrices the metric was computed
    on (weights, probe gradients, centred or not) at the metric's time (step 0 for cont0/)."""
    from orchestrator.analysis.tables import gap_source

    assert gap_source("cont/resid_top1_mean") == ("w.s1_s2", "last")
    assert gap_source("cont/resid_ctop1_mean") == ("wc.s1_s2", "last")
    assert gap_source("cont0/grad_resid_ctop1_mean") == ("gpc.s1_s2", "first")
    assert gap_source("cont0/grad_resid_top1_mean") == ("gp.s1_s2", "first")
    t = _trials(B, A, ones=0.05)
    t["cont0/grad_resid_ctop1_mean"] = t["loss"]
    c = _claim(metric="cont0/grad_resid_ctop1_mean", direction="higher", effect=0.5,
               min_steps=1, controls=["small_gap"])

    def rows(metric, step, value):
        return pd.DataFrame([{"step": step, "metric": metric, "module": "hidden", "layer": i,
                              "next_layer": -1, "value": value, "trial": tr}
                             for tr in t["trial"] for i in range(4)])

    # degenerate at the end and in the uncentred weights, well separated at step 0: passes
    ok = pd.concat([rows("gpc.s1_s2", 0, 2.0), rows("gpc.s1_s2", 200, 1.0),
                    rows("w.s1_s2", 0, 1.0)])
    assert claim_verdict(c, t, ok)["verdict"] == AGREES
    bad = pd.concat([rows("gpc.s1_s2", 0, 1.01), rows("gpc.s1_s2", 200, 3.0)])
    r = claim_verdict(c, t, bad)
    assert r["verdict"] == UNTESTABLE and "top-1 degenerate" in r["reasons"]
    assert claim_verdict(c, t, rows("w.s1_s2", 0, 2.0))["reasons"] == "s1/s2 not recorded"
