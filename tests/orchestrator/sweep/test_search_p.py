"""search-p: the search on a planted objective (no Ray), the top-k/CI summary, the report
pieces, and one tiny real search end to end (slow, real Ray)."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats as st

from orchestrator.analysis.stats import t_interval
from orchestrator.spec.divergence_rules import DivergenceRules
from orchestrator.spec.yaml_reader import load_spec, spec_from_dict
from orchestrator.sweep.divergence import penalty_value
from orchestrator.sweep.search_p import (
    LR_KEY,
    P_KEY,
    SearchPError,
    SearchPResult,
    confirm_specs,
    divergence_map,
    observations,
    p_bucket,
    param_importances,
    params_from_optuna,
    render_markdown,
    select_top_k,
    stage1_spec,
    summarize,
)
from orchestrator.sweep.space import _sampler, define_by_run

optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)

P_STAR, LR_STAR, INITIAL = 4.0, 3e-3, 4.2
RULES = DivergenceRules()


def planted(p: float, lr: float) -> tuple[float, bool]:
    """(final val loss, diverged): a bowl in (log p, log lr) at (4, 3e-3); p = inf sits past 64.

    Divergence is planted at lr > 0.02 everywhere and at lr > 0.005 for p < 0.5."""
    diverged = lr > 0.02 or (p < 0.5 and lr > 0.005)
    lp = math.log(64.0) + 0.8 if math.isinf(p) else math.log(p)
    loss = 1.5 + 0.25 * (lp - math.log(P_STAR)) ** 2 + 0.15 * (math.log(lr / LR_STAR)) ** 2
    return loss, diverged


def _spec(n: int, sampler: str = "tpe"):
    d = yaml.safe_load(stage1_spec(load_spec("spheret_p_search"), sampler).to_yaml())
    d["search"]["num_samples"] = n
    return spec_from_dict(d)


def drive(spec, n: int):
    """What Ray's OptunaSearch does, by ask/tell: the spec's define-by-run space, the sampler
    build_search uses, the worker's penalty for a diverged trial. Returns (study, records)."""
    study = optuna.create_study(direction="minimize", sampler=_sampler(spec))
    space = define_by_run(spec)
    records = []
    for i in range(n):
        trial = study.ask()
        space(trial)
        flat = params_from_optuna(trial.params, spec.space)
        loss, diverged = planted(flat[P_KEY], flat[LR_KEY])
        value = penalty_value(RULES, INITIAL, None) if diverged else loss
        study.tell(trial, value)
        records.append({"trial": f"t{i:02d}", "status": "diverged" if diverged else "completed",
                        "params": {**flat, "train.seed": 0}, "seed": 0, "objective": value,
                        "final_val_loss": math.nan if diverged else loss,
                        "last_step": 7 if diverged else 100})
    return study, records


@pytest.fixture(scope="module")
def searched():
    spec = _spec(40)
    study, records = drive(spec, 40)
    return spec, study, records, observations(records, list(spec.space), 1e-3)


# --- the search on the planted objective -----------------------------------------------------


def test_finds_planted_optimum(searched):
    _, study, _, obs = searched
    best = min((o for o in obs if o["status"] == "completed"), key=lambda o: o["loss"])
    assert math.isfinite(best["p"]) and abs(math.log2(best["p"] / P_STAR)) <= 1.0, best
    assert abs(math.log10(best["lr"] / LR_STAR)) <= 0.5, best
    assert best["loss"] < 1.5 + 0.1
    assert study.best_value == pytest.approx(best["loss"])


def test_planted_divergences_are_observations(searched):
    spec, study, records, obs = searched
    planted_div = [o for o in obs if planted(o["p"], o["lr"])[1]]
    assert planted_div, "the start-up trials must hit the planted region"
    assert {o["trial"] for o in planted_div} == {o["trial"] for o in obs
                                                  if o["status"] == "diverged"}
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 40  # nothing dropped
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)  # nothing pruned
    told = [t.value for t in trials if planted(*[params_from_optuna(t.params, spec.space)[k]
                                                  for k in (P_KEY, LR_KEY)])[1]]
    assert told == [INITIAL] * len(planted_div)  # the penalty, the untrained loss
    # informative: after the random start-up, the sampler steers away from the region
    first, second = ([planted(o["p"], o["lr"])[1] for o in obs[:20]],
                     [planted(o["p"], o["lr"])[1] for o in obs[20:]])
    assert sum(second) < sum(first)


