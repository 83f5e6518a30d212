"""A trial composes its config from ``SweepSpec.trial_plan()`` (plain values, validated once on
the driver): the same config and arm label the spec gives, without rebuilding the spec."""

import json
import math

from orchestrator.spec.params import arm_label
from orchestrator.spec.yaml_reader import spec_from_dict
from orchestrator.sweep.space import grid_trials
from workloads.config import apply_overrides, from_dict, to_dict

SPEC = {
    "name": "plan",
    "workload": {"preset": "gpt-debug"},
    "space": {
        "model.residual.family": {"grid": ["pre_ln", "spheret"]},
        "model.residual.p": {"grid": [1, 2], "also": ["inf"],
                             "when": {"model.residual.family": "spheret"}},
        "optim.lr": {"grid": [1.0e-3, 3.0e-3]},
    },
    "seeds": 2,
    "budget": {"steps": 20, "eval_every": 10},
}


def test_plan_gives_the_specs_configs_and_labels():
    spec = spec_from_dict(SPEC)
    plan = spec.trial_plan()
    json.dumps(plan["base"])  # plain values only
    assert plan["space_keys"] == list(SPEC["space"])
    assert plan["metric"] == "val/loss" and plan["resources"]["workers_per_trial"] == 1
    trials = grid_trials(spec)
    assert len(trials) == (1 + 3) * 2 * 2  # (pre_ln + spheret x 3 p) x 2 lr x 2 seeds
    for flat in trials:
        cfg = apply_overrides(from_dict(plan["base"]), flat)
        assert to_dict(cfg) == to_dict(spec.trial_config(flat))
        assert arm_label(flat, plan["space_keys"]) == spec.arm_label(flat)
    inf = next(f for f in trials if f.get("model.residual.p") == math.inf)
    assert arm_label(inf, plan["space_keys"]) == \
        "model.residual.family=spheret,model.residual.p=inf,optim.lr=0.001"
