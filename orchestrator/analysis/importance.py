"""Parameter importance of a sweep with Optuna's evaluators: fANOVA for a study of at most
``FANOVA_MAX_TRIALS`` completed trials, PED-ANOVA above (fANOVA costs minutes there).

Two sources, the first that works:
1. the sweep's own Optuna study (``<sweep>/optuna.db``, study named as the sweep), what the
   sampler saw: Optuna searches keep it (orchestrator/sweep/tuner.py);
2. otherwise (grid and random searches) a study rebuilt in memory from the trials table:
   one ``FrozenTrial`` per completed trial with its searched params and its objective.

Rebuilt distributions: a numeric param is a ``FloatDistribution`` (log when positive and
spanning at least 10x); ``inf`` (p = inf, GeoNorm) cannot sit on a float axis, so such a
column becomes categorical over its distinct values (quantile bins of the finite values,
with ``inf`` and ``absent`` kept, past ``MAX_LEVELS`` levels), as is any non-numeric param. A
conditional param (absent from some trials) gets the category ``absent`` when categorical;
a numeric one is left out (fANOVA needs every param on every trial) and the note says so.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.analysis.leaderboard import rank_value, searched_params

__all__ = ["param_importance", "study_from_trials", "MIN_TRIALS"]

MIN_TRIALS = 3
_PREFIX, _SPECIAL = "trial/", ":special"  # Optuna names (orchestrator/sweep/space.py)


# fANOVA's cost is Python loops over every tree's splits (optuna/importance/_fanova):
# measured on benchmarks/report_scale.py's search, Optuna's defaults (64 trees of depth 64)
# took 25 CPU s on 100 trials and tens of minutes on 700; 16 trees of depth 8 on 200 still
# 20 s. So fANOVA (defaults, as before) for a study of at most FANOVA_MAX_TRIALS completed
# trials (a grid), and above that Optuna's PED-ANOVA (hundredths of a second on 700 trials:
# which params separate the top 10% of trials from all, the question a search asks; it
# ranked the synthetic search's params as fANOVA did). The note names the evaluator.
FANOVA_MAX_TRIALS = 50
# a numeric param with inf or absent values is categorical; with more levels than this (a
# continuous search over p with p = inf mixed in) its finite values are binned into
# quantiles, else the evaluators see a level per trial
MAX_LEVELS = 12


def _evaluate(study, n: int) -> tuple[dict[str, float], str]:
    """(param -> importance, the evaluator's name) for a study of ``n`` completed trials."""
    import optuna

    if n <= FANOVA_MAX_TRIALS:
        name = "fANOVA"
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)  # deterministic
    else:
        name = "PED-ANOVA (top 10% vs all)"
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PED-ANOVA is marked experimental
        return optuna.importance.get_param_importances(study, evaluator=evaluator), name


def study_from_trials(trials: pd.DataFrame, mode: str = "min"):
    """An in-memory study of the completed trials; returns (study, params left out)."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # "A new study created in memory"
    done = trials[(trials["status"] == "completed")].copy()
    y = rank_value(done)
    done = done[np.isfinite(y.to_numpy(dtype=float))]
    y = y.loc[done.index]
    dists, values, dropped = {}, {}, []
    for p in searched_params(trials):
        col = done[p]
        num = pd.to_numeric(col, errors="coerce")
        numeric = num.notna().sum() == col.notna().sum()
        if numeric and col.notna().all() and np.isfinite(num).all():
            lo, hi = float(num.min()), float(num.max())
            if hi <= lo:
                continue
            dists[p] = FloatDistribution(lo, hi, log=lo > 0 and hi >= 10 * lo)
            values[p] = num.astype(float).tolist()
        elif numeric and col.isna().any() and np.isfinite(num.dropna()).all():
            dropped.append(p)
        else:
            text = _levels(col, num if numeric else None)
            cats = tuple(sorted(set(text)))
            if len(cats) < 2:
                continue
            dists[p] = CategoricalDistribution(cats)
            values[p] = text
    study = optuna.create_study(direction="minimize" if mode == "min" else "maximize")
    study.add_trials([optuna.trial.create_trial(
        params={p: values[p][i] for p in dists}, distributions=dists, value=v)
        for i, v in enumerate(y.astype(float).tolist())])
    return study, dropped


def _levels(col: pd.Series, num: pd.Series | None) -> list[str]:
    """A categorical param's level per trial: its value as text, ``absent`` where missing;
    a numeric one with more than MAX_LEVELS levels keeps ``inf`` and ``absent`` and puts its
    finite values in quantile bins named by their range (``[0.5, 1.9]``)."""
    def text(v) -> str:
        return "absent" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)

    out = [text(v) for v in col]
    if num is None or len(set(out)) <= MAX_LEVELS:
        return out
    fin = num[np.isfinite(num)]
    nbins = MAX_LEVELS - 2  # room for inf and absent
    edges = np.unique(np.quantile(fin.to_numpy(dtype=float), np.linspace(0, 1, nbins + 1)))
    idx = np.clip(np.searchsorted(edges, fin.to_numpy(dtype=float), side="right") - 1, 0,
                  len(edges) - 2)
    names = [f"[{edges[i]:.3g}, {edges[i + 1]:.3g}]" for i in range(len(edges) - 1)]
    pos = {k: j for j, k in enumerate(col.index)}
    for k, i in zip(fin.index, idx):
        out[pos[k]] = names[i]
    return out


def _from_db(root: Path, name: str) -> tuple[dict[str, float], int, str] | None:
    db = root / "optuna.db"
    if not db.exists():
        return None
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    except (KeyError, ValueError):
        return None
    n = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    if n < MIN_TRIALS:
        return None
    raw, how = _evaluate(study, n)
    merged: dict[str, float] = {}
    for k, v in raw.items():  # p's inf switch is part of the choice of p
        key = k.removeprefix(_PREFIX).removesuffix(_SPECIAL)
        merged[key] = merged.get(key, 0.0) + float(v)
    return merged, n, how


def param_importance(trials: pd.DataFrame, root: Path | None = None, name: str | None = None,
                     mode: str = "min") -> tuple[dict[str, float] | None, str]:
    """(param -> importance, sorted high to low; or None) and a one-line note on how."""
    try:
        got = _from_db(root, name) if root is not None and name else None
        if got is not None:
            imps, n, how = got
            src = f"{how} (Optuna) over the sweep's study optuna.db, {n} complete trials"
        else:
            study, dropped = study_from_trials(trials, mode)
            made = study.get_trials(deepcopy=False)  # .trials deep-copies every trial
            n = len(made)
            if n < MIN_TRIALS or not made or not made[0].params:
                return None, (f"parameter importance needs >= {MIN_TRIALS} completed trials "
                              f"with a varying parameter; found {n}")
            raw, how = _evaluate(study, n)
            imps = {k: float(v) for k, v in raw.items()}
            src = f"{how} (Optuna) over {n} completed trials of the trials table"
            if dropped:
                src += "; left out (numeric, absent from some trials): " + ", ".join(dropped)
    except (ValueError, RuntimeError) as e:
        return None, f"parameter importance unavailable: {' '.join(str(e).split())}"
    return dict(sorted(imps.items(), key=lambda kv: (-kv[1], kv[0]))), src
