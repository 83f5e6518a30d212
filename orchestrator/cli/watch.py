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

__all__ = ["live_table", "objective_of", "watch"]

FINAL = ("completed", "diverged", "stopped", "failed")


def objective_of(root: Path) -> tuple[str, str]:
    """(metric, mode) of the sweep's spec, e.g. ("val/loss", "min")."""
    import yaml

    spec = root / "spec.yaml"
    search = (yaml.safe_load(spec.read_text()) or {}).get("search", {}) if spec.exists() else {}
    return str(search.get("metric", "val/loss")), str(search.get("mode", "min"))


def live_table(trials: pd.DataFrame, curves: pd.DataFrame, metric: str,
               mode: str) -> pd.DataFrame:
    """One row per trial seen: rank, trial, arm, status, step, time_s, <metric>; ranked by the
    metric (best first; trials without a value last)."""
    split, _, name = metric.partition("/")
    rows: dict[str, dict[str, Any]] = {}
    if len(curves):
        for tid, c in curves.groupby("trial"):
            obj = c[(c["split"] == split) & (c["metric"] == name)].sort_values("step")
            rows[str(tid)] = {
                "trial": str(tid), "arm": "", "status": "running",
                "step": int(c["step"].max()), "time_s": float(c["wall_time"].max()),
                metric: float(obj["value"].iloc[-1]) if len(obj) else math.nan}
    if len(trials):
        for rec in trials.to_dict("records"):
            r = rows.setdefault(str(rec["trial"]), {"trial": str(rec["trial"]), metric: math.nan})
            r["arm"] = rec.get("arm") or ""
            r["status"] = rec.get("status") or "running"
            if rec.get("last_step") is not None and not pd.isna(rec.get("last_step")):
                r["step"] = int(rec["last_step"])
            if rec.get("wall_s") is not None and not pd.isna(rec.get("wall_s")):
                r["time_s"] = float(rec["wall_s"])
            final = rec.get("final_val_loss") if metric == "val/loss" else None
            if final is not None and not pd.isna(final) and r["status"] != "diverged":
                r[metric] = float(final)
    cols = ["trial", "arm", "status", "step", "time_s", metric]
    df = pd.DataFrame(list(rows.values()), columns=cols)
    if df.empty:
        return df.assign(rank=[]).loc[:, ["rank", *cols]]
    df = df.sort_values(metric, ascending=(mode == "min"), na_position="last", kind="stable")
    df.insert(0, "rank", range(1, len(df) + 1))
    return df.reset_index(drop=True)


def _render(name: str, planned: int, table: pd.DataFrame) -> str:
    done = int(table["status"].isin(FINAL).sum()) if len(table) else 0
    head = (f"sweep {name}: {done}/{planned} trials ended, "
            f"{int((table['status'] == 'running').sum()) if len(table) else 0} running  "
            f"({time.strftime('%H:%M:%S')})")
    if table.empty:
        return head + "\n  no trial has reported yet"
    fmt = {"time_s": lambda v: f"{v:.0f}", table.columns[-1]: lambda v: f"{v:.4f}"}
    return head + "\n" + table.to_string(index=False, formatters=fmt, na_rep="-")


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
