"""``geosweep report DIR``: ablation tables and figures from a sweep's Parquet dataset.

``load_sweep`` reads the three tables (docs/contracts.md, "Parquet dataset"); ``arm_table``
gives one row per arm (mean and 95% t-interval over seeds, paired difference vs a baseline
arm with Holm-adjusted p-values, Wilson interval of the divergence rate, loss spikes);
``write_report`` writes ``<root>/report/{report.md, arms.csv, trials.csv, metrics.csv, *.png}``
and logs the folder to the sweep's MLflow parent run when it can find it.

Metric rows are picked by name patterns (``ReportConfig``), because the metric vocabulary
belongs to workloads/metrics; a figure whose rows are absent is skipped with one line in the
report rather than an error. Figures use matplotlib's Agg canvas (no pyplot state).
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.analysis.stats import (
    holm,
    paired_difference,
    spike_count,
    t_interval,
    wilson_interval,
)

__all__ = ["ReportConfig", "ReportError", "SweepData", "load_sweep", "arm_order",
           "resolve_baseline", "with_metric", "arm_table", "metric_table", "draw_figures",
           "write_report"]

TERMINAL = ("completed", "diverged")


class ReportError(ValueError):
    """A user-facing problem with the report's input: one line."""


@dataclass
class ReportConfig:
    """What the report computes; metric names are fnmatch patterns over the ``metric`` column."""

    conf: float = 0.95
    # the per-trial value compared between arms (mean, CI, paired diff): a trial column or an
    # eval metric ``eval/<corpus>/<metric>`` of `geosweep eval` (orchestrator/store/eval_table.py)
    metric: str = "final_val_loss"
    spike_factor: float = 1.5  # below the divergence rule's 4x-best: spikes the run survived
    spike_min_delta: float = 0.1  # as DivergenceRules.loss_min_delta: 0.01 -> 0.02 is noise
    band: str = "minmax"  # seed band of curves: minmax | std
    p_column: str = "model.residual.p"
    # M1 continuity of weights and of the cumulative gradient (workloads/metrics/collect.py)
    heatmap_metrics: tuple[str, ...] = ("w.top1_v", "w.top1_u", "cg.top1_v", "cg.top1_u")
    # growth panels: title -> (metric patterns, module patterns); reduced by max over layers
    growth: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=lambda: {
        "sigma_max(W_Q)": (("w.sigma_max", "inst.sigma_max_q", "inst_sigma_max_q"),
                           ("q", "*_q", "")),
        "max attention logit": (("inst.max_logit", "inst_max_logit"), ("*",)),
    })
    max_heatmap_arms: int = 12
    min_gap: float = 1.05  # s1/s2 below this: top-1 singular vectors ill-defined (M2)


@dataclass
class SweepData:
    name: str
    root: Path
    parquet_root: str
    manifest: dict
    trials: pd.DataFrame  # one row per trial; ``trial`` (str), ``arm``, ``seed``, ``status``
    curves: pd.DataFrame  # step, split, metric, value, wall_time, trial
    metrics: pd.DataFrame  # step, metric, module, layer, next_layer, value, trial


# --- loading -------------------------------------------------------------------------------


