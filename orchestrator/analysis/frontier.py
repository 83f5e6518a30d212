"""Paper A as a stability frontier: each residual family's critical learning rate, the loss of
every family at one common good lr, and SpheretNorm's p-curve (docs/science.md §2).

Pure functions of the trials table (one row per trial: ``status``, ``seed``, the family and lr
params, ``final_val_loss``). A trial is stable when it completed with a finite final loss (the
divergence rules stopped the others: they blew up and stayed up) below the collapse ceiling when
the report knows one (orchestrator/analysis/collapse.py: a run that ends at the frequency
plateau blew up and stayed up too, with a finite loss). An lr is stable for a family
under ``rule`` "all" (every seed stable) or "majority" (more than half). The critical lr is the
largest lr such that it and every smaller lr tried are stable; the table also gives the first
unstable lr above it, the seed counts, and says when the frontier lies outside the range tried
("stable at the largest lr": a lower bound only; "unstable at the smallest lr").
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from orchestrator.analysis.load import ReportConfig, SweepData
from orchestrator.analysis.stats import t_interval
from orchestrator.analysis.tables import _md_table

__all__ = ["family_labels", "stable_mask", "critical_lr_table", "common_lr", "loss_at_lr",
           "p_curve", "loss_grid", "never_stable", "write_frontier"]

FAMILY, LR, P = "model.residual.family", "optim.lr", "model.residual.p"
Rule = Literal["all", "majority"]


def _other_params(trials: pd.DataFrame, family: str = FAMILY, p: str = P) -> list[str]:
    """The family's own parameters other than p that the sweep varies (``alpha_init``)."""
    return [c for c in trials.columns if c.startswith("model.residual.")
            and c not in (family, p) and trials[c].nunique(dropna=True) > 1]


def family_labels(trials: pd.DataFrame, family: str = FAMILY, p: str = P) -> pd.Series:
    """The family of each trial; a family swept over p gets one label per p (``spheret p=1``),
    and one per value of any other of its parameters the sweep varies
    (``spheret p=1 alpha_init=0.05``)."""
    lab = trials[family].astype(str)
    for col in ([p] if p in trials.columns else []) + _other_params(trials, family, p):
        v = pd.to_numeric(trials[col], errors="coerce")
        swept = trials.assign(_v=v).groupby(lab)["_v"].nunique() > 1
        has = lab.map(swept).fillna(False).astype(bool) & v.notna()
        name = "p" if col == p else col.rsplit(".", 1)[1]
        lab = lab.where(~has, lab + f" {name}=" + v.map(lambda x: f"{x:g}"))
    return lab


def stable_mask(trials: pd.DataFrame, metric: str = "final_val_loss",
                ceiling: float | None = None) -> pd.Series:
    """Completed with a finite ``metric``, below ``ceiling`` when one is given (the collapse
    ceiling: a trial that ends at the frequency plateau blew up and stayed up)."""
    v = pd.to_numeric(trials[metric], errors="coerce")
    ok = (trials["status"] == "completed") & np.isfinite(v)
    return ok & (v < ceiling) if ceiling is not None and math.isfinite(ceiling) else ok


def _lr_stable(n_stable: int, n: int, rule: Rule) -> bool:
    return n > 0 and (n_stable == n if rule == "all" else n_stable > n / 2)


def _ended(trials: pd.DataFrame, lr: str, metric: str,
           ceiling: float | None) -> pd.DataFrame:
    """The completed or diverged trials, with their family label ``_fam``, stability ``_ok``
    and lr ``_lr``: what every frontier table starts from."""
    t = trials[trials["status"].isin(("completed", "diverged"))].copy()
    t["_fam"], t["_ok"] = family_labels(t), stable_mask(t, metric, ceiling)
    t["_lr"] = t[lr].astype(float)
    return t


def _per_lr(g: pd.DataFrame, rule: Rule) -> tuple[list[float], list[bool], list[str]]:
    """One family's lrs in order, whether each is stable under ``rule``, and stable/seeds."""
    per = g.groupby("_lr")["_ok"].agg(["sum", "count"]).sort_index()
    pairs = list(zip(per["sum"].astype(int), per["count"].astype(int)))
    return (per.index.to_list(), [_lr_stable(a, n, rule) for a, n in pairs],
            [f"{a}/{n}" for a, n in pairs])


def _never(t: pd.DataFrame, rule: Rule) -> list[str]:
    return [str(fam) for fam, g in t.groupby("_fam", sort=False) if not any(_per_lr(g, rule)[1])]


