"""spec.space -> Tune: exact grids, conditional params, random draws, Optuna define-by-run.

No Ray cluster: grids and random spaces are resolved with Tune's offline variant generator,
Optuna spaces with ``ask()``/``tell()`` and with ``OptunaSearch.suggest`` directly.
"""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest

from orchestrator.spec.yaml_reader import spec_from_dict
from orchestrator.sweep.space import (
    AXIS,
    PREFIX,
    REGULAR,
    SPECIAL,
    build_search,
    count_trials,
    define_by_run,
    expand,
    flat_from_tune_config,
    grid_trials,
    optuna_param_name,
)

pytestmark = pytest.mark.timeout(120)
optuna.logging.set_verbosity(optuna.logging.WARNING)

P = {"loguniform": [0.25, 64], "also": ["inf"], "when": {"model.residual.family": "spheret"}}


def make(space: dict, seeds=1, preset="gpt-debug", **search) -> object:
    search = {"algorithm": "grid", **search}
    return spec_from_dict({"name": "t", "workload": {"preset": preset}, "space": space,
                           "seeds": seeds, "search": search,
                           "budget": {"steps": 20, "eval_every": 10}})


def searched() -> dict:
    return {"model.residual.family": {"choice": ["pre_ln", "spheret"]},
            "model.residual.p": dict(P), "optim.lr": {"loguniform": [1e-4, 1e-2]}}


def check_valid(spec, flat: dict) -> None:
    """p exactly when spheret, inside its range or inf; lr inside its range; seed = seeds[0]."""
    assert flat["train.seed"] == spec.seeds[0]
    assert 1e-4 <= flat["optim.lr"] <= 1e-2 and isinstance(flat["optim.lr"], float)
    if flat["model.residual.family"] == "spheret":
        p = flat["model.residual.p"]
        assert isinstance(p, float) and (p == math.inf or 0.25 <= p <= 64)
    else:
        assert "model.residual.p" not in flat
    cfg = spec.trial_config(flat)
    assert cfg.model.residual.get("p", 1.0) == flat.get("model.residual.p", 1.0)


# --- grid ----------------------------------------------------------------------------------


def test_grid_is_the_exact_conditional_product_with_seeds_outermost():
    s = make({"model.residual.family": {"grid": ["pre_ln", "spheret", "geonorm"]},
              "model.residual.p": {"grid": [1, 2], "also": ["inf"],
                                   "when": {"model.residual.family": "spheret"}},
              "optim.lr": {"choice": [1e-3, 1e-2]}}, seeds=[7, 8])
    trials = grid_trials(s)
    # (pre_ln + geonorm + spheret x 3 p) x 2 lr x 2 seeds
    assert len(trials) == count_trials(s) == (2 + 3) * 2 * 2
    assert [t["train.seed"] for t in trials] == [7] * 10 + [8] * 10
    for t in trials:
        assert ("model.residual.p" in t) == (t["model.residual.family"] == "spheret")
    ps = sorted({t["model.residual.p"] for t in trials if "model.residual.p" in t})
    assert ps == [1.0, 2.0, math.inf]
    assert len({tuple(sorted(t.items())) for t in trials}) == len(trials)
    param_space, alg, n = build_search(s)
    assert param_space == {PREFIX: {"grid_search": trials}} and n == 1
    assert alg.max_concurrent == s.search.max_concurrent


def test_grid_chains_conditions_and_drops_duplicates():
    s = make({"model.skip": {"grid": [False, True]},
              "model.activation": {"grid": ["relu", "none"], "when": {"model.skip": True}},
              "model.norm": {"grid": ["none", "rmsnorm"],
                             "when": {"model.activation": "none"}}}, seeds=2, preset="mlp-debug")
    trials = grid_trials(s)
    arms = {s.arm_label(t) for t in trials}
    assert arms == {"model.skip=false", "model.skip=true,model.activation=relu",
                    "model.skip=true,model.activation=none,model.norm=none",
                    "model.skip=true,model.activation=none,model.norm=rmsnorm"}
    assert len(trials) == 4 * 2
    for t in trials:  # the chained condition: norm only when activation is present and none
        assert ("model.norm" in t) == (t.get("model.activation") == "none")
    # every value listed twice: the same trials, first occurrence kept
    assert expand(s, lambda p: p.values() * 2, list(s.seeds)) == trials


def test_count_trials_for_random_and_optuna():
    space = searched()
    assert count_trials(make(space, algorithm="optuna-tpe", num_samples=9)) == 9
    space["optim.weight_decay"] = {"grid": [0.0, 0.1, 0.2]}
    assert count_trials(make(space, algorithm="random", num_samples=5)) == 15


# --- random --------------------------------------------------------------------------------


def resolve_random(spec, n: int) -> list[dict]:
    from ray.tune.search.variant_generator import generate_variants

    param_space, alg, num_samples = build_search(spec)
    assert num_samples == spec.search.num_samples
    rs = np.random.RandomState(spec.search.seed)
    out = []
    for _ in range(n):
        for _, cfg in generate_variants(param_space, random_state=rs):
            out.append(flat_from_tune_config(cfg))
    return out


