"""A sweep's Parquet dataset as pandas (``load_sweep``), the report's settings
(``ReportConfig``) and the per-trial values arms are compared on (``with_metric``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.analysis.spike_rule import SPIKE_FACTOR, SPIKE_MIN_DELTA, spike_rule
from orchestrator.spec.params import P_KEY

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
    spike_factor: float = SPIKE_FACTOR  # below the divergence rule's 4x-best
    spike_min_delta: float = SPIKE_MIN_DELTA  # as DivergenceRules.loss_min_delta
    band: str = "minmax"  # seed band of curves: minmax | std
    p_column: str = P_KEY
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
    # loss rows: step, split, metric, value, trial; None until a stage needs them (curves_of
    # reads only the trials asked for: a report of 1,000 trials draws a few)
    curves: pd.DataFrame | None
    metrics: pd.DataFrame  # step, metric, module, layer, next_layer, value, trial
    # per-trial aggregates computed once and shared by the report's stages (trial_spikes)
    cache: dict = field(default_factory=dict, repr=False, compare=False)


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


def _read_loss_curves(root: str, sweep: str, trials: list[str] | None = None) -> pd.DataFrame:
    """curves/ rows with ``metric == 'loss'`` of ``trials`` (None: all; both filtered while
    scanning, the trial filter skips the other trials' files), without wall_time; split,
    metric and trial as categoricals (benchmarks/report_scale.py)."""
    try:
        from orchestrator.store import parquet as sink
    except ImportError:
        df = _fallback_read(root, "curves", sweep)
        if not df.empty:
            df = df[df["metric"] == "loss"]
            df = df if trials is None else df[df["trial"].astype(str).isin(trials)]
        return df
    return sink.read_curves(root, sweep, metric="loss", categorical=True, trials=trials,
                            columns=["step", "split", "metric", "value", "trial"])


def curves_of(data: SweepData, trials=None) -> pd.DataFrame:
    """The sweep's loss curve rows of ``trials`` (None: every trial), read once per set."""
    if data.curves is not None:
        c = data.curves
        return c if trials is None or c.empty else c[c["trial"].isin([str(t) for t in trials])]
    key = ("curves", None if trials is None else frozenset(str(t) for t in trials))
    if key not in data.cache:
        if key[1] is not None and not key[1]:
            data.cache[key] = pd.DataFrame(columns=["step", "split", "metric", "value", "trial"])
        else:
            data.cache[key] = _normalise_rows(_read_loss_curves(
                data.parquet_root, data.name, None if key[1] is None else sorted(key[1])))
    return data.cache[key]


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
    if not isinstance(df["trial"].dtype, pd.CategoricalDtype):  # categories are strings
        df["trial"] = df["trial"].astype(str)
    df["value"] = pd.to_numeric(df["value"], errors="coerce").replace([np.inf, -np.inf], np.nan)
    return df


def load_sweep(root: str | Path) -> SweepData:
    """The sweep folder's manifest and its trials, curves and metric rows."""
    root = Path(root).expanduser().resolve()
    from orchestrator.store.manifest import ManifestError, read_manifest

    mf = root / "sweep.json"
    if not mf.exists():
        raise ReportError(f"{root}: not a geosweep sweep folder (no sweep.json)")
    try:
        manifest = read_manifest(root)
    except ManifestError as e:
        raise ReportError(str(e)) from None
    name = str(manifest["name"])
    proot = str(manifest["parquet_root"])
    if "://" not in proot and not Path(proot).is_absolute():
        proot = str(root / proot)
    trials = _read(proot, "trials", name)
    if trials.empty:
        raise ReportError(f"parquet_root {proot}: no trial records for sweep {name!r}")
    # curves are read when a stage needs them, and only its trials' (curves_of): spike counts
    # come from the trial records, the loss figure draws a few arms
    metrics = _normalise_rows(_read(proot, "metrics", name))
    return SweepData(name, root, proot, manifest, _normalise_trials(trials), None, metrics)


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
    """Loss-spike episodes of each trial's train loss curve (trial -> count); computed once
    per SweepData and settings (the arm table and the trials table both need it).

    A trial record that ended under geosweep holds its count (``spikes``) and the rule it was
    counted with (``spikes_rule``); those are used when the rule is ``cfg``'s, and only the
    other trials' curves (running ones, another rule, older sweeps) are read and counted."""
    key = ("spikes", cfg.spike_factor, cfg.spike_min_delta,
           None if data.curves is None else len(data.curves))
    if key in data.cache:
        return data.cache[key]
    t = data.trials
    ids = t["trial"].astype(str)
    stored = pd.Series(dtype=float)
    if {"spikes", "spikes_rule"} <= set(t.columns):
        ok = ((t["spikes_rule"] == spike_rule(cfg.spike_factor, cfg.spike_min_delta))
              & t["spikes"].notna()).to_numpy()
        stored = pd.Series(t["spikes"].to_numpy(dtype=float)[ok], index=ids[ok].to_numpy())
    rest = [x for x in ids if x not in stored.index]
    counted = pd.Series(dtype=float)
    if rest:
        counted = _trial_spikes(curves_of(data, None if len(rest) == len(ids) else rest), cfg)
    data.cache[key] = pd.concat([s for s in (stored, counted) if len(s)]) \
        if len(stored) or len(counted) else pd.Series(dtype=float)
    return data.cache[key]


def _trial_spikes(c: pd.DataFrame, cfg: ReportConfig) -> pd.Series:
    if c.empty:
        return pd.Series(dtype=float)
    from orchestrator.analysis.fast_spikes import spike_counts

    # numpy masks and the trial categorical's codes: no copy of the 10M-row frame, no sort
    keep = ((c["split"] == "train") & (c["metric"] == "loss")).to_numpy()
    if isinstance(c["trial"].dtype, pd.CategoricalDtype):
        all_codes = c["trial"].cat.codes.to_numpy()
        keep = keep & (all_codes >= 0)  # a row without a trial (-1) belongs to no curve
        codes, names = all_codes[keep], c["trial"].cat.categories
    else:
        codes, names = pd.factorize(c["trial"].to_numpy()[keep])
    step = c["step"].to_numpy()[keep]
    values = c["value"].to_numpy(dtype=float, na_value=np.nan)[keep]
    values[np.isnan(values)] = np.inf  # a missing loss counts as non-finite
    order = sorted_order(codes, step)
    if order is not None:
        codes, values, step = codes[order], values[order], step[order]
    # = spike_count per trial, vectorised up to each curve's first possible spike
    counts = spike_counts(codes, values, cfg.spike_factor, cfg.spike_min_delta)
    # a sampled curve (budget.curve_every > 1: a gap between two of its steps) gets no count:
    # a spike between two samples is unseen and the rule's window is not in steps
    gap = (codes[1:] == codes[:-1]) & (np.diff(step) > 1)
    if gap.any():
        counts = counts.drop([str(c) for c in np.unique(codes[1:][gap])], errors="ignore")
    counts.index = [str(names[int(i)]) for i in counts.index]
    return counts


def sorted_order(codes: np.ndarray, step: np.ndarray) -> np.ndarray | None:
    """None when rows are already grouped by ``codes`` in increasing ``step`` (as the sink
    writes them), else the stable permutation that sorts them by (codes, step)."""
    dc, ds_ = np.diff(codes), np.diff(step)
    if not len(dc) or bool(np.all((dc > 0) | ((dc == 0) & (ds_ >= 0)))):
        return None
    return np.lexsort((step, codes))


def _by_seed(g: pd.DataFrame, col: str) -> pd.Series:
    return g.groupby("seed")[col].mean()


def with_metric(data: SweepData, metric: str) -> pd.DataFrame:
    """The trials with a numeric ``metric`` column (read from the eval Parquet if needed)."""
    from orchestrator.store.eval_table import attach_metric

    try:
        return attach_metric(data.trials, data.parquet_root, data.name, metric)
    except ValueError as e:
        raise ReportError(str(e)) from None