def test_top_k_and_confidence_intervals(searched):
    _, _, records, obs = searched
    dup = dict(records[0], trial="dup")  # the same configuration twice counts once
    obs2 = observations([*records, dup], [P_KEY, LR_KEY], 1e-3)
    top = select_top_k(obs2, 3, with_inf=False)
    done = sorted((o for o in obs2 if o["status"] == "completed"), key=lambda o: o["loss"])
    assert len(top) == 3 and len({tuple(sorted(t.items())) for t in top}) == 3
    assert top[0] == done[0]["params"]
    assert "train.seed" not in top[0]
    # confirmation: 3 seeds per configuration, one seed of the second diverged
    rng = np.random.default_rng(0)
    conf = []
    for rank, params in enumerate(top):
        for s in range(3):
            diverged = rank == 1 and s == 2
            conf.append({"params": params, "p": params[P_KEY], "lr": params[LR_KEY],
                         "status": "diverged" if diverged else "completed", "steps": 100,
                         "loss": None if diverged else 2.0 + 0.1 * rank + rng.normal(0, 0.05)})
    rows = summarize(top, conf)
    assert [r["params"] for r in rows] == top  # sorted by mean (planted increasing)
    for r in rows:
        x = np.array(r["losses"])
        half = st.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
        assert r["mean"] == pytest.approx(x.mean())
        assert (r["lo"], r["hi"]) == pytest.approx((x.mean() - half, x.mean() + half))
    assert (rows[1]["n"], rows[1]["n_diverged"], rows[0]["n"]) == (2, 1, 3)


def test_top_k_fills_with_asha_stopped_trials_by_rung():
    def rec(t, status, p, loss, step):
        return {"trial": t, "status": status, "params": {P_KEY: p, LR_KEY: 1e-3},
                "final_val_loss": loss, "last_step": step}

    obs = observations([rec("a", "stopped", 1.0, 3.0, 10), rec("b", "completed", 2.0, 3.5, 90),
                        rec("c", "stopped", 4.0, 3.2, 30), rec("d", "diverged", 8.0, 0.1, 5),
                        rec("e", "stopped", 16.0, 3.1, 30)], [P_KEY, LR_KEY])
    assert [c[P_KEY] for c in select_top_k(obs, 3)] == [2.0, 16.0, 4.0]
    assert [c[P_KEY] for c in select_top_k(obs, 9)] == [2.0, 16.0, 4.0, 1.0]  # never diverged


def test_top_k_takes_distinct_p_each_at_its_best_lr_and_adds_inf():
    def rec(t, p, lr, loss, status="completed"):
        return {"trial": t, "status": status, "params": {P_KEY: p, LR_KEY: lr},
                "final_val_loss": loss, "last_step": 100}

    obs = observations([rec("a", math.inf, 1e-3, 2.0), rec("b", math.inf, 3e-3, 2.1),
                        rec("c", 4.0, 1e-3, 2.2), rec("d", 4.1, 3e-3, 2.15),  # same bucket
                        rec("e", 1.0, 1e-3, 2.5), rec("f", 16.0, 1e-3, 2.4),
                        rec("g", 0.5, 1e-3, 2.6, "stopped")], [P_KEY, LR_KEY])
    top = select_top_k(obs, 3)
    assert [(c[P_KEY], c[LR_KEY]) for c in top] == [(math.inf, 1e-3), (4.1, 3e-3), (16.0, 1e-3)]
    # inf not among the top k: appended at its best lr, so the answer can compare it
    late = observations([rec("x", 8.0, 1e-3, 2.0), rec("y", 4.0, 1e-3, 2.1),
                         rec("z", math.inf, 3e-3, 3.0), rec("w", math.inf, 1e-3, 3.5)],
                        [P_KEY, LR_KEY])
    assert [(c[P_KEY], c[LR_KEY]) for c in select_top_k(late, 2)] == [
        (8.0, 1e-3), (4.0, 1e-3), (math.inf, 3e-3)]
    assert [c[P_KEY] for c in select_top_k(late, 2, with_inf=False)] == [8.0, 4.0]
    # only inf made the top k: the best finite p is appended
    assert [c[P_KEY] for c in select_top_k(obs, 1)] == [math.inf, 4.1]
    assert p_bucket(4.0) == p_bucket(4.1) == 2.0 and p_bucket(math.inf) == "inf"
    assert p_bucket(2.9) == 1.5


