"""The sweep spec: malformed specs give one line naming the field; shipped specs load exactly."""

from __future__ import annotations

import copy
import math
import time

import numpy as np
import pandas as pd
import pytest

from orchestrator.spec.sweep_spec import SpecError, SweepSpec
from orchestrator.spec.yaml_reader import MAX_SPEC_BYTES, load_spec, spec_from_dict, spec_from_text
from search_spaces import list_specs, spec_path
from workloads.optim import STRATEGIES
from workloads.residual import RESIDUALS

pytestmark = pytest.mark.timeout(120)

SHIPPED = ["continuity_llama", "continuity_mlp", "continuity_mlp_c2", "continuity_mlp_core",
           "gpu_smoke", "manifold_assignment", "manifold_assignment_b1", "manifold_assignment_gpt2",
           "norm_ablation", "quickstart", "spheret_p_search"]


def base() -> dict:
    return {
        "name": "t",
        "workload": {"preset": "gpt-debug"},
        "space": {
            "model.residual.family": {"grid": ["pre_ln", "spheret"]},
            "model.residual.p": {"grid": [1, 2], "also": ["inf"],
                                 "when": {"model.residual.family": "spheret"}},
            "optim.lr": {"grid": [1e-3, 1e-2]},
        },
        "seeds": 2,
        "budget": {"steps": 20, "eval_every": 10, "metrics_every": 10},
    }


DEL = object()


def edit(d: dict, path: tuple, value) -> dict:
    d = copy.deepcopy(d)
    cur = d
    for k in path[:-1]:
        cur = cur.setdefault(k, {})
    if value is DEL:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return d


RANGE_P = {"loguniform": [0.25, 64], "also": ["inf"], "when": {"model.residual.family": "spheret"}}
RANDOM = {"algorithm": "random", "num_samples": 4}