def critical_lr_table(trials: pd.DataFrame, rule: Rule = "all", lr: str = LR,
                      metric: str = "final_val_loss",
                      ceiling: float | None = None) -> pd.DataFrame:
    """One row per family: lrs tried, critical lr with ``stable/seeds`` there, first unstable
    lr with its count, the family's best stable lr and its mean loss, and a note when the
    frontier is outside the range or not monotone."""
    t = _ended(trials, lr, metric, ceiling)
    rows = []
    for fam, g in t.groupby("_fam", sort=False):
        lrs, ok, cnt = _per_lr(g, rule)
        k = next((i for i, o in enumerate(ok) if not o), len(ok))  # first unstable index
        crit = lrs[k - 1] if k > 0 else math.nan
        first_bad = lrs[k] if k < len(lrs) else math.nan
        note = []
        if k == len(lrs):
            note.append("stable at the largest lr tried (a lower bound)")
        if k == 0:
            note.append("unstable at the smallest lr tried")
        if any(ok[k + 1:]):
            note.append("not monotone: stable again above the first unstable lr")
        # the family's own best: the stable lr (under ``rule``) with the lowest mean loss over
        # its stable seeds, which the common-lr comparison cannot show
        means = g[g["_ok"]].groupby("_lr")[metric].mean()
        good = [v for v, o in zip(lrs, ok) if o and v in means.index]
        best = min(good, key=lambda v: means[v]) if good else math.nan
        rows.append({"family": fam, "n_lrs": len(lrs), "lr_min": lrs[0], "lr_max": lrs[-1],
                     "critical_lr": crit, "stable_at_critical": cnt[k - 1] if k > 0 else "-",
                     "first_unstable_lr": first_bad,
                     "stable_at_first_unstable": cnt[k] if k < len(lrs) else "-",
                     "best_lr": best,
                     "best_loss": float(means[best]) if good else math.nan,
                     "rule": rule, "note": "; ".join(note)})
    return pd.DataFrame(rows)


def never_stable(trials: pd.DataFrame, rule: Rule = "all", lr: str = LR,
                 metric: str = "final_val_loss", ceiling: float | None = None) -> list[str]:
    """Families stable at no lr tried: their frontier lies below the range, and they cannot
    take part in a common-lr comparison (``common_lr`` leaves them out, the report names them)."""
    return _never(_ended(trials, lr, metric, ceiling), rule)


def common_lr(trials: pd.DataFrame, rule: Rule = "all", lr: str = LR,
              metric: str = "final_val_loss", ceiling: float | None = None) -> float:
    """The lr stable for every family (leaving out those stable at no lr, ``never_stable``)
    with the lowest mean (over families) of the mean loss; nan when there is none."""
    t = _ended(trials, lr, metric, ceiling)
    t = t[~t["_fam"].isin(_never(t, rule))]
    best, best_loss = math.nan, math.inf
    for v, g in t.groupby("_lr"):
        fams = g.groupby("_fam")["_ok"].agg(["sum", "count"])
        if len(fams) < t["_fam"].nunique() or not all(
                _lr_stable(int(s), int(n), rule) for s, n in zip(fams["sum"], fams["count"])):
            continue
        loss = float(g[g["_ok"]].groupby("_fam")[metric].mean().mean())
        if loss < best_loss:
            best, best_loss = float(v), loss
    return best


def loss_at_lr(trials: pd.DataFrame, at: float, lr: str = LR, metric: str = "final_val_loss",
               conf: float = 0.95, ceiling: float | None = None) -> pd.DataFrame:
    """Per family at lr ``at``: stable seeds, mean loss [t-interval] over them."""
    t = trials[np.isclose(trials[lr].astype(float), at, rtol=1e-9)].copy()
    t["_fam"], t["_ok"] = family_labels(t), stable_mask(t, metric, ceiling)
    rows = []
    for fam, g in t.groupby("_fam", sort=False):
        m, lo, hi = t_interval(g.loc[g["_ok"], metric].astype(float), conf)
        rows.append({"family": fam, "lr": at, "n": int(g["_ok"].sum()), "seeds": len(g),
                     "mean": m, "lo": lo, "hi": hi})
    return pd.DataFrame(rows)


def p_curve(trials: pd.DataFrame, at: float, family: str = "spheret", lr: str = LR,
            p: str = P, metric: str = "final_val_loss", conf: float = 0.95,
            ceiling: float | None = None) -> pd.DataFrame:
    """``family``'s loss against p at lr ``at``: n stable, mean [t-interval] per p (inf last)."""
    t = trials[(trials[FAMILY].astype(str) == family)
               & np.isclose(trials[lr].astype(float), at, rtol=1e-9)].copy()
    if t.empty or p not in t.columns:
        return pd.DataFrame(columns=["p", "n", "seeds", "mean", "lo", "hi"])
    t["_ok"], t["_p"] = stable_mask(t, metric, ceiling), pd.to_numeric(t[p], errors="coerce")
    other = _other_params(t, FAMILY, p)  # one curve per value of each (alpha_init)
    rows = []
    for key, g in t.groupby(other + ["_p"]):
        key = key if isinstance(key, tuple) else (key,)
        m, lo, hi = t_interval(g.loc[g["_ok"], metric].astype(float), conf)
        rows.append({**{c.rsplit(".", 1)[1]: v for c, v in zip(other, key[:-1])},
                     "p": float(key[-1]), "n": int(g["_ok"].sum()), "seeds": len(g),
                     "mean": m, "lo": lo, "hi": hi})
    return pd.DataFrame(rows)


