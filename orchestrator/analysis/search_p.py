"""The report of ``geosweep search-p``: the divergence map of (p, lr) and search_p.md.

Plain functions of the observations orchestrator/sweep/search_p.py gathers (``res`` is its
``SearchPResult``; typed ``Any`` here so that analysis does not import the sweep).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["divergence_map", "render_markdown", "jsonable"]


def divergence_map(obs: list[dict[str, Any]], path: Path) -> Path:
    """log2 p vs log10 lr: x = diverged, colour = final val loss, p = inf at the right."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pts = [o for o in obs if o["p"] is not None and o["lr"] is not None and o["lr"] > 0]
    finite = [math.log2(o["p"]) for o in pts if math.isfinite(o["p"])]
    x_inf = max([6.0, *finite]) + 1.5  # right of the searched range (log2 64 = 6)
    fig = Figure(figsize=(6.4, 4.4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)

    def xy(group):
        return ([math.log2(o["p"]) if math.isfinite(o["p"]) else x_inf for o in group],
                [math.log10(o["lr"]) for o in group])

    done = [o for o in pts if o["status"] == "completed" and o["loss"] is not None]
    stopped = [o for o in pts if o["status"] == "stopped"]
    div = [o for o in pts if o["status"] == "diverged"]
    if done:
        sc = ax.scatter(*xy(done), c=[o["loss"] for o in done], cmap="viridis", s=40,
                        edgecolors="k", linewidths=0.4, label="completed", zorder=3)
        fig.colorbar(sc, ax=ax, label="final val loss")
    if stopped:
        ax.scatter(*xy(stopped), facecolors="none", edgecolors="0.5", s=30,
                   label="stopped early (ASHA)", zorder=2)
    if div:
        ax.scatter(*xy(div), marker="x", c="red", s=50, label="diverged", zorder=4)
    ax.axvline(x_inf - 0.75, color="0.8", linestyle=":")
    ticks = sorted({-2, 0, 2, 4, 6} | {round(v) for v in finite})
    ax.set_xlim(min([-2.0, *finite]) - 0.5, x_inf + 0.5)
    ax.set_xticks([*ticks, x_inf], [*(f"{2.0 ** t:g}" for t in ticks), "inf"])
    ax.set_xlabel("p (log scale; GeoNorm p = inf at the right)")
    ax.set_ylabel("log10 learning rate")
    ax.set_title(f"where (p, lr) diverged: {len(div)} of {len(pts)} trials")
    if pts:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


# --- the report ----------------------------------------------------------------------------


def _fmt_p(p: Any) -> str:
    return "-" if p is None else ("inf" if p == math.inf else f"{p:.4g}")


def _fmt_ci(r: Mapping[str, Any]) -> str:
    if math.isnan(r["lo"]):
        return "-"
    return f"[{r['lo']:.4f}, {r['hi']:.4f}]"


def render_markdown(name: str, res: Any, notes: list[str]) -> str:
    lines = [f"# search-p: {name}", "", *notes, ""]
    b = res.best
    if b is None:
        lines.append("**No configuration completed its confirmation runs**: no best p.")
    else:
        lines.append(f"**Best p = {_fmt_p(b['p'])}** (lr {b['lr']:.3g}): final val loss "
                     f"{b['mean']:.4f}, 95% CI {_fmt_ci(b)} over {b['n']} seeds "
                     f"({b['n_diverged']} diverged)")
    lines += ["", "| rank | p | lr | mean final val loss | 95% CI | completed seeds | diverged |",
              "|---:|---:|---:|---:|---|---:|---:|"]
    for i, r in enumerate(([b] if b else []) + res.runners_up, 1):
        mean = "-" if math.isnan(r["mean"]) else f"{r['mean']:.4f}"
        lines.append(f"| {i} | {_fmt_p(r['p'])} | {r['lr']:.3g} | {mean} | {_fmt_ci(r)} | "
                     f"{r['n']} | {r['n_diverged']} |")
    div = [o for o in res.stage1 if o["status"] == "diverged"]
    lines += ["", "## Where (p, lr) diverged", "",
              f"{len(div)} of {len(res.stage1)} search trials diverged "
              "(each told to the sampler with its penalty value).", "",
              "![divergence map](divergence_map.png)", ""]
    for o in sorted(div, key=lambda o: (o["p"] or 0, o["lr"] or 0)):
        lines.append(f"- p = {_fmt_p(o['p'])}, lr = {o['lr']:.3g}: diverged by step {o['steps']}")
    lines += ["", "## Parameter importances", ""]
    if res.importances is None:
        lines.append(res.importance_note)
    else:
        lines += [res.importance_note, "", "| parameter | importance |", "|---|---:|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in res.importances.items()]
    return "\n".join(lines) + "\n"


def jsonable(v: Any) -> Any:
    if isinstance(v, float):
        return None if math.isnan(v) else ("inf" if v == math.inf else v)
    if isinstance(v, Mapping):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if hasattr(v, "item"):
        return jsonable(v.item())
    return v
