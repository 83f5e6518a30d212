"""``geosweep report DIR``: ablation tables and figures from a sweep's Parquet dataset.

``load_sweep`` reads the three tables (docs/contracts.md, "Parquet dataset"); ``arm_table``
gives one row per arm (mean and 95% t-interval over seeds, paired difference vs a baseline
arm with Holm-adjusted p-values, Wilson interval of the divergence rate, loss spikes);
``write_report`` writes ``<root>/report/{report.md, arms.csv, trials.csv, metrics.csv, *.png}``
(plus ``verdicts``, ``frontier*``, ``dual.csv`` and ``beta.csv`` where the sweep has claims,
a family x lr grid, Manifold Muon matrices or sphere families) and logs the folder to the
sweep's MLflow parent run when it can find it.

Metric rows are picked by name patterns (``ReportConfig``), because the metric vocabulary
belongs to workloads/metrics; a figure whose rows are absent is skipped with one line in the
report rather than an error. Figures use matplotlib's Agg canvas (no pyplot state).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.analysis.arm_labels import arm_names, short_labels
from orchestrator.analysis.dual_health import write_dual
from orchestrator.analysis.figures import _module_order, draw_figures
from orchestrator.analysis.frontier import write_frontier
from orchestrator.analysis.load import (
    TERMINAL,
    ReportConfig,
    ReportError,
    SweepData,
    arm_order,
    load_sweep,
    resolve_baseline,
    trial_spikes,
    with_metric,
)
from orchestrator.analysis.tables import (
    _arms_md,
    _ci,
    _md_table,
    arm_table,
    metric_table,
    one_seed,
)
from orchestrator.analysis.timing import stage
from orchestrator.analysis.verdicts import write_verdicts

if TYPE_CHECKING:  # annotations only: pandas is not imported here at run time
    import pandas as pd

__all__ = ["ReportConfig", "ReportError", "SweepData", "load_sweep", "arm_order",
           "resolve_baseline", "with_metric", "arm_table", "metric_table", "draw_figures",
           "write_report", "short_labels", "trial_spikes", "TERMINAL"]


# --- report --------------------------------------------------------------------------------


def write_report(root: str | Path, baseline: str | None = None,
                 config: ReportConfig | None = None, log_mlflow: bool = True,
                 metric: str | None = None) -> Path:
    """Write ``<root>/report/`` (markdown, CSVs, PNGs); returns the path of report.md.
    ``metric``: the value arms are compared on (``ReportConfig.metric``)."""
    import dataclasses

    from orchestrator.store.manifest import ManifestError, check_writes_inside
    from orchestrator.store.runs import log_report
    from orchestrator.store.staging import staged_folder, write_text_atomic

    cfg = config or ReportConfig()
    if metric:
        cfg = dataclasses.replace(cfg, metric=metric)
    with stage("read parquet"):
        warm = _warm_imports()
        data = load_sweep(root)
        warm.join()
    with stage("arm table"):
        data.trials = with_metric(data, cfg.metric)  # validates --metric before any write
        named = _named_baseline(data.root)
        arms = arm_table(data, baseline, cfg, named)  # validates the baseline before a write
    final = data.root / "report"
    try:
        check_writes_inside(data.root, final)
    except ManifestError as e:
        raise ReportError(str(e)) from None
    # every output is written into a fresh folder beside report/, which then replaces it
    # whole: a failure half-way (a bug, a full disk, Ctrl-C) leaves the last report as it was
    with staged_folder(final) as out:
        lines = _write_outputs(data, cfg, arms, named, baseline, out)
    md = final / "report.md"
    if log_mlflow:
        with stage("mlflow logging"):
            note = log_report(data.manifest.get("mlflow_uri"), data.name, final, data.root)
        write_text_atomic(md, "\n".join(lines + ["## MLflow", "", f"- {note}", ""]))
    return md


def _write_outputs(data: SweepData, cfg: ReportConfig, arms: pd.DataFrame, named,
                   baseline: str | None, out: Path) -> list[str]:
    """Every table, figure and the markdown into ``out``; the markdown's lines."""
    base = str(arms.loc[arms["baseline"], "arm"].iloc[0])
    with stage("trials table + csv"):
        trials, lead = _trial_table(data, cfg)
        arms.to_csv(out / "arms.csv", index=False)
        trials.to_csv(out / "trials.csv", index=False)
    with stage("metric table"):
        patterns = cfg.heatmap_metrics + tuple(p for ms, _ in cfg.growth.values() for p in ms)
        mtab = metric_table(data, patterns, cfg)
        mtab.to_csv(out / "metrics.csv", index=False)

    made, skipped = draw_figures(data, cfg, out)
    from orchestrator.analysis.search_report import search_section

    search_md, search_skipped = search_section(trials, data.root, data.name, out, _md_table)
    skipped += search_skipped
    lines = _intro_lines(data, cfg, arms, base, named, baseline) + search_md + ["## Figures", ""]
    for title, fname in made:
        lines += [f"### {title}", "", f"![{title}]({fname})", ""]
    lines += _metrics_md(data, cfg, mtab)
    with stage("verdicts + frontier"):
        lines += write_verdicts(data, out, cfg)  # the spec's claims: verdicts.{md,csv}
        lines += write_frontier(data, out, cfg)  # lr x family sweeps: frontier.{md,csv}
    with stage("dual convergence"):
        lines += write_dual(data.metrics, data.trials, data.root, out)  # Manifold Muon: dual.csv
    with stage("step saturation"):
        from orchestrator.analysis.saturation import write_saturation

        lines += write_saturation(data.trials, data.metrics, out, _md_table)  # beta.csv
    with stage("markdown"):
        lines += ["## Trials", "", _md_table(trials[lead]), ""]
        if skipped:
            lines += ["## Skipped", ""] + [f"- {s}" for s in skipped] + [""]
        (out / "report.md").write_text("\n".join(lines))
    return lines


