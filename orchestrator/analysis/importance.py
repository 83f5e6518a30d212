"""Parameter importance of a sweep with Optuna's fANOVA evaluator.

Two sources, the first that works:
1. the sweep's own Optuna study (``<sweep>/optuna.db``, study named as the sweep), what the
   sampler saw: Optuna searches keep it (orchestrator/sweep/tuner.py);
2. otherwise (grid and random searches) a study rebuilt in memory from the trials table:
   one ``FrozenTrial`` per completed trial with its searched params and its objective.

Rebuilt distributions: a numeric param is a ``FloatDistribution`` (log when positive and
spanning at least 10x); ``inf`` (p = inf, GeoNorm) cannot sit on a float axis, so such a
column becomes categorical over its distinct values, as is any non-numeric param. A
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


def _fanova(study) -> dict[str, float]:
    import optuna

    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)  # deterministic
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optuna.importance.get_param_importances(study, evaluator=evaluator)


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
            text = [("absent" if v is None or (isinstance(v, float) and math.isnan(v))
                     else str(v)) for v in col]
            cats = tuple(sorted(set(text)))
            if len(cats) < 2:
                continue
            dists[p] = CategoricalDistribution(cats)
            values[p] = text
    study = optuna.create_study(direction="minimize" if mode == "min" else "maximize")
    for i, v in enumerate(y.astype(float).tolist()):
        study.add_trial(optuna.trial.create_trial(
            params={p: values[p][i] for p in dists}, distributions=dists, value=v))
    return study, dropped


def _from_db(root: Path, name: str) -> tuple[dict[str, float], int] | None:
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
    raw = _fanova(study)
    merged: dict[str, float] = {}
    for k, v in raw.items():  # p's inf switch is part of the choice of p
        key = k.removeprefix(_PREFIX).removesuffix(_SPECIAL)
        merged[key] = merged.get(key, 0.0) + float(v)
    return merged, n


def param_importance(trials: pd.DataFrame, root: Path | None = None, name: str | None = None,
                     mode: str = "min") -> tuple[dict[str, float] | None, str]:
    """(param -> importance, sorted high to low; or None) and a one-line note on how."""
    try:
        got = _from_db(root, name) if root is not None and name else None
        if got is not None:
            imps, n = got
            src = f"fANOVA (Optuna) over the sweep's study optuna.db, {n} complete trials"
        else:
            study, dropped = study_from_trials(trials, mode)
            n = len(study.trials)
            if n < MIN_TRIALS or not study.trials or not study.trials[0].params:
                return None, (f"parameter importance needs >= {MIN_TRIALS} completed trials "
                              f"with a varying parameter; found {n}")
            imps = {k: float(v) for k, v in _fanova(study).items()}
            src = f"fANOVA (Optuna) over {n} completed trials of the trials table"
            if dropped:
                src += "; left out (numeric, absent from some trials): " + ", ".join(dropped)
    except (ValueError, RuntimeError) as e:
        return None, f"parameter importance unavailable: {' '.join(str(e).split())}"
    return dict(sorted(imps.items(), key=lambda kv: (-kv[1], kv[0]))), src
