"""Per-arm tables (mean and t-interval over seeds, paired differences with Holm, Wilson
divergence rates) and per-module metric tables, plus their markdown rendering."""

from __future__ import annotations

import fnmatch
import math
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.analysis.baseline import choose_baseline
from orchestrator.analysis.load import (
    TERMINAL,
    ReportConfig,
    SweepData,
    _by_seed,
    arm_order,
    trial_spikes,
    with_metric,
)
from orchestrator.analysis.stats import (
    holm,
    paired_difference,
    t_interval,
    wilson_interval,
)


def arm_table(data: SweepData, baseline: str | None = None,
              config: ReportConfig | None = None, named: Any = None) -> pd.DataFrame:
    """One row per arm. Losses over completed trials; ``metric_*`` = ``cfg.metric`` (default
    final val loss); ``diff_*`` = arm - baseline ``cfg.metric`` paired by seed; ``p_holm``
    adjusted over the non-baseline arms; ``div_*`` over completed + diverged trials
    (failed/running trials are infrastructure, not outcomes). The baseline:
    ``analysis.baseline.choose_baseline`` (``named``: the spec's ``report.baseline``), never
    a diverged arm. ASHA-stopped trials stay: ``n_stopped``, the highest step they reached
    (``stopped_step``) and their mean last val loss there (``stopped_val``)."""
    cfg = config or ReportConfig()
    t = with_metric(data, cfg.metric)
    arms = arm_order(t)
    base = choose_baseline(t, cfg.metric, baseline, named)
    spikes = trial_spikes(data, cfg)
    step_col = next((c for c in ("last_step", "steps") if c in t.columns), None)
    base_done = t[(t["arm"] == base) & (t["status"] == "completed")]
    base_seeds = _by_seed(base_done, cfg.metric).to_dict()  # once, not once per arm
    # Columns as arrays and each arm's row positions from one groupby: a search has an arm per
    # trial, and per-arm pandas filters of the whole frame cost minutes at 1,000 trials
    # (benchmarks/report_scale.py); per arm only small numpy slices remain.
    pos = t.groupby("arm", sort=False).indices
    col = {c: pd.to_numeric(t[c], errors="coerce").to_numpy(float)
           for c in ("final_val_loss", "best_val_loss", "divergence_step")
           if c in t.columns}
    col["metric"] = pd.to_numeric(t[cfg.metric], errors="coerce").to_numpy(float)
    col["step"] = (pd.to_numeric(t[step_col], errors="coerce").to_numpy(float) if step_col
                   else np.full(len(t), np.nan))
    status = t["status"].astype(str).to_numpy()
    seeds = t["seed"].to_numpy(object)
    sp_all = spikes.reindex(t["trial"]).to_numpy(float)
    nan_col = np.full(len(t), np.nan)
    rows = []
    for arm in arms:
        ix = pos[arm]
        st_ = status[ix]
        done, stopped = ix[st_ == "completed"], ix[st_ == "stopped"]
        n_div = int((st_ == "diverged").sum())
        n_term = int(np.isin(st_, list(TERMINAL)).sum())
        fm, flo, fhi = t_interval(col["final_val_loss"][done], cfg.conf)
        bm, blo, bhi = t_interval(col["best_val_loss"][done], cfg.conf)
        rate, rlo, rhi = wilson_interval(n_div, n_term, cfg.conf)
        mm, mlo, mhi = t_interval(col["metric"][done], cfg.conf)
        pr = paired_difference(_seed_means(seeds[done], col["metric"][done]), base_seeds,
                               cfg.conf)
        sp = sp_all[ix]
        sp = sp[~np.isnan(sp)]
        div_steps = col.get("divergence_step", nan_col)[ix[st_ == "diverged"]]
        div_steps = div_steps[~np.isnan(div_steps)]
        stop_steps = col["step"][stopped]
        stop_steps = stop_steps[~np.isnan(stop_steps)]
        stop_vals = col["final_val_loss"][stopped]
        stop_vals = stop_vals[~np.isnan(stop_vals)]
        rows.append({
            "arm": arm, "baseline": arm == base,
            "n_seeds": len({x for x in seeds[ix].tolist() if x is not None and x == x}),
            "n_trials": len(ix), "n_completed": len(done), "n_diverged": n_div,
            "n_failed": int((st_ == "failed").sum()),
            "n_stopped": len(stopped),
            "stopped_step": float(stop_steps.max()) if len(stop_steps) else np.nan,
            "stopped_val": float(stop_vals.mean()) if len(stop_vals) else np.nan,
            "final_val_mean": fm, "final_val_lo": flo, "final_val_hi": fhi,
            "best_val_mean": bm, "best_val_lo": blo, "best_val_hi": bhi,
            "metric": cfg.metric, "metric_mean": mm, "metric_lo": mlo, "metric_hi": mhi,
            "diff_n": pr.n if arm != base else 0,
            "diff_mean": pr.mean if arm != base else np.nan,
            "diff_lo": pr.lo if arm != base else np.nan,
            "diff_hi": pr.hi if arm != base else np.nan,
            "p_value": pr.p if arm != base else np.nan,
            "div_rate": rate, "div_lo": rlo, "div_hi": rhi,
            "median_div_step": float(np.median(div_steps)) if len(div_steps) else np.nan,
            "spikes_per_trial": float(sp.mean()) if len(sp) else np.nan,
            "spikes_total": int(sp.sum()) if len(sp) else 0,
        })
    out = pd.DataFrame(rows)
    out["p_holm"] = holm(out["p_value"].tolist())
    return out


