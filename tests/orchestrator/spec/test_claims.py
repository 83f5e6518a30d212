"""Claims in a spec: validated against the space; every shipped claim picks exactly one arm."""

from __future__ import annotations

import pandas as pd
import pytest

from orchestrator.analysis.verdicts import _select
from orchestrator.spec.sweep_spec import SpecError
from orchestrator.spec.yaml_reader import load_spec, spec_from_dict
from search_spaces import list_specs

pytestmark = pytest.mark.timeout(120)


def _spec(**claim) -> dict:
    c = {"id": "x", "paper": "P", "source": "paper", "text": "t", "metric": "final_val_loss",
         "arm": {"optim.lr": 0.01}, "baseline": {"optim.lr": 0.001}, "direction": "lower",
         "effect": 0.1}
    c.update(claim)
    return {"name": "t", "workload": {"preset": "gpt-debug"},
            "space": {"optim.lr": {"grid": [0.001, 0.01]}}, "claims": [c]}


def test_a_valid_claim_loads():
    (c,) = spec_from_dict(_spec()).claims
    assert c.arm == {"optim.lr": 0.01} and c.alpha == 0.05 and c.power == 0.8


@pytest.mark.parametrize("claim, msg", [
    ({"arm": {"optim.beta1": 0.9}}, "claims.x.arm: 'optim.beta1' is not a space key"),
    ({"baseline": {"optim.lr": 0.1}}, "claims.x.baseline: optim.lr=0.1 never occurs"),
    ({"effect": 0.0}, "effect"),
    ({"direction": "up"}, "direction"),
    ({"controls": ["first_loss"]}, "needs n_classes"),
    ({"controls": ["vibes"]}, "controls"),
    ({"metric": "cont/resid_ctop1_mean", "controls": ["ones"]}, "drop the 'ones' control"),
    ({"source": "ours"}, "claims.source: Input should be 'paper' or 'proxy', got 'ours'"),
    ({"source": "proxy"}, "claims[0]: x: a proxy claim needs a reason"),
    ({"metric": "diverged", "controls": ["ones"]}, "drop small_gap / ones"),
])
def test_bad_claims_give_one_line(claim, msg):
    with pytest.raises(SpecError) as e:
        spec_from_dict(_spec(**claim))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_every_shipped_claim_says_whose_it_is():
    """Issue 30: a paper claim is on the paper's metric and arms; a proxy says why it exists."""
    n = 0
    for name in list_specs():
        for c in load_spec(name).claims:
            assert c.source in ("paper", "proxy"), (name, c.id)
            if c.source == "proxy":
                assert c.reason and len(c.reason) > 20, (name, c.id)
            if "ctop1" in c.metric or "radial_rms" in str(c.baseline) + str(c.arm):
                assert c.source == "proxy", (name, c.id)  # our metric or our arm
            n += 1
    assert n >= 20


def test_duplicate_claim_ids():
    d = _spec()
    d["claims"].append(dict(d["claims"][0]))
    with pytest.raises(SpecError, match="occurs twice"):
        spec_from_dict(d)


def test_every_shipped_claim_picks_exactly_one_arm():
    from orchestrator.sweep.space import grid_trials

    seen = 0
    for name in list_specs():
        s = load_spec(name)
        if not s.claims:
            continue
        rows = [{**t, "arm": s.arm_label(t)} for t in grid_trials(s)]
        trials = pd.DataFrame(rows)
        for c in s.claims:
            for sel in (c.arm, c.baseline):
                _, arms = _select(trials, sel)
                assert len(arms) == 1, (name, c.id, sel, arms)
            seen += 1
    assert seen >= 8  # norm_ablation 2, manifold_assignment 3 (+2 at scale), continuity_mlp 3
