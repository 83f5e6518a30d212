"""The report's paths for big searches (benchmarks/report_scale.py): spikes computed once and
independent of row order, importance of a big search, val-vs-p levels per family past 12 arms,
stage timings."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from orchestrator.analysis import timing
from orchestrator.analysis.figures import _figure
from orchestrator.analysis.importance import (
    FANOVA_MAX_TRIALS,
    MAX_LEVELS,
    _levels,
    param_importance,
)
from orchestrator.analysis.load import ReportConfig, SweepData, sorted_order, trial_spikes
from orchestrator.analysis.stats import spike_count
from orchestrator.analysis.val_vs_p import MAX_LEVELS as MAX_REF_LEVELS
from orchestrator.analysis.val_vs_p import reference_levels


def _curves() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for t in range(6):
        v = 2.0 + rng.normal(0, 0.02, 300)
        v[100 + 20 * t: 105 + 20 * t] = 9.0  # a spike episode per trial
        if t == 3:
            v[250:] = 12.0
        rows.append(pd.DataFrame({"step": np.arange(1, 301), "split": "train",
                                  "metric": "loss", "value": v, "trial": f"t{t}"}))
    rows.append(rows[0].assign(split="val"))  # not counted
    return pd.concat(rows, ignore_index=True)


def _data(curves: pd.DataFrame) -> SweepData:
    trials = pd.DataFrame({"trial": [f"t{t}" for t in range(6)]})
    return SweepData("s", None, "", {}, trials, curves, pd.DataFrame())


def test_sorted_order():
    assert sorted_order(np.array([0, 0, 1, 1]), np.array([1, 2, 1, 5])) is None
    assert sorted_order(np.array([0]), np.array([3])) is None
    order = sorted_order(np.array([0, 1, 0]), np.array([2, 1, 1]))
    assert order.tolist() == [2, 0, 1]


def test_trial_spikes_match_spike_count_in_any_row_order_and_are_cached():
    cfg = ReportConfig()
    c = _curves()
    want = {f"t{t}": spike_count(c.loc[(c["trial"] == f"t{t}") & (c["split"] == "train"),
                                       "value"].tolist(), cfg.spike_factor,
                                 cfg.spike_min_delta) for t in range(6)}
    assert all(v >= 1 for v in want.values())
    data = _data(c)
    got = trial_spikes(data, cfg)
    assert got.to_dict() == want
    assert trial_spikes(data, cfg) is got  # shared by the arm and trials tables
    shuffled = c.sample(frac=1.0, random_state=3)
    assert trial_spikes(_data(shuffled), cfg).to_dict() == want
    cat = c.assign(trial=c["trial"].astype("category"))
    assert trial_spikes(_data(cat), cfg).to_dict() == want


def test_levels_bin_a_many_valued_numeric_param_keeping_inf_and_absent():
    vals = [None, math.inf] + [float(2 ** (i / 10)) for i in range(100)]
    col = pd.Series(vals, dtype=object)
    lv = _levels(col, pd.to_numeric(col, errors="coerce"))
    assert lv[0] == "absent" and lv[1] == "inf"
    assert len(set(lv)) <= MAX_LEVELS
    bins = lv[2:]
    assert bins[0].startswith("[1, ") and bins[-1].endswith(f"{2 ** 9.9:.3g}]")
    assert bins == sorted(bins, key=lambda b: float(b[1:].split(",")[0]))  # ordered bins
    few = pd.Series([None, math.inf, 1.0, 2.0], dtype=object)
    assert _levels(few, pd.to_numeric(few, errors="coerce")) == ["absent", "inf", "1.0", "2.0"]


def test_importance_of_a_big_search_uses_ped_anova():
    n = FANOVA_MAX_TRIALS + 30
    rng = np.random.default_rng(0)
    lr = 10 ** rng.uniform(-4, -2, n)
    t = pd.DataFrame({"trial": [f"t{i:04d}" for i in range(n)], "status": "completed",
                      "seed": 0, "objective": 1.0 + (np.log10(lr) + 3) ** 2,
                      "final_val_loss": 1.0, "optim.lr": lr,
                      "model.residual.family": ["a", "b"] * (n // 2)})
    imps, note = param_importance(t)
    assert note.startswith("PED-ANOVA") and f"over {n} completed trials" in note
    assert list(imps)[0] == "optim.lr"  # only lr matters


def test_reference_levels_per_arm_then_per_family():
    def arms_of(k: int, fam: str) -> list[str]:
        return [f"model.residual.family={fam},optim.lr={i}" for i in range(k)]

    for k, lines in ((3, 3), (MAX_REF_LEVELS + 1, 1)):
        ref = arms_of(k, "pre_ln")
        t = pd.DataFrame({"arm": ref * 2, "status": "completed",
                          "final_val_loss": np.arange(2 * k, dtype=float)})
        ax = _figure(4, 3).subplots()
        reference_levels(ax, t, ref, ref, {a: "k" for a in ref}, 0.95)
        assert len(ax.lines) == lines
    assert ax.lines[0].get_label() == "pre_ln"
    assert ax.lines[0].get_ydata()[0] == t["final_val_loss"].mean()


def test_timing_records_only_when_started():
    timing._active = None
    with timing.stage("a"):
        pass
    assert timing.recorded() == {}
    timing.start()
    for _ in range(2):
        with timing.stage("a"):
            sum(range(1000))
    with timing.stage("b"):
        pass
    got = timing.recorded()
    assert list(got) == ["a", "b"] and set(got["a"]) == {"wall_s", "cpu_s"}
    timing._active = None


def test_stored_spike_counts_are_used_and_only_the_rest_is_read(tmp_path, monkeypatch):
    """Trials whose record holds a count under the report's rule are not read; a running
    trial (no count) and one counted under another rule are read and counted, and only they."""
    from orchestrator.analysis import load as L
    from orchestrator.analysis.fast_spikes import recorded_spikes
    from orchestrator.analysis.spike_rule import spike_rule
    from orchestrator.store.parquet import ParquetSink

    sink = ParquetSink(str(tmp_path), "s")
    curves = {"a": [1.0] * 30 + [5.0] + [1.0] * 20, "b": [1.0] * 30 + [9.0] * 2 + [1.0] * 20,
              "c": [1.0] * 30 + [3.0] + [1.0] * 5 + [4.0] + [1.0] * 9}
    for tid, v in curves.items():
        sink.write_curve(tid, [{"step": i + 1, "split": "train", "metric": "loss", "value": x,
                                "wall_time": 0.0} for i, x in enumerate(v)])
    count_a, rule = recorded_spikes(sink.train_losses("a"))
    sink.write_trial({"trial": "a", "arm": "x", "status": "completed", "spikes": 7,
                      "spikes_rule": rule})  # 7, not count_a: proves the record is used
    sink.write_trial({"trial": "b", "arm": "x", "status": "completed", "spikes": 0,
                      "spikes_rule": spike_rule(3.0, 0.5)})  # another rule: counted again
    sink.write_trial({"trial": "c", "arm": "x", "status": "running"})
    d = L.SweepData("s", tmp_path, str(tmp_path), {}, L._normalise_trials(
        L._read(str(tmp_path), "trials", "s")), None, pd.DataFrame())
    asked = []
    real = L._read_loss_curves
    monkeypatch.setattr(L, "_read_loss_curves",
                        lambda root, sweep, trials=None: asked.append(trials) or real(
                            root, sweep, trials))
    got = L.trial_spikes(d, L.ReportConfig())
    assert asked == [["b", "c"]]
    assert count_a == 1 and got.to_dict() == {"a": 7.0, "b": 1.0, "c": 2.0}


def test_a_sampled_curve_is_not_counted_by_the_report(tmp_path):
    """A curve with a gap between two of its steps (``budget.curve_every`` > 1) gets no
    spike count from the report either; a dense one beside it does."""
    from orchestrator.analysis import load as L
    from orchestrator.store.parquet import ParquetSink

    sink = ParquetSink(str(tmp_path), "s")
    dense = [1.0] * 30 + [5.0] + [1.0] * 20
    for tid, steps in (("dense", range(1, 52)), ("sampled", range(2, 104, 2))):
        sink.write_curve(tid, [{"step": s, "split": "train", "metric": "loss", "value": v,
                                "wall_time": 0.0} for s, v in zip(steps, dense)])
        sink.write_trial({"trial": tid, "arm": "x", "status": "running"})
    d = L.SweepData("s", tmp_path, str(tmp_path), {}, L._normalise_trials(
        L._read(str(tmp_path), "trials", "s")), None, pd.DataFrame())
    assert L.trial_spikes(d, L.ReportConfig()).to_dict() == {"dense": 1.0}
