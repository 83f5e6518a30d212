"""plan_extension: what `geosweep resume --more-seeds N / --num-samples N` adds (no Ray)."""

from __future__ import annotations

import pytest

from orchestrator.spec.sweep_spec import SpecError, SweepSpec
from orchestrator.sweep.experiments import (
    Extension,
    load_experiment,
    plan_extension,
    save_experiment,
)

GRID = {"name": "g", "workload": {"preset": "gpt-debug"},
        "space": {"optim.lr": {"grid": [1e-3, 2e-3]}}, "seeds": [0, 1],
        "search": {"algorithm": "grid"}}
TPE = {"name": "s", "workload": {"preset": "gpt-debug"},
       "space": {"optim.lr": {"loguniform": [1e-4, 1e-2]}, "model.n_layer": {"int": [1, 3]}},
       "search": {"algorithm": "optuna-tpe", "num_samples": 3, "seed": 4}}


def _recs(rows):
    return [{"trial": f"t{i}", "status": st, "seed": seed, "params": params}
            for i, (st, seed, params) in enumerate(rows)]


def test_grid_more_seeds_adds_every_arm_with_new_seeds():
    spec = SweepSpec.model_validate(GRID)
    recs = _recs([("completed", s, {"optim.lr": lr, "train.seed": s})
                  for lr in (1e-3, 2e-3) for s in (0, 1)])
    whole, exp = plan_extension(spec, recs, Extension(more_seeds=2), planned=4, index=2)
    assert whole.seeds == [0, 1, 2, 3] and exp.spec.seeds == [2, 3]
    assert exp.name == "tune-2" and exp.trials is None and exp.count == 4


def test_search_more_seeds_repeats_completed_configurations():
    spec = SweepSpec.model_validate(TPE)
    recs = _recs([("completed", 0, {"optim.lr": 3e-3, "model.n_layer": 2.0, "train.seed": 0}),
                  ("diverged", 0, {"optim.lr": 9e-3, "model.n_layer": 1, "train.seed": 0}),
                  ("completed", 0, {"optim.lr": 1e-4, "model.n_layer": 3, "train.seed": 0})])
    whole, exp = plan_extension(spec, recs, Extension(more_seeds=2), planned=3, index=2)
    assert whole.seeds == [0, 1, 2]
    assert exp.trials == [
        {"optim.lr": 3e-3, "model.n_layer": 2, "train.seed": 1},
        {"optim.lr": 3e-3, "model.n_layer": 2, "train.seed": 2},
        {"optim.lr": 1e-4, "model.n_layer": 3, "train.seed": 1},
        {"optim.lr": 1e-4, "model.n_layer": 3, "train.seed": 2}]
    assert all(type(t["model.n_layer"]) is int for t in exp.trials)  # Parquet gave 2.0


def test_num_samples_continues_the_search_with_a_new_stream():
    spec = SweepSpec.model_validate(TPE)
    recs = _recs([("completed", 0, {"optim.lr": 1e-3, "train.seed": 0})] * 3)
    whole, exp = plan_extension(spec, recs, Extension(num_samples=5), planned=3, index=3)
    assert whole.search.num_samples == 8 and exp.spec.search.num_samples == 5
    assert exp.spec.search.seed != spec.search.seed and exp.count == 5


@pytest.mark.parametrize("spec, recs, ext, planned, msg", [
    (GRID, [], Extension(num_samples=2), 0, "grid sweep"),
    (TPE, _recs([("running", 0, {})]), Extension(more_seeds=1), 1, "not finished"),
    (TPE, _recs([("completed", 0, {})]), Extension(more_seeds=1), 3, "not finished"),
    (TPE, _recs([("diverged", 0, {})] * 3), Extension(more_seeds=1), 3, "no completed"),
    (TPE, [], Extension(more_seeds=1, num_samples=1), 0, "one of them"),
])
def test_refusals_are_one_line(spec, recs, ext, planned, msg):
    with pytest.raises(SpecError, match=msg) as e:
        plan_extension(SweepSpec.model_validate(spec), recs, ext, planned, 2)
    assert "\n" not in str(e.value)


def test_experiment_description_round_trips(tmp_path):
    spec = SweepSpec.model_validate(TPE)
    recs = _recs([("completed", 0, {"optim.lr": 3e-3, "train.seed": 0})])
    _, exp = plan_extension(spec, recs, Extension(more_seeds=1), planned=1, index=2)
    save_experiment(tmp_path, exp)
    back = load_experiment(tmp_path, "tune-2", fallback=SweepSpec.model_validate(GRID))
    assert back.trials == exp.trials and back.spec == exp.spec
    assert load_experiment(tmp_path, "tune", fallback=spec).spec is spec  # no JSON: fallback