def test_answer_says_best_finite_p_and_whether_inf_is_within_noise(tmp_path):
    from orchestrator.analysis.search_p import answer, response_curve

    def row(p, losses):
        m, lo, hi = t_interval(losses)
        return {"p": p, "lr": 1e-3, "mean": m, "lo": lo, "hi": hi, "n": len(losses),
                "losses": losses}

    rows = [row(4.0, [2.00, 2.02, 1.98]), row(8.0, [2.01, 2.05, 1.99]),
            row(1.0, [2.50, 2.52, 2.48]), row(math.inf, [2.03, 1.97, 2.04])]
    a = answer(rows)
    assert a["best_finite"]["p"] == 4.0 and a["best_finite"]["mean"] == pytest.approx(2.0)
    assert a["p_range"] == [4.0, 8.0]  # p = 1 is separated (Welch p << 0.05)
    assert a["inf"]["within_noise"] is True
    assert a["inf"]["diff"] == pytest.approx(np.mean([2.03, 1.97, 2.04]) - 2.0)
    assert st.ttest_ind([2.03, 1.97, 2.04], [2.00, 2.02, 1.98],
                        equal_var=False).pvalue == pytest.approx(a["inf"]["welch_p"])
    far = answer([*rows[:3], row(math.inf, [2.9, 2.95, 2.92])])
    assert far["inf"]["within_noise"] is False and far["inf"]["diff"] > 0.8
    assert answer([row(math.inf, [2.0])])["best_finite"] is None
    path = response_curve(rows, tmp_path / "curve.png")
    assert path.stat().st_size > 10_000


def test_importances_are_dotted_keys(searched):
    _, study, _, _ = searched
    imps, note = param_importances(study)
    assert imps is not None, note
    assert set(imps) <= {P_KEY, LR_KEY} and LR_KEY in imps
    assert sum(imps.values()) == pytest.approx(1.0)
    few = optuna.create_study()
    few.add_trial(optuna.trial.create_trial(
        params={"trial/optim.lr": 1e-3}, value=1.0,
        distributions={"trial/optim.lr": optuna.distributions.FloatDistribution(1e-4, 1e-1)}))
    imps, note = param_importances(few)
    assert imps is None and ">= 3" in note and "has 1" in note


def test_gp_sampler_drives_the_same_space():
    spec = _spec(6, "gp")
    assert spec.search.algorithm == "optuna-gp"
    assert stage1_spec(spec).search.algorithm == "optuna-gp"  # None keeps the spec's sampler
    study, records = drive(spec, 6)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert len(study.trials) == 6
    for r in records:
        p = r["params"][P_KEY]
        assert p == math.inf or 0.25 <= p <= 64
        assert 3e-4 <= r["params"][LR_KEY] <= 1e-1


# --- specs and the report ----------------------------------------------------------------------