def loss_grid(trials: pd.DataFrame, lr: str = LR, metric: str = "final_val_loss",
              ceiling: float | None = None) -> pd.DataFrame:
    """Family x lr: mean ``metric`` over the completed seeds with a finite value, and
    ``stable/seeds`` (the frontier's own counts): where each family degrades, not only where it
    stops counting as stable."""
    t = _ended(trials, lr, metric, ceiling)
    t["_v"] = pd.to_numeric(t[metric], errors="coerce")
    rows = []
    for fam, g in t.groupby("_fam", sort=False):
        row: dict[str, object] = {"family": fam}
        for v, h in g.groupby("_lr"):
            fin = h["_v"][(h["status"] == "completed") & np.isfinite(h["_v"])]
            row[f"{v:g}"] = (f"{fin.mean():.3f}" if len(fin) else "-") + \
                f" ({int(h['_ok'].sum())}/{len(h)})"
        rows.append(row)
    return pd.DataFrame(rows)


def write_frontier(data: SweepData, out: Path, cfg: ReportConfig | None = None,
                   rule: Rule = "all") -> list[str]:
    """``out/frontier.csv`` (critical lrs), ``out/frontier_grid.csv`` (loss per family x lr),
    ``out/frontier_loss.csv``, ``out/p_curve.csv`` and the report.md lines, for a sweep over
    families and a grid of at least 2 lrs (each lr shared by 2+ trials on average); else
    nothing. Stable: completed, finite, and below the collapse ceiling when the sweep's corpus
    gives one (orchestrator/analysis/collapse.py)."""
    from orchestrator.analysis.collapse import collapse_ceiling

    cfg = cfg or ReportConfig()
    t = data.trials
    if FAMILY not in t.columns or LR not in t.columns or t[LR].nunique() < 2 \
            or t[LR].nunique() > len(t) / 2:  # a random/Optuna lr search has no lr grid
        return []
    ceil = collapse_ceiling(data.root)
    c = ceil.value if math.isfinite(ceil.value) else None
    crit = critical_lr_table(t, rule, ceiling=c)
    crit.to_csv(out / "frontier.csv", index=False)
    grid = loss_grid(t, ceiling=c)
    grid.to_csv(out / "frontier_grid.csv", index=False)
    what = (f"complete with a final val loss below the collapse ceiling {c:.4g} ({ceil.note}: "
            "at or above it a run has learned no more than token frequencies; it blew up and "
            "stayed up with a finite loss)" if c is not None else
            f"complete with a finite loss ({ceil.note})")
    lines = ["## Stability frontier", "",
             f"Critical lr per family: the largest lr at which it and every smaller lr tried "
             f"had {'every seed' if rule == 'all' else 'a majority of seeds'} {what} "
             "(stable/seeds given). [frontier.csv](frontier.csv)", "",
             _md_table(crit), "",
             "### Final val loss per family and lr", "",
             "Mean over the completed seeds (stable/seeds). "
             "[frontier_grid.csv](frontier_grid.csv)", "", _md_table(grid), ""]
    at = common_lr(t, rule, ceiling=c)
    never = never_stable(t, rule, ceiling=c)
    if never:
        lines += [f"Stable at no lr tried, left out of the common-lr comparison: "
                  f"{', '.join(never)}.", ""]
    if not math.isfinite(at):
        return lines + ["No lr was stable for every other family: no common-lr comparison.",
                        ""]
    loss = loss_at_lr(t, at, conf=cfg.conf, ceiling=c)
    loss.to_csv(out / "frontier_loss.csv", index=False)
    lines += [f"### Final val loss at the common lr {at:g}", "",
              f"The lr stable for every family (but those above) with the lowest mean loss; mean "
              f"[{cfg.conf:.0%} t-interval] over stable seeds.", "", _md_table(loss), ""]
    pc = p_curve(t, at, conf=cfg.conf, ceiling=c)
    if len(pc) >= 2:
        pc.to_csv(out / "p_curve.csv", index=False)
        lines += [f"### SpheretNorm p-curve at lr {at:g}", "", _md_table(pc), ""]
    return lines
