"""`geosweep status DIR --watch N`: a live table of a sweep ranked by its objective.

Running trials have no row in ``parquet/trials`` yet (the driver writes it when they end), but
their curve points are in ``parquet/curves`` as they arrive: the step reached, the training time
and the latest value of the objective come from there; finished trials from their trial row.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["live_table", "objective_of", "render_table", "watch"]

FINAL = ("completed", "diverged", "stopped", "failed")


def objective_of(root: Path) -> tuple[str, str]:
    """(metric, mode) of the sweep's spec, e.g. ("val/loss", "min")."""
    import yaml

    spec = root / "spec.yaml"
    search = (yaml.safe_load(spec.read_text()) or {}).get("search", {}) if spec.exists() else {}
    return str(search.get("metric", "val/loss")), str(search.get("mode", "min"))


def live_table(trials: pd.DataFrame, curves: pd.DataFrame, metric: str,
               mode: str) -> pd.DataFrame:
    """One row per trial seen: rank, trial, name, status, step, time_s, <metric>, reason;
    ranked by the metric (best first; diverged and failed trials, then trials without a value,
    last). ``name``: the trial's name in MLflow, Parquet and the report (store/run_names.py)."""
    from orchestrator.store.run_names import reason

    split, _, name = metric.partition("/")
    rows: dict[str, dict[str, Any]] = {}
    if len(curves):
        for tid, c in curves.groupby("trial", observed=True):
            obj = c[(c["split"] == split) & (c["metric"] == name)].sort_values("step")
            rows[str(tid)] = {
                "trial": str(tid), "name": "", "status": "running",
                "step": int(c["step"].max()), "time_s": float(c["wall_time"].max()),
                metric: float(obj["value"].iloc[-1]) if len(obj) else math.nan, "reason": ""}
    if len(trials):
        for rec in trials.to_dict("records"):
            r = rows.setdefault(str(rec["trial"]), {"trial": str(rec["trial"]), metric: math.nan})
            r["name"] = _text(rec.get("name"))
            r["status"] = _text(rec.get("status")) or "running"
            r["reason"] = reason({k: v for k, v in rec.items() if _given(v)}, r["status"]) or ""
            if _given(rec.get("last_step")):
                r["step"] = int(rec["last_step"])
            if _given(rec.get("wall_s")):
                r["time_s"] = float(rec["wall_s"])
            final = rec.get("final_val_loss") if metric == "val/loss" else None
            if _given(final) and r["status"] != "diverged":
                r[metric] = float(final)
            if r["status"] == "diverged":  # its value is a penalty or a loss that blew up
                r[metric] = math.nan
    cols = ["trial", "name", "status", "step", "time_s", metric, "reason"]
    df = pd.DataFrame(list(rows.values()), columns=cols)
    if df.empty:
        return df.assign(rank=[]).loc[:, ["rank", *cols]]
    bad = df["status"].isin(("diverged", "failed"))
    df = df.assign(_bad=bad).sort_values(["_bad", metric], ascending=[True, mode == "min"],
                                         na_position="last", kind="stable")
    df = df.drop(columns="_bad")
    df.insert(0, "rank", range(1, len(df) + 1))
    return df.reset_index(drop=True)


def _given(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and not (
        not isinstance(v, (str, bytes)) and pd.isna(v))


def _text(v: Any) -> str:
    return str(v) if _given(v) else ""


def render_table(table: pd.DataFrame) -> str:
    """The ranked table as text: missing values as ``-`` (never NaN), times in whole seconds,
    the metric to 4 decimals; numbers right-aligned, names and reasons left-aligned."""
    metric = table.columns[-2]
    fmt = {"time_s": "{:.0f}", "step": "{:.0f}", metric: "{:.4f}", "rank": "{:.0f}"}

    def cell(col: str, v: Any) -> str:
        if not _given(v) or v == "":
            return "-"
        return fmt[col].format(v) if col in fmt else str(v)

    cols = list(table.columns)
    cells = [[cell(c, v) for c, v in zip(cols, row)] for row in table.itertuples(index=False)]
    width = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(cols)]
    left = {"trial", "name", "status", "reason"}

    def line(vals: list[str]) -> str:
        return "  ".join(v.ljust(w) if c in left else v.rjust(w)
                         for c, v, w in zip(cols, vals, width)).rstrip()

    return "\n".join([line(cols)] + [line(r) for r in cells])


def _render(name: str, planned: int, table: pd.DataFrame) -> str:
    done = int(table["status"].isin(FINAL).sum()) if len(table) else 0
    head = (f"sweep {name}: {done}/{planned} trials ended, "
            f"{int((table['status'] == 'running').sum()) if len(table) else 0} running  "
            f"({time.strftime('%H:%M:%S')})")
    if table.empty:
        return head + "\n  no trial has reported yet"
    return head + "\n" + render_table(table)


def watch(root: Path, manifest: dict, every: float, printer=print, clear: bool = True,
          max_rounds: int | None = None) -> int:
    """Print the table every ``every`` s until every planned trial ended (or Ctrl-C)."""
    from orchestrator.store.parquet import read_curves, read_trials

    metric, mode = objective_of(root)
    rounds = 0
    try:
        while True:
            trials = read_trials(manifest["parquet_root"], sweep=manifest["name"])
            curves = read_curves(manifest["parquet_root"], sweep=manifest["name"])
            table = live_table(trials, curves, metric, mode)
            planned = int(manifest.get("trials", 0))
            printer(("\x1b[2J\x1b[H" if clear else "") + _render(manifest["name"], planned, table))
            rounds += 1
            ended = len(table) and int(table["status"].isin(FINAL).sum()) >= planned > 0
            if ended or (max_rounds is not None and rounds >= max_rounds):
                return 0
            time.sleep(every)
    except KeyboardInterrupt:  # Ctrl-C ends the watch, not the sweep
        return 0
