"""``geosweep search-p``: find the best p (and its lr) automatically, with a confidence interval.

Stage 1 (search): the spec's Optuna search (TPE, or GP) over log p in [0.25, 64] plus p = inf
and log lr, with the spec's scheduler (ASHA). The Optuna study lives in
``<sweep dir>/optuna.db`` (SQLite, study name = sweep name), handed to Ray's ``OptunaSearch``
through ``build_search(spec, storage=..., study_name=...)``: every ask/report/tell goes to the
RDB as it happens, so ``optuna-dashboard sqlite:///<sweep dir>/optuna.db`` shows it live and
an interrupted search resumes (Tune restores the searcher, whose study is the same RDB study).
Diverged trials are told their penalty value (``orchestrator.sweep.divergence.penalty_value``) as a
COMPLETE observation with the violated Optuna constraint ``diverged``, ASHA-stopped trials are
PRUNED and failed ones FAIL (``orchestrator.sweep.optuna_search``), so the sampler learns where
(p, lr) is unstable and the study shows what happened.

Stage 2 (confirmation): the top-k distinct configurations of stage 1 (completed trials by
lowest final validation loss, then ASHA-stopped ones by rung reached) are rerun at the full
budget with ``confirm_seeds`` fresh seeds (seeds not used in stage 1: the stage-1 winner's own
seed would carry its selection bias).
A grid spec cannot pair values of two keys (its space is a product), so each configuration is
one grid sweep ``<name>-confirm-<rank>`` whose workload overrides fix (p, lr) and whose seeds
are the repeats; all of them log into stage 1's MLflow store and Parquet root.

Output: the best p with a 95% t-interval of the final validation loss over the confirmation
seeds, the runners-up, the answer (``analysis.search_p.answer``: the best finite p +- the
range of p within noise of it, and whether p = inf is within noise of it, Welch), the response
curve (``response_curve.png``: best-lr val loss vs p with CIs), a divergence map
(``divergence_map.png``) and Optuna's parameter importances, printed and written to
``<sweep dir>/search_p.{md,json}``. Confirmation takes the top-k *distinct* p values
(``select_top_k``), plus p = inf when stage 1 has it, each at its best lr.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.analysis.search_p import (
    answer,
    divergence_map,
    jsonable,
    render_markdown,
    response_curve,
)
from orchestrator.spec.params import P_KEY
from orchestrator.spec.sweep_spec import SpecError, SweepSpec
from orchestrator.spec.yaml_reader import spec_from_dict
from orchestrator.sweep.search_p_obs import (
    LR_KEY,
    observations,
    p_bucket,
    params_from_optuna,
    select_top_k,
    summarize,
    trial_steps,
)
from orchestrator.sweep.space import AXIS, PREFIX, SPECIAL

__all__ = ["P_KEY", "LR_KEY", "SAMPLERS", "SearchPError", "SearchPResult", "search_p",
           "stage1_spec", "confirm_specs", "observations", "params_from_optuna", "select_top_k",
           "p_bucket",
           "summarize", "param_importances", "divergence_map", "render_markdown",
           "storage_url", "trial_steps"]

SAMPLERS = {"tpe": "optuna-tpe", "gp": "optuna-gp"}
MIN_IMPORTANCE_TRIALS = 3


class SearchPError(ValueError):
    """A user-facing search-p problem: one line."""


@dataclass
class SearchPResult:
    best: dict[str, Any] | None
    runners_up: list[dict[str, Any]]
    importances: dict[str, float] | None
    importance_note: str
    stage1: list[dict[str, Any]]  # observations (see ``observations``)
    confirm: list[dict[str, Any]]
    files: dict[str, str] = field(default_factory=dict)
    trial_steps: dict[str, int] = field(default_factory=dict)
    answer: dict[str, Any] = field(default_factory=dict)  # analysis.search_p.answer


# --- specs ---------------------------------------------------------------------------------


def _as_dict(spec: SweepSpec) -> dict[str, Any]:
    return yaml.safe_load(spec.to_yaml())  # the documented lossless round trip


def stage1_spec(spec: SweepSpec, sampler: str | None = None) -> SweepSpec:
    """``spec`` with ``search.algorithm`` set by ``sampler`` (tpe | gp), re-validated.

    ``None``: the spec's own Optuna sampler, TPE when the spec names none."""
    if sampler is None:
        own = {v: k for k, v in SAMPLERS.items()}
        sampler = own.get(spec.search.algorithm, "tpe")
    if sampler not in SAMPLERS:
        raise SearchPError(f"sampler: {sampler!r} is not valid; valid: {', '.join(SAMPLERS)}")
    if P_KEY not in spec.space:
        raise SearchPError(f"space: search-p searches {P_KEY}, which spec {spec.name!r} does not "
                           f"have; its keys: {', '.join(spec.space) or '-'}")
    d = _as_dict(spec)
    d["search"]["algorithm"] = SAMPLERS[sampler]
    try:
        return spec_from_dict(d)
    except SpecError as e:
        raise SearchPError(str(e)) from None