def _fallback_read(root: str, kind: str, sweep: str | None) -> pd.DataFrame:
    """Hive-partitioned read without the sink (files starting with _ or . are ignored)."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    fs, base = pafs.FileSystem.from_uri(root if "://" in root else str(Path(root).resolve()))
    folder = f"{base.rstrip('/')}/{kind}"
    if fs.get_file_info(folder).type != pafs.FileType.Directory:
        return pd.DataFrame()
    names = [("sweep", pa.string())] + ([] if kind == "trials" else [("trial", pa.string())])
    part = ds.partitioning(pa.schema(names), flavor="hive")
    dset = ds.dataset(folder, format="parquet", filesystem=fs, partitioning=part)
    phys = [f.physical_schema for f in dset.get_fragments()]
    if not phys:
        return pd.DataFrame()
    # trial files have different param columns (conditional params): unify their schemas
    schema = pa.unify_schemas(phys + [pa.schema(names)], promote_options="permissive")
    dset = ds.dataset(folder, format="parquet", filesystem=fs, partitioning=part, schema=schema)
    filt = None if sweep is None else ds.field("sweep") == sweep
    return dset.to_table(filter=filt).to_pandas()


def _read(root: str, kind: str, sweep: str) -> pd.DataFrame:
    try:
        from orchestrator.store import parquet as sink
    except ImportError:
        return _fallback_read(root, kind, sweep)
    return getattr(sink, f"read_{kind}")(root, sweep=sweep)


def _normalise_trials(t: pd.DataFrame) -> pd.DataFrame:
    t = t.copy()
    if "trial" not in t.columns and "trial_id" in t.columns:
        t = t.rename(columns={"trial_id": "trial"})
    if "seed" not in t.columns:
        t["seed"] = t["train.seed"] if "train.seed" in t.columns else 0
    for col in ("arm", "status", "divergence_reason"):
        if col not in t.columns:
            t[col] = None
    t["arm"] = t["arm"].fillna("base").astype(str)
    t["status"] = t["status"].fillna("unknown").astype(str)
    for col in ("final_val_loss", "best_val_loss", "final_train_loss", "divergence_step"):
        t[col] = pd.to_numeric(t[col], errors="coerce") if col in t.columns else np.nan
    t["trial"] = t["trial"].astype(str)
    return t.sort_values("trial", kind="stable").reset_index(drop=True)


def _normalise_rows(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        return df
    df = df.copy()
    if "trial" not in df.columns and "trial_id" in df.columns:
        df = df.rename(columns={"trial_id": "trial"})
    df["trial"] = df["trial"].astype(str)
    df["value"] = pd.to_numeric(df["value"], errors="coerce").replace([np.inf, -np.inf], np.nan)
    return df


def load_sweep(root: str | Path) -> SweepData:
    """The sweep folder's manifest and its trials, curves and metric rows."""
    root = Path(root).expanduser().resolve()
    mf = root / "sweep.json"
    if not mf.exists():
        raise ReportError(f"{root}: not a geosweep sweep folder (no sweep.json)")
    manifest = json.loads(mf.read_text())
    name = str(manifest["name"])
    proot = str(manifest.get("parquet_root") or root / "parquet")
    if "://" not in proot and not Path(proot).is_absolute():
        proot = str(root / proot)
    trials = _read(proot, "trials", name)
    if trials.empty:
        raise ReportError(f"parquet_root {proot}: no trial records for sweep {name!r}")
    curves = _normalise_rows(_read(proot, "curves", name))
    metrics = _normalise_rows(_read(proot, "metrics", name))
    return SweepData(name, root, proot, manifest, _normalise_trials(trials), curves, metrics)


# --- tables --------------------------------------------------------------------------------


def arm_order(trials: pd.DataFrame) -> list[str]:
    """Arms in order of their first trial (the grid's order)."""
    return list(dict.fromkeys(trials["arm"]))


def resolve_baseline(arms: list[str], baseline: str | None) -> str:
    """``baseline`` if given (must be an arm), else the first arm naming pre_ln/unconstrained,
    else the first arm."""
    if baseline is not None:
        if baseline not in arms:
            raise ReportError(f"--baseline: unknown arm {baseline!r}; arms are: "
                              + "; ".join(arms))
        return baseline
    for arm in arms:
        if "pre_ln" in arm or "unconstrained" in arm:
            return arm
    return arms[0]


def trial_spikes(data: SweepData, cfg: ReportConfig) -> pd.Series:
    """Loss-spike episodes of each trial's train loss curve (trial -> count)."""
    c = data.curves
    if c.empty:
        return pd.Series(dtype=float)
    c = c[(c["split"] == "train") & (c["metric"] == "loss")].sort_values("step")
    return c.groupby("trial")["value"].apply(
        lambda v: spike_count(v.fillna(np.inf), cfg.spike_factor, cfg.spike_min_delta))


def _by_seed(g: pd.DataFrame, col: str) -> pd.Series:
    return g.groupby("seed")[col].mean()


def with_metric(data: SweepData, metric: str) -> pd.DataFrame:
    """The trials with a numeric ``metric`` column (read from the eval Parquet if needed)."""
    from orchestrator.store.eval_table import attach_metric

    try:
        return attach_metric(data.trials, data.parquet_root, data.name, metric)
    except ValueError as e:
        raise ReportError(str(e)) from None