def test_confirm_specs_fix_params_with_fresh_seeds():
    spec = _spec(24)
    configs = [{P_KEY: 4.0, LR_KEY: 2e-3}, {P_KEY: math.inf, LR_KEY: 1e-3}]
    specs = confirm_specs(spec, configs, 3, "sqlite:///x.db", "/tmp/pq")
    assert [s.name for s in specs] == ["spheret_p_search-confirm-1", "spheret_p_search-confirm-2"]
    for s, c in zip(specs, configs):
        assert s.search.algorithm == "grid" and s.scheduler.type == "none"
        assert s.seeds == [1, 2, 3] and not set(s.seeds) & set(spec.seeds)
        cfg = s.trial_config({"train.seed": 1})
        assert cfg.model.residual["p"] == c[P_KEY] and cfg.optim.lr == c[LR_KEY]
        assert cfg.model.residual["family"] == "spheret"
        assert cfg.train.steps == spec.base_config().train.steps  # the full budget
        assert s.tracking.parquet_root == "/tmp/pq"
    with pytest.raises(SearchPError, match="confirm_seeds"):
        confirm_specs(spec, configs, 1)
    with pytest.raises(SearchPError, match="sampler"):
        stage1_spec(spec, "cmaes")
    with pytest.raises(SearchPError, match=f"space: search-p searches {P_KEY}"):
        d = yaml.safe_load(spec.to_yaml())
        d["space"] = {LR_KEY: d["space"][LR_KEY]}
        stage1_spec(spec_from_dict(d))


def test_observations_from_parquet_rows():
    rows = [{"trial": "a", "status": "completed", P_KEY: math.inf, LR_KEY: 1e-3,
             "train.seed": 0, "final_val_loss": 2.5, "last_step": 40, "objective": 2.5},
            {"trial": "b", "status": "stopped", P_KEY: 2.0, LR_KEY: float("nan"),
             "final_val_loss": 3.0, "last_step": 10, "objective": 3.0}]
    a, b = observations(rows, [P_KEY, LR_KEY], default_lr=7e-4)
    assert a["params"] == {P_KEY: math.inf, LR_KEY: 1e-3} and a["steps"] == 40
    assert b["params"] == {P_KEY: 2.0} and b["lr"] == 7e-4  # absent column -> the base lr


def test_divergence_map_and_markdown(searched, tmp_path):
    spec, _, _, obs = searched
    obs = obs + [{**obs[0], "p": math.inf, "trial": "inf"}]
    path = divergence_map(obs, tmp_path / "map.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    row = {"p": 4.0, "lr": 3e-3, "params": {}, "mean": 1.6, "lo": 1.5, "hi": 1.7, "n": 3,
           "n_diverged": 0, "n_runs": 3, "losses": [1.5, 1.6, 1.7]}
    res = SearchPResult(best=row, runners_up=[dict(row, p=math.inf, mean=1.9)],
                        importances={P_KEY: 0.7, LR_KEY: 0.3}, importance_note="fANOVA",
                        stage1=obs, confirm=[])
    text = render_markdown("x", res, ["note"])
    n_div = sum(o["status"] == "diverged" for o in obs)
    assert "**Best p = 4** (lr 0.003)" in text and "[1.5000, 1.7000]" in text
    assert f"{n_div} of {len(obs)} search trials diverged" in text
    assert "| 2 | inf |" in text and f"| {P_KEY} | 0.700 |" in text