def confirm_specs(spec: SweepSpec, configs: list[dict[str, Any]], n_seeds: int,
                  mlflow_uri: str | None = None,
                  parquet_root: str | None = None) -> list[SweepSpec]:
    """One full-budget grid sweep per configuration: overrides fix it, seeds repeat it."""
    if n_seeds < 2:
        raise SearchPError(f"confirm_seeds: a confidence interval needs >= 2 seeds, got {n_seeds}")
    first = max(spec.seeds) + 1  # fresh seeds: see the module docstring
    base = _as_dict(spec)
    out = []
    for rank, params in enumerate(configs, 1):
        d = {k: base[k] for k in ("workload", "divergence", "budget", "resources")}
        d["workload"]["overrides"] = {**base["workload"].get("overrides", {}), **params}
        d.update(name=f"{spec.name[:52]}-confirm-{rank}", space={},
                 description=f"search-p confirmation {rank}: {spec.arm_label(params)}",
                 seeds=list(range(first, first + n_seeds)),
                 search={"algorithm": "grid", "max_concurrent": spec.search.max_concurrent,
                         "metric": spec.search.metric, "mode": spec.search.mode},
                 scheduler={"type": "none"},
                 tracking={"mlflow_uri": mlflow_uri, "parquet_root": parquet_root})
        try:
            out.append(spec_from_dict(d))
        except SpecError as e:
            raise SearchPError(f"confirmation of {spec.arm_label(params)}: {e}") from None
    return out


def storage_url(root: Path) -> str:
    return f"sqlite:///{Path(root).resolve() / 'optuna.db'}"


# --- importances and the divergence map ----------------------------------------------------


def param_importances(study: Any) -> tuple[dict[str, float] | None, str]:
    """Optuna's fANOVA importances keyed by dotted config keys, or ``None`` and the reason.

    ``trial/<key>`` and its ``trial/<key>:special`` switch (``inf`` or a finite value) are
    both parts of the choice of ``<key>``: their importances are summed (an ``:axis`` param is
    ``<key>`` itself).
    """
    import optuna
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < MIN_IMPORTANCE_TRIALS:
        return None, (f"parameter importances need >= {MIN_IMPORTANCE_TRIALS} finished "
                      f"trials; the study has {len(done)}")
    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)  # deterministic
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "few trials per regime": the note says n
            raw = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except (ValueError, RuntimeError) as e:
        return None, f"parameter importances unavailable: {' '.join(str(e).split())}"
    if not raw:
        return None, "parameter importances unavailable: no parameter is shared by all trials"
    merged: dict[str, float] = {}
    pre = PREFIX + "/"
    for name, v in raw.items():
        key = name.removeprefix(pre).removesuffix(SPECIAL).removesuffix(AXIS)
        merged[key] = merged.get(key, 0.0) + float(v)
    return dict(sorted(merged.items(), key=lambda kv: -kv[1])), (
        f"fANOVA over {len(done)} finished trials (p's inf switch counted with p)")


# --- running it ----------------------------------------------------------------------------


def _run_stage1(spec: SweepSpec, out: Path, address: str | None, resume: bool,
                printer: Callable[[str], None], storage: str) -> Any:
    """``run_sweep`` of stage 1; its Optuna study lives in ``<sweep dir>/optuna.db``."""
    from orchestrator.store.layout import sweep_paths
    from orchestrator.sweep.tuner import run_sweep

    assert storage == storage_url(sweep_paths(spec, out).root), storage
    return _not_interrupted(run_sweep(spec, out, address=address, resume=resume,
                                      printer=printer))


def _not_interrupted(result: Any) -> Any:
    """Ctrl-C in a stage ends the search (the sweep's parent run is KILLED already)."""
    if result.interrupted:
        from orchestrator.sweep.interrupt import SweepInterrupted

        raise SweepInterrupted(result.paths.root)
    return result


def _trial_rows(result: Any, name: str) -> list[dict[str, Any]]:
    """Parquet's trial table (every session of a resumed sweep), else this session's records."""
    from orchestrator.store.parquet import read_trials

    try:
        df = read_trials(result.paths.parquet_root, sweep=name)
    except (OSError, ValueError, KeyError):
        return result.records
    return df.to_dict("records") if len(df) else result.records