def arm_table(data: SweepData, baseline: str | None = None,
              config: ReportConfig | None = None) -> pd.DataFrame:
    """One row per arm. Losses over completed trials; ``metric_*`` = ``cfg.metric`` (default
    final val loss); ``diff_*`` = arm - baseline ``cfg.metric`` paired by seed; ``p_holm``
    adjusted over the non-baseline arms; ``div_*`` over completed + diverged trials
    (failed/running trials are infrastructure, not outcomes)."""
    cfg = config or ReportConfig()
    t = with_metric(data, cfg.metric)
    arms = arm_order(t)
    base = resolve_baseline(arms, baseline)
    spikes = trial_spikes(data, cfg)
    base_done = t[(t["arm"] == base) & (t["status"] == "completed")]
    rows = []
    for arm in arms:
        g = t[t["arm"] == arm]
        done = g[g["status"] == "completed"]
        n_div = int((g["status"] == "diverged").sum())
        n_term = int(g["status"].isin(TERMINAL).sum())
        fm, flo, fhi = t_interval(done["final_val_loss"], cfg.conf)
        bm, blo, bhi = t_interval(done["best_val_loss"], cfg.conf)
        rate, rlo, rhi = wilson_interval(n_div, n_term, cfg.conf)
        mm, mlo, mhi = t_interval(done[cfg.metric], cfg.conf)
        pr = paired_difference(_by_seed(done, cfg.metric),
                               _by_seed(base_done, cfg.metric), cfg.conf)
        sp = spikes.reindex(g["trial"]).dropna()
        div_steps = g.loc[g["status"] == "diverged", "divergence_step"].dropna()
        rows.append({
            "arm": arm, "baseline": arm == base, "n_seeds": int(g["seed"].nunique()),
            "n_trials": len(g), "n_completed": len(done), "n_diverged": n_div,
            "n_failed": int((g["status"] == "failed").sum()),
            "final_val_mean": fm, "final_val_lo": flo, "final_val_hi": fhi,
            "best_val_mean": bm, "best_val_lo": blo, "best_val_hi": bhi,
            "metric": cfg.metric, "metric_mean": mm, "metric_lo": mlo, "metric_hi": mhi,
            "diff_n": pr.n if arm != base else 0,
            "diff_mean": pr.mean if arm != base else np.nan,
            "diff_lo": pr.lo if arm != base else np.nan,
            "diff_hi": pr.hi if arm != base else np.nan,
            "p_value": pr.p if arm != base else np.nan,
            "div_rate": rate, "div_lo": rlo, "div_hi": rhi,
            "median_div_step": float(div_steps.median()) if len(div_steps) else np.nan,
            "spikes_per_trial": float(sp.mean()) if len(sp) else np.nan,
            "spikes_total": int(sp.sum()) if len(sp) else 0,
        })
    out = pd.DataFrame(rows)
    out["p_holm"] = holm(out["p_value"].tolist())
    return out


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
    gap = _small_gap_share(data.metrics, done, cfg.min_gap)
    rows = []
    for (arm, metric, module), g in per.groupby(["arm", "metric", "module"], sort=False):
        mean, lo, hi = t_interval(g["value"], cfg.conf)
        share = float("nan")
        if metric.startswith("w.top1_"):
            share = float(np.nanmean([gap.get((t, module), np.nan) for t in g["trial"]]
                                     or [np.nan]))
        rows.append([arm, metric, module, int(g["step"].max()), len(g), mean, lo, hi, share])
    out = pd.DataFrame(rows, columns=cols + ["small_gap"])
    order = {a: i for i, a in enumerate(arm_order(data.trials))}
    return out.sort_values(["metric", "module", "arm"], key=lambda s: s.map(order)
                           if s.name == "arm" else s, kind="stable").reset_index(drop=True)


def _small_gap_share(metrics: pd.DataFrame, trials: pd.Series,
                     min_gap: float) -> dict[tuple[str, str], float]:
    """(trial, module) -> share of its matrices whose last logged s1/s2 is below ``min_gap``.

    SCIENCE.md M2: with s1/s2 < 1.05 the top singular vector is ill-defined (a Stiefel matrix
    has s1/s2 = 1 exactly), so its top-1 continuity says nothing; read the top-k subspace."""
    if metrics.empty:
        return {}
    g = metrics[(metrics["metric"] == "w.s1_s2") & metrics["trial"].isin(trials)]
    if g.empty:
        return {}
    g = g[g["step"] == g.groupby("trial")["step"].transform("max")]
    share = (g["value"] < min_gap).groupby([g["trial"], g["module"]]).mean()
    return {k: float(v) for k, v in share.items()}


