"""The prior weight of ``also: [inf]`` (issue 17 §3): pure functions and the sampled rates."""

from __future__ import annotations

import math
import random

import optuna
import pytest

from orchestrator.spec.params import Param
from orchestrator.spec.yaml_reader import spec_from_dict
from orchestrator.sweep.also_axis import (
    also_probability,
    axis_bounds,
    axis_decode,
    regular_intervals,
)
from orchestrator.sweep.space import _ConditionalDraw, define_by_run, flat_from_tune_config

P = {"loguniform": [0.25, 64], "also": ["inf"]}


def test_default_weight_is_one_octave():
    p = Param(**P)
    assert regular_intervals(p) == pytest.approx(8.0)
    assert also_probability(p) == pytest.approx(1 / 9)
    assert also_probability(Param(**P, also_weight=4.0)) == pytest.approx(4 / 12)
    assert also_probability(Param(choice=[1, 2, 3], also=["inf"])) == pytest.approx(1 / 4)
    assert also_probability(Param(int=[1, 4], also=[0.5], also_weight=2)) == pytest.approx(2 / 6)
    assert also_probability(Param(loguniform=[0.25, 64])) == 0.0
    with pytest.raises(ValueError, match="also_weight"):
        Param(**P, also_weight=0)


def test_axis_decodes_the_top_slice_to_inf():
    p = Param(**P)
    assert axis_bounds(p) == pytest.approx((-2.0, 7.0))
    assert axis_decode(p, -2.0) == pytest.approx(0.25)
    assert axis_decode(p, 2.0) == pytest.approx(4.0)
    assert axis_decode(p, 6.0) == pytest.approx(64.0)
    assert axis_decode(p, 6.01) == math.inf and axis_decode(p, 7.0) == math.inf
    two = Param(loguniform=[1, 4], also=[100.0, "inf"], also_weight=0.5)
    assert axis_bounds(two) == pytest.approx((0.0, 3.0))
    assert axis_decode(two, 2.2) == 100.0 and axis_decode(two, 2.8) == math.inf


def test_random_draws_inf_at_its_weight():
    rng = random.Random(0)
    draw = _ConditionalDraw("model.residual.p", Param(**P), rng)
    n = 9000
    xs = [draw({"trial": {}}) for _ in range(n)]
    rate = sum(x == math.inf for x in xs) / n
    assert abs(rate - 1 / 9) < 4 * math.sqrt((1 / 9) * (8 / 9) / n)  # ~4 sigma = 0.013
    finite = [math.log2(x) for x in xs if x != math.inf]
    assert min(finite) >= -2 and max(finite) <= 6
    top = sum(x >= 32 for x in xs if x != math.inf) / n  # [32, 64]: one octave, also 1/9
    assert abs(top - rate) < 0.03


def test_optuna_random_startup_draws_inf_at_its_weight():
    spec = spec_from_dict({
        "name": "w", "workload": {"preset": "gpt-debug",
                                  "overrides": {"model.residual.family": "spheret"}},
        "space": {"model.residual.p": {**P, "also_weight": 2.0},
                  "optim.lr": {"loguniform": [1e-4, 1e-2]}},
        "search": {"algorithm": "optuna-tpe", "num_samples": 4}})
    fn = define_by_run(spec)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    n, n_inf = 2000, 0
    for _ in range(n):
        trial = study.ask()
        ret = fn(trial)
        flat = flat_from_tune_config({"trial": {**{k.split("/", 1)[1]: v
                                                   for k, v in trial.params.items()},
                                                **{k.split("/", 1)[1]: v
                                                   for k, v in ret.items()}}})
        n_inf += flat["model.residual.p"] == math.inf
        study.tell(trial, 1.0)
    q = 2 / 10  # w = 2 octaves over 8 + 2
    assert abs(n_inf / n - q) < 4 * math.sqrt(q * (1 - q) / n)