def search_p(spec: SweepSpec, out: str | os.PathLike = "geosweep-runs",
             address: str | None = None, top_k: int = 3, confirm_seeds: int = 3,
             sampler: str | None = None, resume: bool = False,
             printer: Callable[[str], None] = print) -> SearchPResult:
    """Stage 1 (Optuna search, RDB study) then stage 2 (top-k x seeds); writes the report.

    ``sampler``: tpe | gp, or ``None`` for the spec's own. ``resume``: continue the search in
    ``<out>/<name>`` (its Tune state and Optuna study); without it an existing study is an error.
    """
    from orchestrator.store.layout import sweep_paths
    from orchestrator.sweep.tuner import run_sweep

    if top_k < 1:
        raise SearchPError(f"top_k: must be >= 1, got {top_k}")
    s1 = stage1_spec(spec, sampler)
    confirm_specs(s1, [], confirm_seeds)  # checks confirm_seeds before anything runs
    root = sweep_paths(s1, out).root
    db = root / "optuna.db"
    if db.exists() and not resume:
        raise SearchPError(f"{db} already exists: resume the search or start a new folder")
    url = storage_url(root)
    lr0 = s1.base_config().optim.lr

    # --- stage 1: the search ----------------------------------------------------------------
    printer(f"[search-p] stage 1: {s1.search.num_samples} trials by {s1.search.algorithm}, "
            f"scheduler {s1.scheduler.type}; study {url}")
    r1 = _run_stage1(s1, Path(out), address, resume, printer, url)
    obs1 = observations(_trial_rows(r1, s1.name), list(s1.space), lr0)
    configs = select_top_k(obs1, top_k)

    # --- stage 2: confirmation ----------------------------------------------------------------
    specs = confirm_specs(s1, configs, confirm_seeds, r1.paths.mlflow_uri, r1.paths.parquet_root)
    obs2: list[dict[str, Any]] = []
    for cs, params in zip(specs, configs):
        printer(f"[search-p] stage 2: {cs.name} = {s1.arm_label(params)} x {confirm_seeds} seeds")
        again = resume and (root / "confirm" / cs.name).exists()
        r = _not_interrupted(run_sweep(cs, root / "confirm", address=address, resume=again,
                                       printer=printer))
        for o in observations(_trial_rows(r, cs.name), [], lr0):
            o.update(params=dict(params), p=params.get(P_KEY), lr=params.get(LR_KEY, lr0))
            obs2.append(o)
    rows = summarize(configs, obs2, lr0)

    return _report(s1, root, url, configs, confirm_seeds, obs1, obs2, rows, printer)


def _report(s1: SweepSpec, root: Path, url: str, configs: list[dict[str, Any]],
            confirm_seeds: int, obs1: list[dict[str, Any]], obs2: list[dict[str, Any]],
            rows: list[dict[str, Any]], printer: Callable[[str], None]) -> SearchPResult:
    """Importances, the divergence map, search_p.md and search_p.json in ``root``."""
    import optuna

    db = root / "optuna.db"
    study = optuna.load_study(study_name=s1.name, storage=url)
    imps, note = param_importances(study)
    map_path = divergence_map(obs1, root / "divergence_map.png")
    best = rows[0] if rows and rows[0]["n"] else None
    res = SearchPResult(best=best, runners_up=rows[1:] if best else rows, importances=imps,
                        importance_note=note, stage1=obs1, confirm=obs2,
                        trial_steps={"stage1": trial_steps(obs1), "confirm": trial_steps(obs2)})
    res.answer = answer(rows)
    curve = response_curve(rows, root / "response_curve.png")
    res.files = {"markdown": str(root / "search_p.md"), "json": str(root / "search_p.json"),
                 "divergence_map": str(map_path), "response_curve": str(curve),
                 "optuna_db": str(db)}
    counts: dict[str, int] = {}
    for o in obs1:
        counts[o["status"]] = counts.get(o["status"], 0) + 1
    notes = [f"Stage 1: {len(obs1)} trials by {s1.search.algorithm} with scheduler "
             f"{s1.scheduler.type} ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}),"
             f" {res.trial_steps['stage1']} trial-steps. Optuna study: "
             f"`optuna-dashboard {url}`.",
             f"Stage 2: top {len(configs)} configurations x {confirm_seeds} fresh seeds at the "
             f"full budget ({s1.base_config().train.steps} steps), "
             f"{res.trial_steps['confirm']} trial-steps. CIs: 95% t-interval over completed "
             "seeds of the final validation loss."]
    text = render_markdown(s1.name, res, notes)
    Path(res.files["markdown"]).write_text(text)
    payload = {"name": s1.name, "algorithm": s1.search.algorithm, "best": best,
               "answer": res.answer,
               "runners_up": res.runners_up, "importances": imps, "importance_note": note,
               "trial_steps": res.trial_steps,
               "stage1": obs1, "confirm": obs2, "files": res.files, "study": url,
               "study_name": s1.name}
    Path(res.files["json"]).write_text(json.dumps(jsonable(payload), indent=2))
    printer(text)
    return res