# (id, path, value, extra edits, the line must start with)
BAD = [
    ("name-type", ("name",), 3, {}, "name:"),
    ("name-chars", ("name",), "Bad Name!", {}, "name:"),
    ("name-missing", ("name",), DEL, {}, "name: required"),
    ("unknown-top", ("bogus",), 1, {}, "bogus: unknown field; valid: name"),
    ("unknown-top-dash", ("my-key",), 1, {}, "my-key: unknown field"),
    ("divergence-penalty", ("divergence", "penalty"), "huge", {}, "divergence.penalty:"),
    ("workload-missing", ("workload",), DEL, {}, "workload: required"),
    ("unknown-preset", ("workload", "preset"), "gpt-huge", {}, "workload.preset:"),
    ("override-key", ("workload", "overrides"), {"optim.lrr": 1}, {}, "workload.overrides:"),
    ("override-lr", ("workload", "overrides"), {"optim.lr": -1.0}, {}, "workload.overrides:"),
    ("unknown-family", ("space", "model.residual.family", "grid"), ["spheret", "rmsformer"], {},
     "space.model.residual.family:"),
    ("p-zero", ("space", "model.residual.p", "grid"), [0, 2], {}, "space.model.residual.p:"),
    ("p-negative-log", ("space", "model.residual.p"), {**RANGE_P, "loguniform": [-1, 4]},
     {("search",): RANDOM}, "space.model.residual.p: loguniform low must be > 0, got -1"),
    ("p-uniform-neg", ("space", "model.residual.p"), {**RANGE_P.copy(), "loguniform": None,
                                                       "uniform": [-1.0, 4.0]},
     {("search",): RANDOM}, "space.model.residual.p:"),
    ("lr-zero", ("space", "optim.lr", "grid"), [0.0, 1e-3], {}, "space.optim.lr:"),
    ("lr-inf", ("space", "optim.lr", "grid"), ["inf"], {}, "space.optim.lr:"),
    ("unknown-space-key", ("space", "optim.lrr"), {"grid": [1e-3]}, {}, "space.optim.lrr:"),
    ("undotted-key", ("space", "lr"), {"grid": [1e-3]}, {}, "space.lr:"),
    ("two-kinds", ("space", "optim.lr"), {"grid": [1e-3], "choice": [1e-2]}, {},
     "space.optim.lr: needs exactly one of"),
    ("no-kind", ("space", "optim.lr"), {"also": [1e-3]}, {}, "space.optim.lr: needs exactly one"),
    ("param-field", ("space", "optim.lr"), {"grid": [1e-3], "log": True}, {},
     "space.optim.lr.log: unknown field; valid: grid"),
    ("param-scalar", ("space", "optim.lr"), 0.001, {}, "space.optim.lr: expected a mapping"),
    ("uniform-order", ("space", "optim.lr"), {"uniform": [0.1, 0.01]}, {("search",): RANDOM},
     "space.optim.lr: uniform low must be < high"),
    ("choice-dupes", ("space", "optim.lr"), {"choice": [0.1, 0.1]}, {}, "space.optim.lr:"),
    ("grid-1-vs-1.0", ("space", "optim.weight_decay"), {"grid": [0, 0.0]}, {},
     "space.optim.weight_decay: grid values must be distinct"),
    ("also-repeats", ("space", "model.residual.p", "also"), [2], {},
     "space.model.residual.p: also repeats"),
    ("empty-random", ("space",), {}, {("search",): RANDOM}, "space: search.algorithm random needs"),
    ("gp-with-grid", ("search",), {"algorithm": "optuna-gp", "num_samples": 4},
     {("space", "optim.lr"): {"loguniform": [1e-4, 1e-2]}}, "space.model.residual.family: grid"),
    ("grid-with-range", ("space", "optim.lr"), {"loguniform": [1e-4, 1e-2]}, {},
     "space.optim.lr: loguniform needs search.algorithm"),
    ("grid-samples", ("search", "num_samples"), 3, {}, "search.num_samples:"),
    ("asha-1-step", ("scheduler",), {"type": "asha"},
     {("budget",): {"steps": 1, "eval_every": 1}}, "scheduler:"),
    ("asha-grace", ("scheduler",), {"type": "asha", "grace_period": 20}, {},
     "scheduler.grace_period: must be < max_t"),
    ("asha-max-t", ("scheduler",), {"type": "asha", "max_t": 50}, {}, "scheduler.max_t:"),
    ("none-grace", ("scheduler",), {"type": "none", "grace_period": 5}, {},
     "scheduler.grace_period: only for type asha"),
    ("scheduler-type", ("scheduler", "type"), "hyperband", {}, "scheduler.type:"),
    ("seeds-negative", ("seeds",), -1, {}, "seeds:"),
    ("seeds-dupes", ("seeds",), [0, 0], {}, "seeds:"),
    ("seeds-string", ("seeds",), "abc", {}, "seeds:"),
    ("seeds-empty", ("seeds",), [], {}, "seeds:"),
    ("seeds-bool", ("seeds",), True, {}, "seeds:"),
    ("samples-zero", ("search", "num_samples"), 0, {}, "search.num_samples:"),
    ("concurrency-zero", ("search", "max_concurrent"), 0, {}, "search.max_concurrent:"),
    ("algorithm", ("search", "algorithm"), "bayes", {}, "search.algorithm:"),
    ("mode", ("search", "mode"), "minimize", {}, "search.mode:"),
    ("cpus-zero", ("resources", "cpus_per_worker"), 0, {}, "resources.cpus_per_worker:"),
    ("gpus-fraction", ("resources", "gpus_per_worker"), 1.5, {}, "resources.gpus_per_worker:"),
    ("in-trial-workers", ("resources",), {"executor": "in_trial", "workers_per_trial": 2}, {},
     "resources: executor in_trial"),
    ("custom-cpu", ("resources", "custom"), {"CPU": 1.0}, {}, "resources.custom: 'CPU'"),
    ("divergence-key", ("divergence", "foo"), 1, {}, "divergence.foo: unknown field"),
    ("divergence-patience", ("divergence", "patience"), 0, {}, "divergence.patience:"),
    ("when-later-key", ("space",), {"model.residual.p": {"grid": [1.0], "when": {
        "model.residual.family": "spheret"}}, "model.residual.family": {"grid": ["spheret"]}}, {},
     "space.model.residual.p.when:"),
    ("when-never", ("space", "model.residual.p", "when"), {"model.residual.family": "geonorm"},
     {}, "space.model.residual.p.when: model.residual.family=geonorm never occurs"),
    ("budget-zero", ("budget", "steps"), 0, {}, "budget.steps:"),
    ("budget-string", ("budget", "steps"), "100", {}, "budget.steps:"),
    ("budget-conflict", ("workload", "overrides"), {"train.steps": 99}, {}, "budget.steps:"),
    ("space-seed", ("space", "train.seed"), {"grid": [0, 1]}, {}, "space.train.seed:"),
    ("space-steps", ("space", "train.steps"), {"grid": [10, 20]}, {}, "space.train.steps:"),
    ("p-for-pre-ln", ("space", "model.residual.p", "when"), {}, {}, "space.model.residual.p:"),
    ("tracking-type", ("tracking", "mlflow_uri"), 5, {}, "tracking.mlflow_uri:"),
    ("random-grid-only", ("search",), RANDOM, {}, "search.algorithm: random over grid"),
    ("optuna-grid", ("search",), {"algorithm": "optuna-tpe", "num_samples": 4},
     {("space", "optim.lr"): {"loguniform": [1e-4, 1e-2]}},
     "space.model.residual.family: grid is exhaustive"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_malformed_spec_gives_one_line_naming_the_field(case):
    _, path, value, extra, start = case
    d = edit(base(), path, value)
    for p, v in extra.items():
        d = edit(d, p, v)
    with pytest.raises(SpecError) as e:
        spec_from_dict(d)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 300, msg
    assert msg.startswith(start), msg


def test_base_is_valid_and_max_concurrent_above_trials_is_fine():
    s = spec_from_dict(edit(base(), ("search", "max_concurrent"), 100))
    assert s.search.max_concurrent == 100
    # grid values of p are unified to floats (one column type), the string inf is math.inf
    assert s.space["model.residual.p"].grid == [1.0, 2.0]
    assert all(isinstance(v, float) for v in s.space["model.residual.p"].grid)
    assert s.space["model.residual.p"].also == [math.inf]


def test_empty_space_with_grid_runs_just_the_seeds():
    from orchestrator.sweep.space import grid_trials

    s = spec_from_dict(edit(base(), ("space",), {}))
    assert grid_trials(s) == [{"train.seed": 0}, {"train.seed": 1}]
    assert s.arm_label({"train.seed": 1}) == "base"


# --- YAML safety -----------------------------------------------------------------------------

BOMB = "\n".join(["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + [
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)])

BAD_YAML = [
    ("bomb", BOMB, "spec: YAML expands to more than"),
    ("recursive-alias", "name: &a [*a]", "spec: recursive YAML alias"),
    ("list", "- a\n- b\n", "spec: the top level must be a mapping"),
    ("scalar", "just a string\n", "spec: the top level must be a mapping"),
    ("empty", "", "spec: the top level must be a mapping"),
    ("syntax", "name: [unclosed\nworkload: {}\n", "spec: invalid YAML at line"),
    ("duplicate-key", "name: a\nname: b\n", "spec: duplicate key 'name'"),
    ("deep", "name: " + "[" * 100 + "]" * 100, "spec: YAML nested deeper"),
    ("tab-indent", "name: a\n\tworkload: {}\n", "spec: invalid YAML"),
]


@pytest.mark.parametrize("case", BAD_YAML, ids=[c[0] for c in BAD_YAML])
def test_bad_yaml_gives_one_line(case):
    _, text, start = case
    t0 = time.perf_counter()
    with pytest.raises(SpecError) as e:
        spec_from_text(text)
    assert time.perf_counter() - t0 < 2.0  # a bomb is refused before it is expanded
    assert "\n" not in str(e.value) and str(e.value).startswith(start), str(e.value)


def test_huge_file_missing_file_and_unknown_name(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("name: x\n" + "# " + "x" * MAX_SPEC_BYTES + "\n")
    with pytest.raises(SpecError, match=r"^big.yaml: \d+ bytes is larger than"):
        load_spec(big)
    with pytest.raises(SpecError, match="^spec: no such file"):
        load_spec(str(tmp_path / "none.yaml"))
    with pytest.raises(SpecError, match="^spec: 'nope' is neither a file nor a shipped spec; "
                                        "shipped: continuity_llama"):
        load_spec("nope")


def test_yaml_extras_small_anchors_and_1e_floats(tmp_path):
    text = """
name: anchors
workload: {preset: gpt-debug}
space:
  optim.lr: &lrs {grid: [1e-3, 3e-3]}
  optim.muon.lr: *lrs
budget: {steps: 20, eval_every: 10}
"""
    path = tmp_path / "a.yaml"
    path.write_text(text)
    s = load_spec(path)
    assert s.space["optim.lr"].grid == [1e-3, 3e-3]  # 1e-3 is a float, not the string '1e-3'
    assert s.space["optim.muon.lr"].grid == [1e-3, 3e-3]


# --- shipped specs ---------------------------------------------------------------------------


def test_every_shipped_spec_loads_and_round_trips():
    assert list_specs() == SHIPPED
    for name in SHIPPED:
        s = load_spec(name)
        assert s.name == name
        assert load_spec(spec_path(name)) == s  # by name and by path
        again = spec_from_text(s.to_yaml())
        assert again.model_dump() == s.model_dump()
        # what the Tune trial driver receives (JSON mode keeps inf)
        assert SweepSpec.model_validate(s.model_dump(mode="json")).model_dump() == s.model_dump()


def test_norm_ablation_is_a_stability_frontier():
    from orchestrator.sweep.space import count_trials, grid_trials

    s = load_spec("norm_ablation")
    fams = s.space["model.residual.family"].grid
    assert set(fams) == set(RESIDUALS) and len(fams) == 7
    assert s.space["model.residual.p"].grid == [0.5, 1.0, 2.0, 4.0, math.inf]
    lrs = s.space["optim.lr"].grid
    assert len(lrs) >= 6 and max(lrs) == 1.0 and min(lrs) <= 1e-3
    ratios = np.diff(np.log10(lrs))
    assert np.allclose(ratios, 0.5, atol=0.01)  # log-spaced, half a decade
    cfg = s.base_config()
    assert cfg.model.n_layer >= 6 and cfg.optim.weight_decay == 0.0  # wd not coupled to lr
    assert cfg.train.steps == 1000 and s.divergence.patience == 50
    # the sphere families' step init crossed in (issue 30): the value used so far and nGPT's
    a0 = s.space["model.residual.alpha_init"]
    assert a0.grid == [1.0, 0.05] and a0.when == {"model.residual.family": ["spheret", "geonorm"]}
    trials = grid_trials(s)
    # 5 plain families + GeoNorm and SpheretNorm x 5 p at 2 inits, x lrs x 3 seeds
    assert len(trials) == count_trials(s) == (5 + 2 * (1 + 5)) * len(lrs) * 3 == 357
    assert {t["train.seed"] for t in trials} == {0, 1, 2}


def test_manifold_assignment_and_continuity_counts():
    from orchestrator.sweep.space import grid_trials

    s = load_spec("manifold_assignment")
    assert s.base_config().optim.name == "muon"
    assert set(s.space["optim.manifold.assignment"].grid) == set(STRATEGIES)
    assert len(grid_trials(s)) == 5 * 5
    mf = s.base_config().optim.manifold
    assert (mf.dual_mode, mf.dual_steps, mf.dual_tol, mf.init_match) == ("fast", 20, None, True)
    assert s.base_config().train.steps == 2000

    s = load_spec("continuity_mlp")
    labels = {s.arm_label(t) for t in grid_trials(s)}
    res = "model.skip=true,model.activation="
    relu = f"{res}relu,model.init_scale=1,optim.name=adamw,optim.beta2=0.999"
    assert len(labels) == 17 and {
        "model.skip=false",  # NoRes with the preset's ReLU
        f"{res}radial", f"{res}radial_rms", f"{res}tanh",
        f"{relu},model.norm=none", f"{relu},model.norm=layernorm",  # Paper C's norm arm
        f"{res}none,model.init_scale=1,optim.name=adamw,optim.beta2=0.999",
        f"{res}none,model.init_scale=0.25",
        f"{res}none,model.init_scale=1,optim.name=adamw,optim.beta2=0,optim.beta1=0",
        f"{res}relu,model.init_scale=1,optim.name=sgd,optim.lr=0.01"} <= labels
    assert len(grid_trials(s)) == 17 * 3
    cfg = s.base_config()
    assert (cfg.train.steps, cfg.train.epochs, cfg.train.metrics_every) == (4690, 10, 50)
    assert (cfg.model.width, cfg.model.depth, cfg.metrics.grad_probes) == (256, 16, 4)

    s = load_spec("continuity_llama")
    assert s.base_config().model.arch == "llama" and len(grid_trials(s)) == 3


def test_quickstart_is_a_real_small_p_and_lr_search():
    s = load_spec("quickstart")
    cfg = s.base_config()
    assert cfg.model.residual == {"family": "spheret"} and cfg.data.corpus == "shakespeare"
    assert s.search.algorithm == "optuna-tpe" and s.search.max_concurrent == 2
    p = s.space["model.residual.p"]
    assert p.loguniform == [0.25, 64.0] and p.also == [math.inf]
    assert s.space["optim.lr"].kind == "loguniform"
    assert s.scheduler.type == "asha" and s.scheduler.max_t == cfg.train.steps == 300
    # 10-minute target on 2 cores: <= 8 trials x 300 steps of the 2 x 64 model
    assert s.search.num_samples * cfg.train.steps <= 2400 and cfg.model.n_embd <= 64


# --- configs and labels ----------------------------------------------------------------------


def test_base_and_trial_config_apply_preset_overrides_budget_then_trial():
    d = edit(base(), ("workload", "overrides"), {"model.n_embd": 32, "train.steps": 20})
    s = spec_from_dict(d)
    cfg = s.base_config()
    assert (cfg.train.steps, cfg.train.eval_every, cfg.train.metrics_every) == (20, 10, 10)
    assert cfg.model.n_embd == 32 and cfg.preset == "gpt-debug"
    t = s.trial_config({"model.residual.family": "spheret", "model.residual.p": math.inf,
                        "optim.lr": 1e-2, "train.seed": 1})
    assert t.model.residual == {"family": "spheret", "p": math.inf}
    assert (t.optim.lr, t.train.seed, t.model.n_embd) == (1e-2, 1, 32)
    assert s.base_config().model.residual == {"family": "pre_ln"}  # not mutated by a trial
    with pytest.raises(SpecError, match="^trial optim.lr=-1: optim.lr: must be > 0"):
        s.trial_config({"optim.lr": -1.0})


def test_budget_curve_every_maps_onto_the_train_config():
    s = spec_from_dict(edit(base(), ("budget", "curve_every"), 5))
    assert s.base_config().train.curve_every == 5
    assert spec_from_dict(base()).base_config().train.curve_every == 1  # the preset's
    with pytest.raises(SpecError, match="curve_every"):
        spec_from_dict(edit(base(), ("budget", "curve_every"), -1))


def test_arm_label_is_short_stable_and_seed_free():
    s = spec_from_dict(base())
    flat = {"optim.lr": 0.001, "train.seed": 3, "model.residual.p": math.inf,
            "model.residual.family": "spheret"}
    assert s.arm_label(flat) == ("model.residual.family=spheret,model.residual.p=inf,"
                                 "optim.lr=0.001")
    assert s.arm_label({**flat, "train.seed": 0}) == s.arm_label(flat)


def test_continuity_mlp_core_is_the_claim_subset_of_continuity_mlp():
    """docs/results.md's Paper C verdicts come from the core spec: it must be continuity_mlp
    with fewer arms (same workload, budget, divergence rules and claims), and every arm a
    claim names must be in its trial plan."""
    full, core = load_spec("continuity_mlp"), load_spec("continuity_mlp_core")
    for field in ("workload", "budget", "divergence", "claims", "seeds"):
        assert getattr(core, field) == getattr(full, field), field
    from orchestrator.analysis.verdicts import _matches
    from orchestrator.sweep.space import grid_trials

    trials = pd.DataFrame(grid_trials(core))
    assert len(trials) == 7 * len(core.seeds)  # the seven arms the claims compare
    for claim in core.claims:
        for side in (claim.arm, claim.baseline):
            assert _matches(trials, side).any(), (claim.id, side)


@pytest.mark.parametrize("powered, source, claims", [
    ("continuity_mlp_c2", "continuity_mlp", ("C2", "C2c")),
    ("manifold_assignment_b1", "manifold_assignment", ("B1", "B1u")),
])
def test_powered_specs_rerun_their_source_with_more_seeds(powered, source, claims):
    """A powered spec (docs/results.md, "the specs that can test the claims") is its source
    spec's workload, budget and rules with more seeds: a verdict from it answers the same claim.
    Its claims keep the source's metric, effect, direction, controls and length, and pick one
    arm each side in its own grid."""
    from orchestrator.analysis.verdicts import _matches
    from orchestrator.sweep.space import grid_trials

    p, s = load_spec(powered), load_spec(source)
    for field in ("workload", "budget", "divergence", "resources"):
        assert getattr(p, field) == getattr(s, field), field
    assert len(p.seeds) > len(s.seeds)
    assert [c.id for c in p.claims] == list(claims)
    trials = pd.DataFrame(grid_trials(p))
    by_id = {c.id: c for c in s.claims}
    for c in p.claims:
        src = by_id[c.id]
        for f in ("metric", "effect", "effect_source", "direction", "controls", "min_steps",
                  "n_classes", "alpha", "power"):
            assert getattr(c, f) == getattr(src, f), (c.id, f)
        for side in (c.arm, c.baseline):
            assert _matches(trials, side).sum() == len(p.seeds), (c.id, side)


def _half_of_norm_ablation(name: str, claims: tuple[str, ...]):
    """docs/results/<name>.yaml and norm_ablation, after checking that the half runs the
    shipped spec's workload, budget, rules, seeds and search with its claims ``claims``."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    half, full = load_spec(str(root / f"docs/results/{name}.yaml")), load_spec("norm_ablation")
    for field in ("workload", "budget", "divergence", "resources", "seeds", "search"):
        assert getattr(half, field) == getattr(full, field), field
    assert [c for c in full.claims if c.id in claims] == list(half.claims)
    return half, full


def test_norm_ablation_n_is_the_ngpt_init_half_of_norm_ablation():
    """docs/results/norm_ablation_n.yaml (docs/results.md §0b) is norm_ablation's workload,
    budget, rules and seeds on a part of its grid: the sphere families at alpha_init 0.05 and
    Pre-LN, with norm_ablation's own A1n and A2n, so its verdicts answer the shipped claims."""

    from orchestrator.sweep.space import grid_trials

    half, full = _half_of_norm_ablation("norm_ablation_n", ("A1n", "A2n"))
    key = lambda t: tuple(sorted(t.items()))  # noqa: E731
    part, whole = {key(t) for t in grid_trials(half)}, {key(t) for t in grid_trials(full)}
    assert part <= whole and len(part) == 147
    expected = {key(t) for t in grid_trials(full)
                if t["model.residual.family"] == "pre_ln"
                or t.get("model.residual.alpha_init") == 0.05}
    assert part == expected


def test_norm_ablation_1_and_n_halves_cover_norm_ablation():
    """docs/results/norm_ablation_1.yaml is norm_ablation's workload, budget, rules and seeds on
    every family at alpha_init 1.0 (the sphere step init of docs/results.md §0b), with its own
    A1 and A2; with the nGPT half it covers the whole grid, Pre-LN in both."""

    from orchestrator.sweep.space import grid_trials

    one, full = _half_of_norm_ablation("norm_ablation_1", ("A1", "A2"))
    n, _ = _half_of_norm_ablation("norm_ablation_n", ("A1n", "A2n"))
    key = lambda t: tuple(sorted(t.items()))  # noqa: E731
    part = {key(t) for t in grid_trials(one)}
    whole = {key(t) for t in grid_trials(full)}
    assert part == {key(t) for t in grid_trials(full)
                    if t.get("model.residual.alpha_init", 1.0) == 1.0}
    assert len(part) == 231
    assert part | {key(t) for t in grid_trials(n)} == whole
