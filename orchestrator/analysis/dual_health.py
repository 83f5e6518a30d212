"""Did Manifold Muon's dual ascent converge? One table per sweep (docs/science.md §3.2).

The optimizer logs, at every metrics step and for every manifold matrix, the residual
``||H||_F / n`` its dual ascent ended at (``optim/dual_residual``) and the passes it took
(``optim/dual_passes``). A step that stopped on the pass cap without reaching the tolerance used
a direction that is not the constrained optimum, so a comparison of assignments is only as good
as this table: per arm and module role, how often the residual ended below the tolerance, how
often the whole pass cap was used without reaching it, and the worst residual.

Pure functions of the metrics and trials tables; ``write_dual`` adds the section to the report
when the sweep has such rows (a sweep without Manifold Muon gets nothing).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

__all__ = ["RESIDUAL", "PASSES", "TOL_KEY", "STEPS_KEY", "dual_settings", "dual_table",
           "write_dual", "MODE_KEY"]

RESIDUAL, PASSES = "optim/dual_residual", "optim/dual_passes"
TOL_KEY, STEPS_KEY = "optim.manifold.dual_tol", "optim.manifold.dual_steps"
MODE_KEY = "optim.manifold.dual_mode"


def dual_settings(root: str | Path, trials: pd.DataFrame) -> pd.DataFrame:
    """Per trial: ``trial``, ``tol`` and ``cap`` (the pass cap) its direction solver ran with:
    the trial's own parameter when the space varies it, else the spec's base config
    (``<root>/spec.yaml``), else the workload default; a null ``dual_tol`` / ``dual_steps``
    is the trial's ``dual_mode``'s own (``workloads.choices.DUAL_MODE_DEFAULTS``)."""
    from workloads.choices import dual_settings as mode_settings
    from workloads.config import ManifoldConfig

    m = ManifoldConfig()
    f = Path(root) / "spec.yaml"
    if f.is_file():
        try:
            from orchestrator.spec.yaml_reader import load_spec

            m = load_spec(f).base_config().optim.manifold
        except Exception:  # an unreadable spec: the defaults, as the trials' params may fix
            pass
    n = len(trials)

    def column(key: str, base):
        own = trials[key] if key in trials.columns else pd.Series([None] * n)
        return [base if v is None or (isinstance(v, float) and math.isnan(v)) else v
                for v in own.tolist()]

    rows = [mode_settings(mode, _num(tol), _num(cap, int)) for mode, tol, cap in zip(
        column(MODE_KEY, m.dual_mode), column(TOL_KEY, m.dual_tol),
        column(STEPS_KEY, m.dual_steps))]
    return pd.DataFrame({"trial": trials["trial"].astype(str).to_list(),
                         "tol": [float(t) for t, _ in rows], "cap": [float(c) for _, c in rows]})


def _num(v, cast=float):
    """A parameter value as a number, or None (null, or unreadable: the mode's own)."""
    try:
        return None if v is None else cast(float(v))
    except (TypeError, ValueError):
        return None


def dual_table(metrics: pd.DataFrame, trials: pd.DataFrame,
               settings: pd.DataFrame) -> pd.DataFrame:
    """One row per arm and module role: ``n`` (matrix x metrics-step samples), ``at_tol``
    (share with residual < tol), ``capped`` (share that used the whole pass cap and stayed at
    or above tol), ``res_median``, ``res_max``, ``passes_mean``, ``passes_max``; arms in the
    trials table's order. Empty when there are no dual rows."""
    cols = ["arm", "module", "n", "at_tol", "capped", "res_median", "res_max", "passes_mean",
            "passes_max", "tol", "cap"]
    m = metrics[metrics["metric"].isin((RESIDUAL, PASSES))] if len(metrics) else metrics
    if not len(m):
        return pd.DataFrame(columns=cols)
    key = ["trial", "step", "module", "layer"]
    wide = (m.assign(trial=m["trial"].astype(str))
            .pivot_table(index=key, columns="metric", values="value", aggfunc="last")
            .reset_index())
    if RESIDUAL not in wide.columns or PASSES not in wide.columns:
        return pd.DataFrame(columns=cols)
    arm_of = dict(zip(trials["trial"].astype(str), trials["arm"].astype(str)))
    wide = wide.merge(settings, on="trial", how="left")
    wide["arm"] = wide["trial"].map(arm_of)
    wide = wide[wide["arm"].notna()]
    wide["_at"] = wide[RESIDUAL].astype(float) < wide["tol"]
    wide["_cap"] = (wide[PASSES].astype(float) >= wide["cap"]) & ~wide["_at"]
    order = {a: i for i, a in enumerate(dict.fromkeys(trials["arm"].astype(str)))}
    rows = []
    for (arm, module), g in wide.groupby(["arm", "module"], sort=False):
        r = g[RESIDUAL].astype(float)
        p = g[PASSES].astype(float)
        rows.append({"arm": arm, "module": module, "n": len(g),
                     "at_tol": float(g["_at"].mean()), "capped": float(g["_cap"].mean()),
                     "res_median": float(r.median()), "res_max": float(r.max()),
                     "passes_mean": float(p.mean()), "passes_max": float(p.max()),
                     "tol": float(g["tol"].iloc[0]), "cap": float(g["cap"].iloc[0])})
    tab = pd.DataFrame(rows, columns=cols)
    tab["_o"] = tab["arm"].map(order)
    return tab.sort_values(["_o", "module"], kind="stable").drop(columns="_o").reset_index(
        drop=True)


def _fmt(tab: pd.DataFrame) -> pd.DataFrame:
    show = tab.drop(columns=["tol", "cap"]).copy()
    for c in ("at_tol", "capped"):
        show[c] = show[c].map(lambda v: f"{100 * v:.0f}%")
    for c in ("res_median", "res_max"):
        show[c] = show[c].map(lambda v: f"{v:.2g}" if math.isfinite(v) else "-")
    show["passes_mean"] = show["passes_mean"].map(lambda v: f"{v:.1f}")
    show["passes_max"] = show["passes_max"].map(lambda v: f"{v:.0f}")
    return show


def write_dual(metrics: pd.DataFrame, trials: pd.DataFrame, root: str | Path,
               out: Path) -> list[str]:
    """``out/dual.csv`` and the report's markdown lines; nothing when no dual rows exist."""
    from orchestrator.analysis.tables import _md_table

    if not len(metrics) or not metrics["metric"].isin((RESIDUAL, PASSES)).any():
        return []
    tab = dual_table(metrics, trials, dual_settings(root, trials))
    if not len(tab):
        return []
    tab.to_csv(out / "dual.csv", index=False)
    tols = sorted(set(tab["tol"]))
    caps = sorted(set(tab["cap"]))
    failing = tab[tab["at_tol"] < 1.0].sort_values("at_tol", kind="stable")
    lines = ["## Manifold Muon: did the dual converge?", "",
             f"Every manifold matrix at every metrics step: the residual ||H||_F / n its dual "
             f"ascent ended at, against the tolerance ({', '.join(f'{t:g}' for t in tols)}), and "
             f"its passes, against the cap ({', '.join(f'{c:g}' for c in caps)}). `at_tol`: "
             f"share below the tolerance (the others used a direction that is not the "
             f"constrained optimum); `capped`: share that used every pass and stayed above it.",
             ""]
    if len(failing):  # every (arm, module) that missed it, worst first: not only the worst
        parts = [f"{r['module']} in {r['arm']} in {100 * (1 - r['at_tol']):.0f}% of its samples "
                 f"(worst residual {r['res_max']:.2g}, median {r['res_median']:.2g})"
                 for _, r in failing.iterrows()]
        lines += ["**Not converged everywhere:** above the tolerance: " + "; ".join(parts) + ".",
                  ""]
    else:
        lines += ["Every sample reached the tolerance.", ""]
    return lines + [_md_table(_fmt(tab)), "", "Numbers: [dual.csv](dual.csv).", ""]