# --- markdown ------------------------------------------------------------------------------


def _fmt(v, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else ""
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


def _arms_md(arms: pd.DataFrame) -> pd.DataFrame:
    r = arms

    def ci(key: str) -> list[str]:
        return [_ci(*x) for x in zip(r[f"{key}_mean"], r[f"{key}_lo"], r[f"{key}_hi"])]

    return pd.DataFrame({
        "arm": r["arm"] + np.where(r["baseline"], " (baseline)", ""),
        "seeds": r["n_seeds"],
        "done/div/fail": [f"{a}/{b}/{c}" for a, b, c in
                          zip(r["n_completed"], r["n_diverged"], r["n_failed"])],
        "final val loss": ci("final_val"), "best val loss": ci("best_val"),
        **({} if r["metric"].iloc[0] == "final_val_loss" else {r["metric"].iloc[0]: ci("metric")}),
        "diff vs baseline": ci("diff"),
        "p (Holm)": [f"{_fmt(p, 3)} ({_fmt(q, 3)})" if not math.isnan(p) else "-"
                     for p, q in zip(r["p_value"], r["p_holm"])],
        "divergence rate": [_ci(*x) for x in zip(r["div_rate"], r["div_lo"], r["div_hi"])],
        "median div step": r["median_div_step"], "spikes/trial": r["spikes_per_trial"],
    })


# --- figures -------------------------------------------------------------------------------


def _figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _parse_arm(arm: str) -> dict[str, str] | None:
    pairs = arm.split(",")
    if not all("=" in p for p in pairs):
        return None
    return dict(p.split("=", 1) for p in pairs)


def short_labels(arms: list[str], drop: str | None = None) -> dict[str, str]:
    """Legend labels: the ``key=value`` pairs that differ between arms, keys shortened to their
    last dotted part; ``drop`` removes one key (the x axis). Full labels when ambiguous."""
    parsed = [_parse_arm(a) for a in arms]
    if any(kv is None for kv in parsed):
        return {a: a for a in arms}
    keys = list(dict.fromkeys(k for kv in parsed for k in kv))
    vary = [k for k in keys if k != drop and len({kv.get(k) for kv in parsed}) > 1]
    out = {a: " ".join(f"{k.split('.')[-1]}={kv[k]}" for k in vary if k in kv)
           for a, kv in zip(arms, parsed)}
    if drop is None and (len(set(out.values())) < len(arms) or not all(out.values())):
        return {a: a for a in arms}
    return out


def _colors(arms: list[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(arms) <= 10 else "tab20"]
    return {a: cmap(i % cmap.N) for i, a in enumerate(arms)}


def _arm_lines(ax, df: pd.DataFrame, data: SweepData, arms: list[str], labels: dict,
               colors: dict, band: str) -> int:
    """Mean over seeds and a seed band per arm; ``df`` has trial, step, value."""
    df = df.merge(data.trials[["trial", "arm"]], on="trial")
    drawn = 0
    for arm in arms:
        g = df[df["arm"] == arm]
        piv = g.pivot_table(index="step", columns="trial", values="value", aggfunc="mean")
        if piv.empty:
            continue
        piv = piv.sort_index()
        mean = piv.mean(axis=1)
        if band == "std":
            sd = piv.std(axis=1).fillna(0.0)
            lo, hi = mean - sd, mean + sd
        else:
            lo, hi = piv.min(axis=1), piv.max(axis=1)
        ax.plot(mean.index, mean.to_numpy(), color=colors[arm], label=labels[arm], lw=1.2)
        ax.fill_between(mean.index, lo.to_numpy(), hi.to_numpy(), color=colors[arm],
                        alpha=0.2, lw=0)
        drawn += 1
    return drawn


def _fig_loss_curves(data: SweepData, cfg: ReportConfig, arms, labels, colors, path) -> str | None:
    c = data.curves
    c = c[c["metric"] == "loss"] if not c.empty else c
    splits = [s for s in ("train", "val") if not c.empty and (c["split"] == s).any()]
    if not splits:
        return "loss curves: no train/val loss rows in curves/"
    fig = _figure(5.5 * len(splits), 4.5)
    axes = fig.subplots(1, len(splits), squeeze=False)[0]
    for ax, split in zip(axes, splits):
        d = c[c["split"] == split][["trial", "step", "value"]]
        _arm_lines(ax, d, data, arms, labels, colors, cfg.band)
        v = d["value"].dropna()
        lo, hi = float(v.min()), float(v.quantile(0.995))  # a diverged seed must not flatten all
        if hi > lo:
            ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
        ax.set(title=f"{split} loss", xlabel="step", ylabel="loss")
        ax.grid(alpha=0.3)
    band = "min-max" if cfg.band == "minmax" else "+-1 std"
    fig.suptitle(f"{data.name}: mean over seeds, band = {band} over seeds")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=min(3, len(names)), fontsize=7)
    fig.savefig(path)
    return None


def _fig_val_vs_p(data: SweepData, cfg: ReportConfig, arms, colors, path) -> str | None:
    t, col = data.trials, cfg.p_column
    if col not in t.columns:
        return f"validation loss vs p: no `{col}` column in the trials"
    t = t.assign(_p=pd.to_numeric(t[col], errors="coerce"))  # 'inf' strings parse to inf
    with_p = t[t["_p"].notna()]
    if with_p["_p"].nunique() < 2:
        return f"validation loss vs p: `{col}` does not vary"
    finite = np.sort(with_p.loc[np.isfinite(with_p["_p"]), "_p"].unique())
    lo_p, hi_p = (finite[0], finite[-1]) if len(finite) else (1.0, 1.0)
    x_inf = hi_p * max(4.0, (hi_p / lo_p) ** 0.2)  # p = inf: its own tick right of the axis

    def x_of(v):
        return np.where(np.isfinite(v), v, x_inf)

    fig = _figure(7, 4.8)
    ax = fig.subplots()
    p_arms = [a for a in arms if a in set(with_p["arm"])]
    names = short_labels(p_arms, drop=col)
    series: dict[str, list[str]] = {}
    for a in p_arms:  # nothing but p varies: name the series by its family
        kv = _parse_arm(a) or {}
        family = next((v for k, v in kv.items() if k.endswith(".family")), "all")
        series.setdefault(names[a] or family, []).append(a)
    for i, (name, members) in enumerate(series.items()):
        color = colors[members[0]]
        g = with_p[with_p["arm"].isin(members)]
        done = g[g["status"] == "completed"]
        ax.scatter(x_of(done["_p"].to_numpy()), done["final_val_loss"], s=10, alpha=0.35,
                   color=color, lw=0)
        stats = [(p, *t_interval(d["final_val_loss"], cfg.conf))
                 for p, d in done.groupby("_p")]
        if stats:
            p, m, lo, hi = map(np.array, zip(*stats))
            err = np.nan_to_num(np.vstack([m - lo, hi - m]))  # n = 1: no bar
            fin = np.isfinite(p)  # no line across the break to p = inf
            for part, label in ((fin, name), (~fin, None)):
                if part.any():
                    ax.errorbar(x_of(p[part]), m[part], yerr=err[:, part], color=color,
                                marker="o", ms=4, capsize=3, lw=1.2, label=label)
        div = g[g["status"] == "diverged"]
        if len(div):
            ax.plot(x_of(div["_p"].to_numpy()), np.full(len(div), 0.96 - 0.03 * i), "x",
                    color=color, ms=7, mew=2, transform=ax.get_xaxis_transform(),
                    label=f"diverged ({name})" if name else "diverged")
    for a in arms:  # families without p: the reference level with its CI
        if a in p_arms:
            continue
        g = t[(t["arm"] == a) & (t["status"] == "completed")]
        m, lo, hi = t_interval(g["final_val_loss"], cfg.conf)
        if not math.isnan(m):
            ax.axhline(m, color=colors[a], ls="--", lw=1, label=short_labels(arms)[a])
            if not math.isnan(lo):
                ax.axhspan(lo, hi, color=colors[a], alpha=0.12, lw=0)
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log")
    ax.xaxis.set_minor_locator(NullLocator())
    ticks = list(finite) if len(finite) <= 10 else [
        2.0 ** k for k in range(math.floor(math.log2(lo_p)), math.ceil(math.log2(hi_p)) + 1)]
    has_inf = bool(np.isinf(with_p["_p"]).any())
    if has_inf:
        ax.axvline(math.sqrt(hi_p * x_inf), color="0.6", ls=":", lw=1)
    ax.set_xticks(ticks + ([x_inf] if has_inf else []),
                  [f"{v:g}" for v in ticks] + (["inf"] if has_inf else []))
    ax.set(xlabel=f"p ({col})", ylabel="final validation loss",
           title=f"validation loss vs p: mean and {cfg.conf:.0%} CI over seeds; x = diverged")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(path)
    return None


def _spread(n: int, k: int) -> np.ndarray:
    """At most k evenly spread indices of 0..n-1 (tick positions)."""
    return np.unique(np.linspace(0, n - 1, min(k, n)).round()).astype(int)


# roles in reading order (docs/contracts.md); unknown modules follow alphabetically
_ROLE_ORDER = ("q", "k", "v", "qkv", "o", "fc", "proj", "gate", "up", "down", "hidden",
               "in", "out", "attn")


def _module_order(modules) -> list[str]:
    def key(m: str):
        role = m.split("_")[-1]
        return (_ROLE_ORDER.index(role) if role in _ROLE_ORDER else len(_ROLE_ORDER), m)

    return sorted(modules, key=key)


def _random_baselines(m: pd.DataFrame, name: str) -> dict[str, float]:
    """module -> mean of the ``base.*`` rows logged next to ``name`` (SCIENCE M1: always show
    the random baseline with the value)."""
    if "." not in name:
        return {}
    b = m[m["metric"] == "base." + name.split(".", 1)[1]]
    return b.groupby("module")["value"].mean().to_dict()


def _fig_heatmaps(data: SweepData, cfg: ReportConfig, arms, labels, out: Path):
    made, skipped = [], []
    m = data.metrics
    if m.empty:
        return made, ["continuity heatmaps: no metric rows in metrics/"]
    names = sorted(set(m.loc[_match(m["metric"], cfg.heatmap_metrics), "metric"]))
    if not names:
        return made, [f"continuity heatmaps: no metric matches {list(cfg.heatmap_metrics)}"]
    for name in names:
        d = m[m["metric"] == name].merge(data.trials[["trial", "arm"]], on="trial")
        present = [a for a in arms if a in set(d["arm"])]
        shown = present[: cfg.max_heatmap_arms]
        if len(shown) < len(present):
            skipped.append(f"heatmap {name}: showing the first {len(shown)} of "
                           f"{len(present)} arms")
        modules = _module_order(d["module"].unique())
        rand = _random_baselines(m, name)
        agg = d.groupby(["arm", "module", "layer", "next_layer", "step"])["value"].mean()
        vmin, vmax = float(agg.min()), float(agg.max())
        fig = _figure(1.2 + 2.4 * len(modules), 0.9 + 1.7 * len(shown))
        axes = fig.subplots(len(shown), len(modules), squeeze=False)
        im = None
        for i, arm in enumerate(shown):
            for j, mod in enumerate(modules):
                ax = axes[i][j]
                if (arm, mod) not in agg.index.droplevel([2, 3, 4]):
                    ax.set_axis_off()
                    continue
                piv = agg.loc[(arm, mod)].unstack("step")  # (layer, next_layer) x step
                im = ax.imshow(piv.to_numpy(), aspect="auto", origin="lower", vmin=vmin,
                               vmax=vmax, cmap="viridis", interpolation="nearest")
                ylab = [f"{a}-{b}" if b >= 0 else f"{a}" for a, b in piv.index]
                yt = _spread(len(ylab), 6)
                ax.set_yticks(yt, [ylab[k] for k in yt], fontsize=6)
                xt = _spread(piv.shape[1], 4)
                ax.set_xticks(xt, [str(piv.columns[k]) for k in xt], fontsize=6)
                if i == 0:
                    note = f" (random {rand[mod]:.2g})" if mod in rand else ""
                    ax.set_title(mod + note, fontsize=8)
                if j == 0:
                    ax.set_ylabel(labels[arm], fontsize=7)
        if im is not None:
            fig.colorbar(im, ax=axes, shrink=0.8)
        fig.suptitle(f"{name}: layer pair x step per module, mean over seeds", fontsize=9)
        fname = f"heatmap_{name.replace('.', '_')}.png"
        fig.savefig(out / fname)
        made.append((f"Continuity heatmap `{name}`", fname))
    return made, skipped


def _fig_growth(data: SweepData, cfg: ReportConfig, arms, labels, colors, path):
    m, panels, skipped = data.metrics, [], []
    for title, (mpats, modpats) in cfg.growth.items():
        found = None
        for pat in mpats:  # the first pattern with rows wins: never mix two definitions
            if m.empty:
                break
            d = m[_match(m["metric"], (pat,)) & _match(m["module"].fillna(""), modpats)]
            if len(d):
                found = (f"{title} [{pat}]", d)
                break
        if found is None:
            skipped.append(f"{title} growth: no metric rows match {list(mpats)} "
                           f"with module in {list(modpats)}")
        else:
            panels.append(found)
    if not panels:
        return None, skipped
    fig = _figure(5.5 * len(panels), 4.5)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, d) in zip(axes, panels):
        per = d.groupby(["trial", "step"], as_index=False)["value"].max()  # max over layers
        _arm_lines(ax, per, data, arms, labels, colors, cfg.band)
        v = per["value"].dropna()
        if len(v) and v.min() > 0 and v.max() > 10 * v.min():  # growth over decades
            ax.set_yscale("log")
        ax.set(title=f"{title}, max over layers", xlabel="step")
        ax.grid(alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=min(3, len(names)), fontsize=7)
    fig.suptitle(f"{data.name}: growth per arm, mean and seed band")
    fig.savefig(path)
    return ("sigma_max(W_Q) and max-logit growth", path.name), skipped