def test_cli_user_errors_are_one_line(tmp_path, capsys):
    from orchestrator.cli.search_p import main

    no_p = tmp_path / "no_p.yaml"
    no_p.write_text(TINY.replace("  model.residual.p: {loguniform: [0.25, 64], also: [inf]}\n",
                                 ""))
    cases = [(["nosuch"], "'nosuch' is neither a file nor a shipped spec"),
             (["--confirm-seeds", "1"], "--confirm-seeds must be >= 2, got 1"),
             (["--sampler", "cmaes"], "invalid choice: 'cmaes'"),
             ([str(no_p)], f"space: search-p searches {P_KEY}"),
             (["--resume", "--overwrite"], "--resume and --overwrite are mutually exclusive")]
    for argv, msg in cases:
        assert main([*argv, "--out", str(tmp_path / "o")]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert msg in err[-1], (argv, err)
    assert not (tmp_path / "o").exists()  # nothing written, nothing started


# --- a real, tiny search-p (Ray) ---------------------------------------------------------------

TINY = """
name: tinyp
workload:
  preset: gpt-debug
  overrides: {model.residual.family: spheret, optim.warmup_steps: 0}
space:
  model.residual.p: {loguniform: [0.25, 64], also: [inf]}
  optim.lr: {loguniform: [1.0e-3, 3.0]}
seeds: [0]
search: {algorithm: optuna-tpe, num_samples: 4, max_concurrent: 2, seed: 3}
scheduler: {type: asha, grace_period: 4, reduction_factor: 2, max_t: 12}
divergence: {warmup_steps: 2}
budget: {steps: 12, eval_every: 4, metrics_every: 0}
resources: {workers_per_trial: 1, cpus_per_worker: 1}
"""


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_search_p_end_to_end(tmp_path):
    spec = tmp_path / "tinyp.yaml"
    spec.write_text(textwrap.dedent(TINY))
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "orchestrator.cli.search_p", str(spec), "--out",
           str(tmp_path / "out"), "--top-k", "2", "--confirm-seeds", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=840, env=env,
                          cwd=Path(__file__).parents[3])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    root = tmp_path / "out" / "tinyp"
    for f in ("search_p.md", "search_p.json", "divergence_map.png", "response_curve.png",
              "optuna.db"):
        assert (root / f).stat().st_size > 0, f
    with sqlite3.connect(root / "optuna.db") as db:
        states = [s for (s,) in db.execute("select state from trials")]
        names = {n for (n,) in db.execute("select distinct param_name from trial_params")}
    # ASHA-stopped trials are PRUNED in the study (issue 17 §2), completed ones COMPLETE
    assert len(states) == 4 and set(states) <= {"COMPLETE", "PRUNED"}, states
    s1 = {o["trial"]: o["status"] for o in json.loads((root / "search_p.json").read_text())
          ["stage1"]}
    assert states.count("PRUNED") == sum(v == "stopped" for v in s1.values()), (states, s1)
    with sqlite3.connect(root / "optuna.db") as db:  # diverged trials violate the constraint
        violated = db.execute("select count(*) from trial_system_attributes where key = "
                              "'constraints:diverged' and value_json = '1.0'").fetchone()[0]
    assert violated == sum(v == "diverged" for v in s1.values()), s1
    assert "trial/optim.lr" in names and f"trial/{P_KEY}:axis" in names
    res = json.loads((root / "search_p.json").read_text())
    best = res["best"]
    assert best["n"] + best["n_diverged"] == 2 and best["n"] >= 1
    assert best["p"] == "inf" or 0.25 <= best["p"] <= 64
    if best["n"] == 2:
        assert best["lo"] <= best["mean"] <= best["hi"]
        assert np.mean(best["losses"]) == pytest.approx(best["mean"])
    # confirmation: distinct p values (plus inf or a finite p when only the other made it)
    confirmed = [r["p"] for r in [best, *res["runners_up"]]]
    buckets = [p if p == "inf" else round(math.log2(p) * 2) / 2 for p in confirmed]
    assert len(set(buckets)) == len(buckets) and 2 <= len(buckets) <= 3, confirmed
    assert len(res["stage1"]) == 4 and len(res["confirm"]) == 2 * len(confirmed)
    assert res["trial_steps"]["confirm"] <= 2 * len(confirmed) * 12
    ans = res["answer"]
    assert set(ans) == {"best_finite", "p_range", "inf", "alpha"}
    if ans["best_finite"] is not None:
        bf = ans["best_finite"]
        assert bf["p"] in confirmed and bf["p"] != "inf"
        assert ans["p_range"][0] <= bf["p"] <= ans["p_range"][1]
    if ans["inf"] is not None and ans["best_finite"] is not None:
        assert ans["inf"]["within_noise"] in (True, False, None)
    assert "Best finite p =" in proc.stdout or ans["best_finite"] is None
    assert all(o["seed"] in (1, 2) for o in res["confirm"])
    assert "Best p =" in proc.stdout and "Parameter importances" in proc.stdout
    # the same folder again without --resume is refused with one line
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env,
                           cwd=Path(__file__).parents[3])
    assert again.returncode == 2 and "already exists" in again.stderr