def test_random_samples_are_valid_conditional_and_reproducible():
    s = make(searched(), algorithm="random", num_samples=300, seed=5)
    flats = resolve_random(s, 300)
    for flat in flats[:40]:
        check_valid(s, flat)
    for flat in flats:
        assert ("model.residual.p" in flat) == (flat["model.residual.family"] == "spheret")
    sph = [f["model.residual.p"] for f in flats if "model.residual.p" in f]
    # family ~ uniform over 2; inf with probability 1/(8 octaves + 1) = 1/9 among spheret
    assert 110 <= len(sph) <= 190
    n_inf = sum(p == math.inf for p in sph)
    assert 0.04 <= n_inf / len(sph) <= 0.2
    finite = np.log([p for p in sph if p != math.inf])
    assert finite.min() >= math.log(0.25) and finite.max() <= math.log(64)
    # log-uniform: the mean of log p is the midpoint of [log 0.25, log 64] within ~4 sigma
    mid, sd = (math.log(0.25) + math.log(64)) / 2, (math.log(256) / math.sqrt(12))
    assert abs(finite.mean() - mid) < 4 * sd / math.sqrt(len(finite))
    assert resolve_random(s, 20) == flats[:20]  # the same seed draws the same trials


def test_random_int_bounds_are_inclusive_and_grid_params_expand():
    s = make({"model.n_layer": {"int": [1, 3]}, "optim.weight_decay": {"grid": [0.0, 0.1]}},
             algorithm="random", num_samples=50)
    flats = resolve_random(s, 50)
    assert len(flats) == count_trials(s) == 100  # 50 draws x 2 grid points
    assert {f["model.n_layer"] for f in flats} == {1, 2, 3}
    assert {f["optim.weight_decay"] for f in flats} == {0.0, 0.1}


# --- Optuna --------------------------------------------------------------------------------


class SuggestOnly:
    """Wraps an Optuna trial and fails on any attribute other than ``suggest_*``."""

    def __init__(self, trial):
        self._trial = trial
        self.calls: list[str] = []

    def __getattr__(self, name):
        assert name.startswith("suggest_"), f"define-by-run touched trial.{name}"
        self.calls.append(name)
        return getattr(self._trial, name)


def tune_config_from(params: dict, ret: dict) -> dict:
    from ray._private.dict import unflatten_dict  # what OptunaSearch.suggest applies

    return unflatten_dict({**params, **ret})


@pytest.mark.parametrize("algorithm", ["optuna-tpe", "optuna-gp"])
def test_define_by_run_only_suggests_and_yields_valid_flat_configs(algorithm):
    s = make(searched(), algorithm=algorithm, num_samples=12, seed=1)
    fn = define_by_run(s)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen_inf = seen_pre_ln = 0
    for _ in range(40):
        trial = study.ask()
        wrapped = SuggestOnly(trial)
        ret = fn(wrapped)
        pname = optuna_param_name("model.residual.p")
        assert set(ret) - {pname} == {optuna_param_name("train.seed")}
        flat = flat_from_tune_config(tune_config_from(trial.params, ret))
        check_valid(s, flat)
        seen_inf += flat.get("model.residual.p") == math.inf
        seen_pre_ln += flat["model.residual.family"] == "pre_ln"
        if flat["model.residual.family"] == "spheret":
            # p with also: [inf] is one extended log2 axis; its decoded value is returned
            assert f"{pname}{AXIS}" in trial.params and pname in ret
            assert f"{pname}{SPECIAL}" not in trial.params
        study.tell(trial, flat["optim.lr"])
    assert seen_inf > 0 and seen_pre_ln > 0


@pytest.mark.filterwarnings("ignore:Define-by-run function")  # GP fits inside suggest_*
@pytest.mark.parametrize("algorithm", ["optuna-tpe", "optuna-gp"])
def test_optuna_search_suggests_through_ray_without_a_cluster(algorithm):
    s = make(searched(), algorithm=algorithm, num_samples=6, max_concurrent=2, seed=3)
    param_space, alg, n = build_search(s)
    assert param_space == {} and n == 6 and alg.max_concurrent == 2
    ids = []
    for i in range(6):  # the model-based sampler is used after the start-up trials
        tid = f"t{i}"
        cfg = alg.suggest(tid)
        flat = flat_from_tune_config(cfg)
        check_valid(s, flat)
        alg.on_trial_complete(tid, {"val/loss": 1.0 + flat["optim.lr"], "training_iteration": 1})
        ids.append(tid)
    assert len(ids) == 6


@pytest.mark.parametrize("algorithm", ["random", "optuna-tpe"])
def test_search_state_pickles_for_tune_checkpoints(algorithm, tmp_path):
    import pickle

    s = make(searched(), algorithm=algorithm, num_samples=4)
    param_space, alg, _ = build_search(s)
    pickle.loads(pickle.dumps(param_space))  # Tuner saves the param_space
    if algorithm != "random":
        alg.suggest("t0")
        alg.searcher.save(str(tmp_path / "searcher.pkl"))  # OptunaSearch uses plain pickle


# --- the Tune config -> flat overrides ---------------------------------------------------------


def test_flat_from_tune_config_round_trips_and_resolves_switches():
    s = make({"model.residual.family": {"grid": ["pre_ln", "spheret"]},
              "model.residual.p": {"grid": [1, 2], "also": ["inf"],
                                   "when": {"model.residual.family": "spheret"}}}, seeds=2)
    for t in grid_trials(s):
        assert flat_from_tune_config({PREFIX: t}) == t
        assert flat_from_tune_config(t) == t  # already flat
    cfg = {PREFIX: {"model.residual.p:special": "inf", "optim.lr": np.float64(0.5),
                    "model.n_layer": np.int64(3), "model.residual.family": "spheret",
                    "model.residual.norm": None, "train.seed": 0}}
    flat = flat_from_tune_config(cfg)
    assert flat == {"model.residual.p": math.inf, "optim.lr": 0.5, "model.n_layer": 3,
                    "model.residual.family": "spheret", "train.seed": 0}
    assert type(flat["optim.lr"]) is float and type(flat["model.n_layer"]) is int
    regular = flat_from_tune_config({PREFIX: {"model.residual.p:special": REGULAR,
                                              "model.residual.p": 2.5}})
    assert regular == {"model.residual.p": 2.5}
