"""`geosweep resume --until-decided` (issue 17 §5) without Ray: the extension that adds seeds to
some arms only, and the rounds loop driven by the decisions."""

from __future__ import annotations

import pytest

from orchestrator.analysis.decide import Decision
from orchestrator.spec.sweep_spec import SpecError, SweepSpec
from orchestrator.sweep import until_decided as U
from orchestrator.sweep.experiments import Extension, plan_extension

GRID = {"name": "g", "workload": {"preset": "gpt-debug"},
        "space": {"optim.lr": {"grid": [1e-3, 2e-3, 3e-3]}}, "seeds": [0, 1],
        "search": {"algorithm": "grid"}}


def test_only_arms_get_the_new_seeds_paired():
    spec = SweepSpec.model_validate(GRID)
    recs = [{"trial": f"t{i}", "status": "completed", "seed": s,
             "params": {"optim.lr": lr, "train.seed": s}}
            for i, (lr, s) in enumerate((lr, s) for lr in (1e-3, 2e-3, 3e-3) for s in (0, 1))]
    ext = Extension(more_seeds=2, only_arms=frozenset({"optim.lr=0.001", "optim.lr=0.003"}))
    whole, exp = plan_extension(spec, recs, ext, planned=6, index=2)
    assert sorted((t["optim.lr"], t["train.seed"]) for t in exp.trials) == [
        (1e-3, 2), (1e-3, 3), (3e-3, 2), (3e-3, 3)]
    assert whole.seeds == [0, 1, 2, 3]
    with pytest.raises(SpecError, match="until-decided: no arm"):
        plan_extension(spec, recs, Extension(more_seeds=1, only_arms=frozenset({"x"})), 6, 2)


def test_auto_seeds_spec_starts_with_min_seeds():
    spec = SweepSpec.model_validate({**GRID, "seeds": {"auto": True, "min": 3, "max": 5,
                                                       "effect": 0.05}})
    assert spec.seeds == [0, 1, 2] and spec.seed_budget.max == 5
    again = SweepSpec.model_validate(__import__("yaml").safe_load(spec.to_yaml()))
    assert again.seed_budget == spec.seed_budget and again.seeds == [0, 1, 2]


def _d(arm, state):
    return Decision(arm, 2, 2, 0.1, -0.1, 0.3, 0.4, 0.5, state)


def test_rounds_stop_when_decided(monkeypatch):
    plans = [([_d("a", "undecided"), _d("b", "better")], {"a": 1, "base": 1}),
             ([_d("a", "undecided"), _d("b", "better")], {"a": 1, "base": 1}),
             ([_d("a", "equivalent"), _d("b", "better")], {})]
    monkeypatch.setattr(U, "plan_round", lambda *a, **k: plans.pop(0))
    ran, lines = [], []
    rc = U.until_decided(None, SweepSpec.model_validate(GRID), lambda e: ran.append(e) or 0,
                         lines.append)
    assert rc == 0 and not plans
    assert [(e.more_seeds, e.only_arms) for e in ran] == [(1, frozenset({"a", "base"}))] * 2
    assert "every arm is decided" in lines[-1]
    # a failing round stops the loop with its exit code
    plans[:] = [([_d("a", "undecided")], {"a": 1, "base": 1})]
    assert U.until_decided(None, SweepSpec.model_validate(GRID), lambda e: 3, lines.append) == 3