def test_study_lives_in_the_rdb_and_survives_a_searcher_restore(tmp_path):
    """build_search's OptunaSearch writes to the RDB study as it asks/tells, and the pickled
    searcher (what Tune checkpoints and restores on resume) keeps writing to the same study."""
    from orchestrator.sweep.search_p import storage_url
    from orchestrator.sweep.space import build_search

    spec = _spec(6)
    url = storage_url(tmp_path)
    _, limiter, n = build_search(spec, storage=url, study_name=spec.name)
    searcher = limiter.searcher
    assert n == 6
    for i, value in enumerate([3.0, INITIAL]):
        cfg = searcher.suggest(f"t{i}")
        assert set(cfg["trial"]) >= {"train.seed", f"{P_KEY}:axis", P_KEY, LR_KEY}
        searcher.on_trial_complete(f"t{i}", {"objective": value})
    searcher.save(str(tmp_path / "searcher.pkl"))
    _, again, _ = build_search(spec, storage=url, study_name=spec.name)
    again.searcher.restore(str(tmp_path / "searcher.pkl"))
    again.searcher.suggest("t2")
    again.searcher.on_trial_complete("t2", {"objective": 2.5})
    study = optuna.load_study(study_name=spec.name, storage=url)
    assert [t.value for t in study.trials] == [3.0, INITIAL, 2.5]
    assert (tmp_path / "optuna.db").stat().st_size > 0


def test_study_states_tell_the_truth(tmp_path):
    """Completed -> COMPLETE (feasible), diverged -> COMPLETE with the violated constraint
    ``diverged`` and its penalty value, ASHA-stopped (last status running) -> PRUNED, error ->
    FAIL (issue 17 §2). Driven through the real searcher build_search hands to Tune."""
    from orchestrator.sweep.search_p import storage_url
    from orchestrator.sweep.space import build_search
    from orchestrator.sweep.writer import flush_all

    spec = _spec(6)
    url = storage_url(tmp_path)
    _, limiter, _ = build_search(spec, storage=url, study_name=spec.name)
    searcher = limiter.searcher
    ends = [({"objective": 3.0, "_status": "completed"}, False),
            ({"objective": INITIAL, "_status": "diverged"}, False),
            ({"objective": 4.0, "_status": "running"}, False),
            ({"objective": 4.5, "_status": "running"}, True)]
    for i, (result, error) in enumerate(ends):
        searcher.suggest(f"t{i}")
        searcher.on_trial_result(f"t{i}", {**result, "training_iteration": 1})
        searcher.on_trial_complete(f"t{i}", result, error=error)
    searcher.on_trial_complete("t0", ends[0][0])  # a second completion changes nothing
    flush_all()  # the study's writes reach optuna.db on a writer thread (sweep/study_mirror.py)
    study = optuna.load_study(study_name=spec.name, storage=url)
    S = optuna.trial.TrialState
    assert [t.state for t in study.trials] == [S.COMPLETE, S.COMPLETE, S.PRUNED, S.FAIL]
    assert [t.value for t in study.trials[:2]] == [3.0, INITIAL]
    assert study.trials[0].constraints == {"diverged": 0.0}
    assert study.trials[1].constraints == {"diverged": 1.0}
    assert study.trials[2].intermediate_values == {1: 4.0}
    assert study.best_trial.number == 0  # the infeasible diverged trial is never the best


def test_divergence_boundary_separates_planted_regions():
    from orchestrator.analysis.search_p import divergence_boundary

    obs = []
    for lp in range(-2, 7):
        for llr in (-4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0):
            lr = 10.0 ** llr
            diverged = llr > -2.0 + 0.1 * lp  # the planted boundary: stabler at larger p
            obs.append({"p": 2.0 ** lp, "lr": lr, "status": "diverged" if diverged
                        else "completed"})
    fit = divergence_boundary(obs, c=100.0)
    b0, bp, blr = fit["b0"], fit["b_p"], fit["b_lr"]
    assert blr > 0 and bp < 0  # higher lr diverges, larger p is stabler
    for o in obs:  # the fitted P = 1/2 line classifies every planted trial
        z = b0 + bp * math.log2(o["p"]) + blr * math.log10(o["lr"])
        assert (z > 0) == (o["status"] == "diverged"), o
    assert divergence_boundary(obs[:3]) is None
    assert divergence_boundary([dict(o, status="completed") for o in obs]) is None
