"""search-p's observations: trial rows -> observations, the top-k distinct p, per-config CIs.

Split out of orchestrator/sweep/search_p.py to keep files small; that module re-exports every
public name here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.analysis.stats import t_interval
from orchestrator.spec.params import P_KEY, Param
from orchestrator.sweep.also_axis import axis_decode
from orchestrator.sweep.space import AXIS, PREFIX, flat_from_tune_config

__all__ = ["LR_KEY", "params_from_optuna", "observations", "trial_steps", "p_bucket",
           "select_top_k", "summarize"]

LR_KEY = "optim.lr"


def params_from_optuna(params: Mapping[str, Any],
                       space: Mapping[str, Param] | None = None) -> dict[str, Any]:
    """Optuna's ``trial/<key>``, ``trial/<key>:special`` and ``trial/<key>:axis`` params ->
    flat dotted overrides; an ``:axis`` point is decoded with ``space[<key>]``."""
    pre = PREFIX + "/"
    flat = {k[len(pre):] if k.startswith(pre) else k: v for k, v in params.items()}
    for k in [k for k in flat if k.endswith(AXIS)]:
        key = k[: -len(AXIS)]
        if space is None or key not in space:
            raise ValueError(f"params_from_optuna: {k} needs the space of {key} to decode")
        flat[key] = axis_decode(space[key], flat.pop(k))
    return flat_from_tune_config(flat)


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _value(v: Any) -> Any:
    """A param value as a trial row holds it; ``None`` when absent (NaN in a Parquet column)."""
    return v if isinstance(v, (str, bool)) else _num(v)


def observations(rows: Iterable[Mapping[str, Any]], keys: list[str],
                 default_lr: float | None = None) -> list[dict[str, Any]]:
    """Trial records (``SweepResult.records`` or Parquet trial rows) -> observations.

    An observation: ``trial, status, p, lr, params`` (the searched ``keys`` only, seed
    excluded), ``loss`` (final validation loss), ``objective`` (what the searcher was told),
    ``steps`` (trial-steps spent) and ``seed``.
    """
    out = []
    for r in rows:
        src = r.get("params") if isinstance(r.get("params"), Mapping) else r
        params = {k: v for k in keys if k in src and (v := _value(src[k])) is not None}
        seed = _num(r.get("seed"))
        out.append({
            "trial": r.get("trial"), "status": r.get("status"),
            "seed": None if seed is None else int(seed),
            "p": params.get(P_KEY), "lr": params.get(LR_KEY, default_lr), "params": params,
            "loss": _num(r.get("final_val_loss")), "objective": _num(r.get("objective")),
            "steps": int(_num(r.get("last_step")) or 0),
        })
    return out


def trial_steps(obs: Iterable[Mapping[str, Any]]) -> int:
    return sum(o["steps"] for o in obs)


def _ident(params: Mapping[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def p_bucket(p: Any, per_octave: int = 2) -> Any:
    """The p that two trials must differ in to count as distinct: ``inf``, or log2 p rounded
    to 1/``per_octave`` octave (a continuous search never repeats p exactly, but p = 4.01 and
    p = 4.02 are not two answers to "which p")."""
    if p is None:
        return None
    if isinstance(p, str) or math.isinf(p):
        return "inf"
    return round(math.log2(p) * per_octave) / per_octave


def select_top_k(obs: list[dict[str, Any]], k: int, with_inf: bool = True) -> list[dict[str, Any]]:
    """The best configurations of ``k`` **distinct** p values (``p_bucket``), each at its best lr.

    Completed trials first, lowest final val loss first. Under ASHA few trials complete, so
    the remaining places go to early-stopped trials, those that reached the highest rung
    first (then the lower loss there). Diverged and failed trials are never confirmed.
    ``with_inf``: when stage 1 has an eligible p = inf trial but none of the k places went to
    it, its best configuration is appended (k + 1 in all), so that the answer can say whether
    p = inf is within noise of the best finite p (issue 17 §3); likewise a finite p is
    appended when only p = inf made it. Specs without p: distinct configurations.
    """
    def finite(o: Mapping[str, Any]) -> bool:
        return o["loss"] is not None and math.isfinite(o["loss"])

    def sig(o: Mapping[str, Any]) -> Any:
        return p_bucket(o["p"]) if o["p"] is not None else _ident(o["params"])

    done = sorted((o for o in obs if o["status"] == "completed" and finite(o)),
                  key=lambda o: o["loss"])
    stopped = sorted((o for o in obs if o["status"] == "stopped" and finite(o)),
                     key=lambda o: (-o["steps"], o["loss"]))
    chosen, seen = [], set()
    first_of: dict[bool, dict[str, Any]] = {}
    for o in done + stopped:
        if o["p"] is not None:
            first_of.setdefault(p_bucket(o["p"]) == "inf", o)
        if len(chosen) < k and sig(o) not in seen:
            seen.add(sig(o))
            chosen.append(dict(o["params"]))
    if with_inf and chosen:
        kinds = {p_bucket(c.get(P_KEY)) == "inf" for c in chosen if P_KEY in c}
        for is_inf, o in first_of.items():
            if is_inf not in kinds:
                chosen.append(dict(o["params"]))
    return chosen


def summarize(configs: list[dict[str, Any]], obs: list[dict[str, Any]],
              default_lr: float | None = None) -> list[dict[str, Any]]:
    """Per configuration: the 95% t-interval of the final val loss over its completed seeds.

    Sorted by mean (configurations without a completed seed last); diverged seeds are counted,
    not averaged (``t_interval`` takes finite values of completed runs only).
    """
    rows = []
    for params in configs:
        mine = [o for o in obs if _ident(o["params"]) == _ident(params)]
        losses = [o["loss"] for o in mine if o["status"] == "completed" and o["loss"] is not None]
        mean, lo, hi = t_interval(losses)
        rows.append({"p": params.get(P_KEY), "lr": params.get(LR_KEY, default_lr),
                     "params": dict(params), "mean": mean, "lo": lo, "hi": hi,
                     "n": len(losses), "n_diverged": sum(o["status"] == "diverged" for o in mine),
                     "n_runs": len(mine), "losses": losses})
    return sorted(rows, key=lambda r: (math.isnan(r["mean"]), r["mean"]))