def _seed_means(seeds: np.ndarray, values: np.ndarray) -> dict[Any, float]:
    """seed -> mean of its non-NaN values (``_by_seed``'s groupby-mean), for an arm's few
    trials without a pandas groupby each."""
    sums: dict[Any, float] = {}
    counts: dict[Any, int] = {}
    for seed, v in zip(seeds.tolist(), values.tolist(), strict=True):
        sums.setdefault(seed, 0.0)
        counts.setdefault(seed, 0)
        if not math.isnan(v):
            sums[seed] += v
            counts[seed] += 1
    return {k: sums[k] / counts[k] if counts[k] else math.nan for k in sums}


def _match(values: pd.Series, patterns: tuple[str, ...]) -> pd.Series:
    return values.map(lambda v: any(fnmatch.fnmatchcase(str(v), p) for p in patterns))


def metric_table(data: SweepData, patterns: tuple[str, ...],
                 config: ReportConfig | None = None) -> pd.DataFrame:
    """Per arm, metric and module: each completed trial's last-step value averaged over layers,
    then mean and t-interval over the trials (seeds) of the arm. Diverged trials stop at
    different steps, so their last values are not comparable (the growth figure shows them)."""
    cfg = config or ReportConfig()
    m = data.metrics
    done = data.trials.loc[data.trials["status"] == "completed", "trial"]
    m = m[m["trial"].isin(done)] if not m.empty else m
    cols = ["arm", "metric", "module", "step", "n", "mean", "lo", "hi"]
    if m.empty:
        return pd.DataFrame(columns=cols + ["small_gap"])
    m = m[_match(m["metric"], patterns)]
    if m.empty:
        return pd.DataFrame(columns=cols + ["small_gap"])
    last = m.groupby(["trial", "metric"])["step"].transform("max")
    m = m[m["step"] == last]
    per = m.groupby(["trial", "metric", "module"], as_index=False).agg(
        value=("value", "mean"), step=("step", "max"))
    per = per.merge(data.trials[["trial", "arm"]], on="trial")
    gaps = {src: _small_gap_share(data.metrics, done, cfg.min_gap, f"{src}.s1_s2")
            for src in ("w", "wc")}
    rows = []
    for (arm, metric, module), g in per.groupby(["arm", "metric", "module"], sort=False):
        mean, lo, hi = t_interval(g["value"], cfg.conf)
        share = float("nan")
        if metric.startswith(("w.top1_", "wc.top1_")):
            gap = gaps[metric.split(".")[0]]
            share = float(np.nanmean([gap.get((t, module), np.nan) for t in g["trial"]]
                                     or [np.nan]))
        rows.append([arm, metric, module, int(g["step"].max()), len(g), mean, lo, hi, share])
    out = pd.DataFrame(rows, columns=cols + ["small_gap"])
    order = {a: i for i, a in enumerate(arm_order(data.trials))}
    return out.sort_values(["metric", "module", "arm"], key=lambda s: s.map(order)
                           if s.name == "arm" else s, kind="stable").reset_index(drop=True)