def draw_figures(data: SweepData, cfg: ReportConfig, out: Path):
    """All figures into ``out``: ([(title, file name)], [one line per skipped figure])."""
    arms = arm_order(data.trials)
    labels, colors = short_labels(arms), _colors(arms)
    made, skipped = [], []
    why = _fig_loss_curves(data, cfg, arms, labels, colors, out / "loss_curves.png")
    made += [] if why else [("Loss curves per arm", "loss_curves.png")]
    skipped += [why] if why else []
    why = _fig_val_vs_p(data, cfg, arms, colors, out / "val_vs_p.png")
    made += [] if why else [("Validation loss vs p", "val_vs_p.png")]
    skipped += [why] if why else []
    hm, sk = _fig_heatmaps(data, cfg, arms, labels, out)
    made, skipped = made + hm, skipped + sk
    g, sk = _fig_growth(data, cfg, arms, labels, colors, out / "growth.png")
    made, skipped = made + ([g] if g else []), skipped + sk
    return made, skipped


# --- report --------------------------------------------------------------------------------


def write_report(root: str | Path, baseline: str | None = None,
                 config: ReportConfig | None = None, log_mlflow: bool = True,
                 metric: str | None = None) -> Path:
    """Write ``<root>/report/`` (markdown, CSVs, PNGs); returns the path of report.md.
    ``metric``: the value arms are compared on (``ReportConfig.metric``)."""
    import dataclasses

    cfg = config or ReportConfig()
    if metric:
        cfg = dataclasses.replace(cfg, metric=metric)
    data = load_sweep(root)
    data.trials = with_metric(data, cfg.metric)  # validates --metric before anything is written
    arms = arm_table(data, baseline, cfg)  # validates --baseline before anything is written
    out = data.root / "report"
    out.mkdir(exist_ok=True)
    for old in out.glob("*.png"):  # figures of an earlier report that may not apply any more
        old.unlink()
    base = str(arms.loc[arms["baseline"], "arm"].iloc[0])
    spikes = trial_spikes(data, cfg)
    trials = data.trials.assign(spikes=data.trials["trial"].map(spikes))
    lead = [c for c in dict.fromkeys(("trial", "arm", "seed", "status", "final_val_loss",
                                      cfg.metric, "best_val_loss", "final_train_loss",
                                      "divergence_reason", "divergence_step", "spikes"))
            if c in trials.columns]
    trials = trials[lead + [c for c in trials.columns if c not in lead]]
    arms.to_csv(out / "arms.csv", index=False)
    trials.to_csv(out / "trials.csv", index=False)
    patterns = cfg.heatmap_metrics + tuple(p for ms, _ in cfg.growth.values() for p in ms)
    mtab = metric_table(data, patterns, cfg)
    mtab.to_csv(out / "metrics.csv", index=False)

    made, skipped = draw_figures(data, cfg, out)
    counts = data.trials["status"].value_counts().to_dict()
    lines = [
        f"# Sweep report: {data.name}", "",
        f"Parquet dataset `{data.parquet_root}`; {len(data.trials)} trials ("
        + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + f"); baseline arm `{base}`.",
        "", "## Arms", "", _md_table(_arms_md(arms)),
        f"Losses: mean [{cfg.conf:.0%} t-interval] over completed seeds. Diff: arm - baseline "
        + ("final val loss" if cfg.metric == "final_val_loss" else f"`{cfg.metric}`")
        + ", paired by seed (paired t-test; Holm-adjusted over "
        f"{int(arms['p_value'].notna().sum())} arms in parentheses). Divergence rate: diverged /"
        f" (completed + diverged), Wilson {cfg.conf:.0%} interval. Spikes: episodes with train "
        f"loss > {cfg.spike_factor}x its running minimum (and > min + {cfg.spike_min_delta}).",
        "", "Full table: [arms.csv](arms.csv); per trial: [trials.csv](trials.csv).", "",
        "## Figures", "",
    ]
    for title, fname in made:
        lines += [f"### {title}", "", f"![{title}]({fname})", ""]
    if not mtab.empty:
        lines += ["## Metrics at the last step", "",
                  "Per arm and module: each completed trial's last-step value averaged over "
                  "layers, mean [t-interval] over seeds. All rows: [metrics.csv](metrics.csv).",
                  ""]
        flagged = False
        for metric, g in mtab.groupby("metric", sort=False):
            mark = ["†" if sh >= 0.5 else "" for sh in g["small_gap"].fillna(0.0)]
            flagged = flagged or any(mark)
            piv = g.assign(v=[_ci(*x) + mk for x, mk in zip(
                zip(g["mean"], g["lo"], g["hi"]), mark)]).pivot(
                index="arm", columns="module", values="v")
            piv = piv.reindex(index=[a for a in arm_order(data.trials) if a in set(g["arm"])],
                              columns=_module_order(piv.columns))
            lines += [f"### `{metric}`", "", _md_table(piv.reset_index()), ""]
        if flagged:
            lines += [f"† s1/s2 < {cfg.min_gap} for most of these matrices at the last "
                      "step: the top singular vector is ill-defined (a Stiefel matrix has "
                      "s1/s2 = 1), so top-1 continuity says nothing there; read the top-k "
                      "subspace rows (`w.sub4_*`, SCIENCE.md M2) in metrics.csv.", ""]
    lines += ["## Trials", "", _md_table(trials[lead]), ""]
    if skipped:
        lines += ["## Skipped", ""] + [f"- {s}" for s in skipped] + [""]
    md = out / "report.md"
    md.write_text("\n".join(lines))
    if log_mlflow:
        note = _log_to_mlflow(data, out)
        md.write_text("\n".join(lines + ["## MLflow", "", f"- {note}", ""]))
    return md


