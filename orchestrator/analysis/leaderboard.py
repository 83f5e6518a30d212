"""The leaderboard of a search: the top trials by the objective with their searched params,
status and the step they reached. Works for grids too (then every arm's seeds are rows).

Searched params are the trials table's dotted columns (orchestrator/store/parquet.py) that
take more than one value, the seed excluded; the ranking value is the trial's ``objective``
(what the searcher saw), falling back to ``final_val_loss``. Diverged and failed trials rank
after every other trial (a diverged trial's objective is a penalty, not a loss).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from orchestrator.store.parquet import TRIAL_SCHEMA

__all__ = ["searched_params", "rank_value", "leaderboard", "BAD"]

SEED_KEY = "train.seed"
BAD = ("diverged", "failed")
_FIXED = set(TRIAL_SCHEMA.names) | {"sweep", "seed", "spikes"}


def searched_params(trials: pd.DataFrame) -> list[str]:
    """Dotted param columns that vary between trials (the space), in column order."""
    out = []
    for c in trials.columns:
        if c in _FIXED or c == SEED_KEY or "." not in c or "/" in c:
            continue
        if trials[c].dropna().astype(str).nunique() > 1:
            out.append(c)
    return out


def rank_value(trials: pd.DataFrame) -> pd.Series:
    """Per trial: ``objective`` where present and finite, else ``final_val_loss``."""
    obj = pd.to_numeric(trials.get("objective"), errors="coerce") \
        if "objective" in trials.columns else pd.Series(np.nan, index=trials.index)
    fvl = pd.to_numeric(trials["final_val_loss"], errors="coerce")
    obj = obj.where(np.isfinite(obj.fillna(np.nan).astype(float)), np.nan)
    return obj.fillna(fvl)


def leaderboard(trials: pd.DataFrame, top: int = 20, mode: str = "min") -> pd.DataFrame:
    """The ``top`` trials: rank, trial, name (as in MLflow and status), status, objective, best
    val loss, step reached, divergence reason, then the searched params."""
    params = searched_params(trials)
    value = rank_value(trials)
    bad = trials["status"].isin(BAD)
    key = value if mode == "min" else -value
    order = pd.DataFrame({"bad": bad, "nan": value.isna(), "key": key,
                          "trial": trials["trial"]}).sort_values(
        ["bad", "nan", "key", "trial"], kind="stable").index
    t = trials.loc[order].head(top)
    out = pd.DataFrame({
        "rank": range(1, len(t) + 1),
        "trial": t["trial"].to_numpy(),
        "name": t["name"].to_numpy() if "name" in t.columns else np.full(len(t), None),
        "status": t["status"].to_numpy(),
        "objective": value.loc[t.index].to_numpy(),
        "best_val_loss": pd.to_numeric(t["best_val_loss"], errors="coerce").to_numpy(),
        "step": pd.to_numeric(t["last_step"], errors="coerce").to_numpy()
        if "last_step" in t.columns else np.full(len(t), np.nan),
        "seed": t["seed"].to_numpy(),
        "divergence_reason": t["divergence_reason"].fillna("").to_numpy(),
    })
    for p in params:
        out[p] = [_plain(v) for v in t[p]]
    return out


def _plain(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    return v