def _small_gap_share(metrics: pd.DataFrame, trials: pd.Series, min_gap: float,
                     gap_metric: str = "w.s1_s2", at: str = "last"
                     ) -> dict[tuple[str, str], float]:
    """(trial, module) -> share of its matrices whose s1/s2 (``gap_metric``) at its last
    (``at="last"``) or first logged step is below ``min_gap``.

    docs/science.md §4.3 (M2): with s1/s2 < 1.05 the top singular vector is ill-defined
    (a Stiefel matrix has s1/s2 = 1 exactly), so its top-1 continuity says nothing; read the
    top-k subspace."""
    if metrics.empty:
        return {}
    g = metrics[(metrics["metric"] == gap_metric) & metrics["trial"].isin(trials)]
    if g.empty:
        return {}
    pick = "max" if at == "last" else "min"
    g = g[g["step"] == g.groupby("trial")["step"].transform(pick)]
    share = (g["value"] < min_gap).groupby([g["trial"], g["module"]]).mean()
    return {k: float(v) for k, v in share.items()}


def gap_source(metric: str) -> tuple[str, str]:
    """(s1/s2 row name, "first" | "last") that says whether ``metric``'s top-1 vectors are
    well defined: the same matrices (weights, probe gradients, centred or not), at step 0 for
    a ``cont0/`` summary and at the end otherwise."""
    grad = "grad_" in metric or metric.startswith(("gp.", "gpc."))
    centred = "ctop1" in metric or metric.startswith(("wc.", "gpc."))
    name = ("gpc" if centred else "gp") if grad else ("wc" if centred else "w")
    return f"{name}.s1_s2", "first" if metric.startswith("cont0/") else "last"


# --- markdown ------------------------------------------------------------------------------


def _fmt(v, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"  # not "": a blank False reads as "not set" (model.skip)
    if isinstance(v, (float, np.floating)):
        return f"{v:.{digits}g}"
    return str(v).replace("|", "\\|")


def _md_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "(none)\n"
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body]) + "\n"


def _ci(m: float, lo: float, hi: float) -> str:
    if math.isnan(m):
        return "-"
    return f"{m:.4g}" if math.isnan(lo) else f"{m:.4g} [{lo:.4g}, {hi:.4g}]"


def one_seed(arms: pd.DataFrame) -> bool:
    """Every arm has at most one seed (a 1-seed search): no interval, no paired difference and
    no multiple-comparison adjustment can be computed, and a "baseline" would be a post-hoc
    pick of the best trial; the report says so instead of printing them."""
    return bool(len(arms)) and int(arms["n_seeds"].max()) <= 1


def _rate(k: int, n: int, rate: float, lo: float, hi: float) -> str:
    """A divergence rate as counts, with its Wilson interval only from 2 trials up."""
    if not n:
        return "-"
    return f"{k}/{n}" if n < 2 else f"{k}/{n}: {_ci(rate, lo, hi)}"


def _arms_md(arms: pd.DataFrame) -> pd.DataFrame:
    r = arms
    single = one_seed(arms)

    def ci(key: str) -> list[str]:
        return [_ci(*x) for x in zip(r[f"{key}_mean"], r[f"{key}_lo"], r[f"{key}_hi"])]

    n_term = r["n_completed"] + r["n_diverged"]
    out = {
        "arm": r["arm"] + ("" if single else np.where(r["baseline"], " (baseline)", "")),
        "seeds": r["n_seeds"],
        "done/stopped/div/fail": [f"{a}/{s}/{b}/{c}" for a, s, b, c in
                                  zip(r["n_completed"], r["n_stopped"], r["n_diverged"],
                                      r["n_failed"])],
        "stopped early (ASHA)": ["-" if not n else
                                 f"{n} @ step {_fmt(st, 6)}: val {_fmt(v)}"
                                 for n, st, v in zip(r["n_stopped"], r["stopped_step"],
                                                     r["stopped_val"])],
        "final val loss": ci("final_val"), "best val loss": ci("best_val"),
        **({} if r["metric"].iloc[0] == "final_val_loss" else {r["metric"].iloc[0]: ci("metric")}),
        "diff vs baseline": ci("diff"),
        "p (Holm)": [f"{_fmt(p, 3)} ({_fmt(q, 3)})" if not math.isnan(p) else "-"
                     for p, q in zip(r["p_value"], r["p_holm"])],
        "diverged": [_rate(k, n, *x) for k, n, x in
                     zip(r["n_diverged"], n_term, zip(r["div_rate"], r["div_lo"], r["div_hi"]))],
        "median div step": r["median_div_step"], "spikes/trial": r["spikes_per_trial"],
    }
    if single:  # nothing to compare or bound: see one_seed
        for k in ("diff vs baseline", "p (Holm)"):
            del out[k]
    return pd.DataFrame(out)