def _warm_imports():
    """Import the figure and importance libraries (matplotlib, Optuna's evaluators with
    scikit-learn: ~1 s) on a second thread while this one reads the trial records, which
    pyarrow does outside the GIL (benchmarks/report_scale.py: ~1 s of a 1,000-trial report).
    pandas and pyarrow are imported before it starts and the thread imports neither, so the
    two threads never wait on each other's half-imported modules. A failed import here is
    ignored: the stage that needs the module imports it again and reports the error."""
    import threading

    import pyarrow.dataset  # noqa: F401  (imported here, not raced with the thread)

    import orchestrator.store.parquet  # noqa: F401

    def run() -> None:
        try:
            import matplotlib.backends.backend_agg  # noqa: F401
            import matplotlib.figure  # noqa: F401
            import optuna.importance  # noqa: F401
        except Exception:  # noqa: BLE001
            pass

    t = threading.Thread(target=run, name="geosweep-report-imports", daemon=True)
    t.start()
    return t


def _trial_table(data: SweepData, cfg: ReportConfig) -> tuple[pd.DataFrame, list[str]]:
    """The trials with their spike counts, the leading columns first; and those columns."""
    spikes = trial_spikes(data, cfg)
    trials = data.trials.assign(spikes=data.trials["trial"].map(spikes))
    lead = [c for c in dict.fromkeys(("trial", "name", "arm", "seed", "status", "final_val_loss",
                                      cfg.metric, "best_val_loss", "final_train_loss",
                                      "last_step", "divergence_reason", "divergence_step",
                                      "spikes"))
            if c in trials.columns]
    return trials[lead + [c for c in trials.columns if c not in lead]], lead


def _intro_lines(data: SweepData, cfg: ReportConfig, arms: pd.DataFrame, base: str, named,
                 baseline: str | None) -> list[str]:
    """The report's title, dataset line and arms table with how to read it."""
    counts = data.trials["status"].value_counts().to_dict()
    single = one_seed(arms)
    said = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    value = "final val loss" if cfg.metric == "final_val_loss" else f"`{cfg.metric}`"
    if single:  # tables.one_seed: nothing to compare or bound
        where = ("one seed per arm: no intervals, no comparison with a baseline (it would be "
                 "a post-hoc pick of the best trial) and no multiple-comparison adjustment; "
                 "the leaderboard below ranks the trials")
        how = ("Losses: the completed trial's value. Diverged: diverged / (completed + "
               "diverged) trials, as counts.")
    else:
        where = f"baseline arm `{base}` (" + (
            "named by the spec" if named is not None and baseline is None else
            "given" if baseline else "never a diverged arm: analysis/baseline.py") + ")"
        n_p = int(arms["p_value"].notna().sum())
        how = (f"Losses: mean [{cfg.conf:.0%} t-interval] over completed seeds (one seed: the "
               f"value alone). Diff: arm - baseline {value}, paired by seed (paired t-test"
               + (f"; Holm-adjusted over {n_p} arms in parentheses" if n_p else
                  "; no arm has 2 paired seeds: no p-value") + "). Diverged: diverged / "
               f"(completed + diverged) trials, with the Wilson {cfg.conf:.0%} interval from 2 "
               "trials up.")
    how += (f" Spikes: episodes with train loss > {cfg.spike_factor}x its running minimum "
            f"(and > min + {cfg.spike_min_delta}).")
    return [
        f"# Sweep report: {data.name}", "",
        f"Parquet dataset `{data.parquet_root}`; {len(data.trials)} trials ({said}); {where}.",
        "", "## Arms", "", _md_table(_arms_md(arms.assign(arm=arms["arm"].map(
            arm_names(list(arms["arm"])))))), how + " Arms are named as their trials are in "
        "MLflow and `geosweep status`, without the seed; their full labels are in arms.csv.",
        "", "Full table: [arms.csv](arms.csv); per trial: [trials.csv](trials.csv).", "",
    ]


def _named_baseline(root: Path):
    """The spec's ``report.baseline`` (``<root>/spec.yaml``), or None."""
    import yaml

    f = Path(root) / "spec.yaml"
    if not f.exists():
        return None
    d = yaml.safe_load(f.read_text()) or {}
    return (d.get("report") or {}).get("baseline")


def _metrics_md(data: SweepData, cfg: ReportConfig, mtab) -> list[str]:
    """The report's "Metrics at the last step" section (empty without metric rows)."""
    if mtab.empty:
        return []
    lines: list[str] = []
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
        piv.index = piv.index.map(arm_names(list(piv.index)))
        lines += [f"### `{metric}`", "", _md_table(piv.reset_index()), ""]
    if flagged:
        lines += [f"† s1/s2 < {cfg.min_gap} for most of these matrices at the last "
                  "step: the top singular vector is ill-defined (a Stiefel matrix has "
                  "s1/s2 = 1), so top-1 continuity says nothing there; read the top-k "
                  "subspace rows (`w.sub4_*`, docs/science.md §4.3 (M2)) in metrics.csv.", ""]
    return lines
