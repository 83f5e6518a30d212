"""Continuity of a pretrained checkpoint (workloads.pretrained), for ``geosweep continuity``.

Writes into ``--out``: the tidy rows as ``continuity-<name>.parquet`` (temporary name + rename),
a heatmap ``continuity-<name>.png`` (roles x layer pairs, residual side and hidden-side control
of M1), and one MLflow run (experiment ``continuity``; default store ``sqlite`` in ``--out``)
with params checkpoint / architecture / n_layers, the mean residual-side top-1 per role as
metrics and the heatmap and Parquet file as artifacts. Prints a short table. The files and the
run are written by orchestrator/store/continuity.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["run_continuity", "summary_table", "plot_heatmap"]


def _slug(checkpoint: str) -> str:
    name = Path(str(checkpoint).rstrip("/")).name or "checkpoint"
    if re.fullmatch(r"step-\d{8}", name):  # a geosweep checkpoint: name it after its run
        name = f"{Path(str(checkpoint).rstrip('/')).parent.name}-{name}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def summary_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per role: mean residual-side top1, its hidden-side control, shuffled order, baseline."""

    def mean(metric: str, side: str) -> pd.Series:
        sel = rows[(rows.metric == metric) & (rows.side == side)]
        return sel.groupby("role", sort=False).value.mean()

    t = pd.DataFrame({
        "resid_top1": mean("top1", "residual"),
        "control_top1": mean("top1", "control"),
        "shuffled_top1": mean("shuffled.top1", "residual"),
        "baseline_top1": mean("base.top1", "residual"),
    })
    t.index.name = "role"
    return t


def _format_table(t: pd.DataFrame) -> str:
    head = f"{'role':<6} | {'resid top1 mean':>15} | {'control mean':>12} | " \
           f"{'shuffled mean':>13} | {'baseline':>8}"
    lines = [head, "-" * len(head)]
    for role, r in t.iterrows():
        lines.append(f"{role:<6} | {r.resid_top1:>15.3f} | {r.control_top1:>12.3f} | "
                     f"{r.shuffled_top1:>13.3f} | {r.baseline_top1:>8.3f}")
    return "\n".join(lines)


def plot_heatmap(rows: pd.DataFrame, path: Path, title: str) -> Path:
    """Roles x adjacent layer pairs of M1 top1, residual side and control side; PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top1 = rows[rows.metric == "top1"]
    roles = list(dict.fromkeys(top1.role))
    pairs = sorted(set(zip(top1.layer, top1.next_layer)))
    fig, axes = plt.subplots(1, 2, figsize=(2 + 0.6 * len(pairs) * 2, 1.2 + 0.45 * len(roles)),
                             squeeze=False, constrained_layout=True)
    for ax, side in zip(axes[0], ("residual", "control")):
        grid = (top1[top1.side == side]
                .pivot_table(index="role", columns=["layer", "next_layer"], values="value")
                .reindex(index=roles, columns=pd.MultiIndex.from_tuples(pairs)))
        im = ax.imshow(grid.to_numpy(), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        ax.set_yticks(range(len(roles)), roles)
        ax.set_xticks(range(len(pairs)), [f"{a}-{b}" for a, b in pairs], rotation=90)
        ax.set_xlabel("layer pair")
        ax.set_title(f"top-1 |cos|, {side} side")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.9)
    fig.suptitle(title)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path


def run_continuity(checkpoint: str, out_dir: str | os.PathLike,
                   mlflow_uri: str | None = None, echo: bool = True) -> dict[str, Any]:
    """Analyse ``checkpoint``; Parquet + PNG + MLflow run under ``out_dir``; returns a summary.

    Raises ``workloads.pretrained.CheckpointError`` (one line) for a bad checkpoint.
    """
    from orchestrator.store.continuity import log_continuity, write_table_atomic
    from workloads.pretrained import analyse

    analysis = analyse(checkpoint)
    out = Path(out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    slug = _slug(checkpoint)
    parquet = write_table_atomic(analysis.rows, out / f"continuity-{slug}.parquet")
    table = summary_table(analysis.rows)
    heatmap = plot_heatmap(analysis.rows, out / f"continuity-{slug}.png",
                           f"{analysis.checkpoint} ({analysis.architecture}, "
                           f"{analysis.n_layers} layers)")
    uri, run_id = log_continuity(mlflow_uri, out, analysis, table, [heatmap, parquet],
                                  run_name=slug)
    if echo:
        print(f"{analysis.checkpoint}: {analysis.architecture}, {analysis.n_layers} layers, "
              f"roles {' '.join(analysis.roles)}; shuffled order {analysis.shuffled}")
        print(_format_table(table))
        print(f"rows: {parquet}\nheatmap: {heatmap}\nmlflow: {uri} run {run_id}")
    return {
        "checkpoint": analysis.checkpoint, "architecture": analysis.architecture,
        "n_layers": analysis.n_layers, "roles": analysis.roles, "shuffled": analysis.shuffled,
        "n_rows": len(analysis.rows), "parquet": str(parquet), "heatmap": str(heatmap),
        "mlflow_uri": uri, "run_id": run_id, "table": table.to_dict(orient="index"),
    }