# --- MLflow --------------------------------------------------------------------------------


def _log_to_mlflow(data: SweepData, folder: Path) -> str:
    """Log ``folder`` as artifacts ``report/`` of the sweep's parent run; one-line outcome."""
    uri = data.manifest.get("mlflow_uri")
    if not uri:
        return "not logged: the sweep has no mlflow_uri"
    from orchestrator.store.runs import store_problem

    why = store_problem(str(uri))
    if why:
        return f"not logged: {why}"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=str(uri))
    query = f"tags.`geosweep.sweep` = '{data.name}'"
    exp = client.get_experiment_by_name(data.name)
    ids = [exp.experiment_id] if exp else []
    runs = client.search_runs(ids, query) if ids else []
    if not runs:  # experiment named otherwise (tracking.experiment): look everywhere
        ids = [e.experiment_id for e in client.search_experiments()]
        runs = client.search_runs(ids, query) if ids else []
    parents = [r for r in runs if r.data.tags.get("geosweep.role") == "parent"] or [
        r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    if not parents:
        return (f"not logged: no parent run tagged geosweep.sweep={data.name!r} in {uri}")
    run = max(parents, key=lambda r: r.info.start_time or 0)
    client.log_artifacts(run.info.run_id, str(folder), artifact_path="report")
    return f"tables and figures logged to MLflow run {run.info.run_id} (artifacts report/)"
