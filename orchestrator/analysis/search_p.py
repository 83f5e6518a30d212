"""The report of ``geosweep search-p``: the divergence map of (p, lr) and search_p.md.

Plain functions of the observations orchestrator/sweep/search_p.py gathers (``res`` is its
``SearchPResult``; typed ``Any`` here so that analysis does not import the sweep).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["divergence_boundary", "boundary_note", "MIN_CLASS", "divergence_map",
           "render_markdown", "jsonable", "answer", "response_curve", "ALPHA"]

ALPHA = 0.05  # "within noise": a two-sided Welch test at this level does not separate them


def _is_inf(p: Any) -> bool:
    return p == math.inf or p == "inf"


def answer(rows: list[Mapping[str, Any]], alpha: float = ALPHA) -> dict[str, Any]:
    """"Which p": the confirmation rows (one per distinct p, each at its best lr) -> the answer.

    ``best_finite``: the finite p with the lowest mean final val loss over its completed
    seeds, with its 95% t-interval. ``p_range``: [min, max] of the finite p whose Welch test
    against the best does not reject at ``alpha`` (the best included): the "+-" of the best
    p, in p itself. ``inf``: p = inf's row, its difference to the best finite p (inf - best,
    Welch 95% CI and p-value) and ``within_noise`` (p >= alpha; ``None`` with < 2 seeds a
    side). Welch, not paired: confirmation seeds of different p share seed numbers but not a
    trajectory, and Welch does not assume equal spreads.
    """
    from orchestrator.analysis.stats import welch

    ok = [r for r in rows if r["n"] and not math.isnan(r["mean"])]
    finite = sorted((r for r in ok if not _is_inf(r["p"])), key=lambda r: r["mean"])
    out: dict[str, Any] = {"best_finite": None, "p_range": None, "inf": None, "alpha": alpha}
    best = finite[0] if finite else None
    if best is not None:
        out["best_finite"] = {k: best[k] for k in ("p", "lr", "mean", "lo", "hi", "n")}
        close = [r["p"] for r in finite
                 if r is best or not welch(r["losses"], best["losses"]).p < alpha]
        out["p_range"] = [min(close), max(close)]
    inf = next((r for r in ok if _is_inf(r["p"])), None)
    if inf is not None:
        d = {k: inf[k] for k in ("lr", "mean", "lo", "hi", "n")}
        if best is not None:
            w = welch(inf["losses"], best["losses"])
            d.update(diff=w.mean, diff_lo=w.lo, diff_hi=w.hi, welch_p=w.p,
                     within_noise=None if math.isnan(w.p) else bool(w.p >= alpha))
        out["inf"] = d
    return out


def response_curve(rows: list[Mapping[str, Any]], path: Path) -> Path:
    """Best-lr final val loss vs p with 95% CIs (one point per confirmed p), inf at the right
    behind an axis break."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = [r for r in rows if r["n"] and not math.isnan(r["mean"])]
    fin = sorted((r for r in ok if not _is_inf(r["p"])), key=lambda r: r["p"])
    inf = [r for r in ok if _is_inf(r["p"])]
    fig = Figure(figsize=(6.4, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs = [math.log2(r["p"]) for r in fin]
    x_inf = max([6.0, *xs]) + 1.5

    def err(r: Mapping[str, Any]) -> list[float]:
        return [0.0, 0.0] if math.isnan(r["lo"]) else [r["mean"] - r["lo"], r["hi"] - r["mean"]]

    if fin:
        ax.errorbar(xs, [r["mean"] for r in fin], yerr=list(zip(*map(err, fin))), fmt="o-",
                    capsize=3, label="finite p (95% CI over seeds)")
    for r in inf:
        ax.errorbar([x_inf], [r["mean"]], yerr=[[v] for v in err(r)], fmt="s", color="C3",
                    capsize=3, label="p = inf (GeoNorm)")
    ax.axvline(x_inf - 0.75, color="0.6", linestyle=(0, (4, 3)))  # the axis break
    ax.text(x_inf - 0.75, 1.0, "//", transform=ax.get_xaxis_transform(), ha="center",
            va="center", fontsize=12, backgroundcolor="white")
    ticks = sorted({round(v) for v in xs} | {-2, 6})
    ax.set_xlim(min([-2.0, *xs]) - 0.5, x_inf + 0.5)
    ax.set_xticks([*ticks, x_inf], [*(f"{2.0 ** t:g}" for t in ticks), "inf"])
    ax.set_xlabel("p (log scale; axis break before inf)")
    ax.set_ylabel("final val loss at the best lr")
    ax.set_title("response curve: which p")
    if ok:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


MIN_CLASS = 3  # diverged and stable finite-p trials a boundary fit needs, each


def _fit_points(obs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in obs if o["p"] is not None and o["lr"] and o["lr"] > 0
            and math.isfinite(o["p"]) and o["status"] in ("completed", "stopped", "diverged")]


def boundary_note(obs: list[dict[str, Any]]) -> str | None:
    """Why no boundary is fitted (None: it is): fewer than ``MIN_CLASS`` diverged or stable
    finite-p trials cannot place a line (1 diverged trial in 6 put itself on the stable side
    and a line far outside the searched range: issue 33 §3)."""
    pts = _fit_points(obs)
    k = sum(o["status"] == "diverged" for o in pts)
    if k >= MIN_CLASS and len(pts) - k >= MIN_CLASS:
        return None
    return (f"no boundary drawn: {k} diverged and {len(pts) - k} stable finite-p trials; a "
            f"fit needs {MIN_CLASS} of each")


def divergence_boundary(obs: list[dict[str, Any]], c: float = 1.0) -> dict[str, float] | None:
    """Logistic regression of diverged (1) vs not (0) on (log2 p, log10 lr), finite p only.

    Returns ``{"b0", "b_p", "b_lr"}`` with P(diverged) = sigmoid(b0 + b_p log2 p + b_lr
    log10 lr); the drawn boundary is P = 1/2 (lr at which p starts to diverge). L2-regularised
    (``c``: sklearn's inverse strength) so that a perfectly separable small sample still gives
    a finite, centred line. ``None`` with fewer than ``MIN_CLASS`` diverged or stable trials
    (``boundary_note`` says so)."""
    if boundary_note(obs) is not None:
        return None
    pts = _fit_points(obs)
    y = [o["status"] == "diverged" for o in pts]
    import numpy as np
    from scipy.optimize import minimize

    x = np.array([[1.0, math.log2(o["p"]), math.log10(o["lr"])] for o in pts])
    t = np.array(y, dtype=float)

    def loss(b: np.ndarray) -> tuple[float, np.ndarray]:
        z = x @ b  # log loss + L2 on the slopes (not the intercept), as sklearn's C does
        nll = float(np.sum(np.logaddexp(0.0, z) - t * z))
        g = x.T @ (1.0 / (1.0 + np.exp(-z)) - t)
        reg = np.array([0.0, *b[1:]]) / c
        return nll + 0.5 * float(b[1:] @ b[1:]) / c, g + reg

    b = minimize(loss, np.zeros(3), jac=True, method="L-BFGS-B").x
    return {"b0": float(b[0]), "b_p": float(b[1]), "b_lr": float(b[2])}


def divergence_map(obs: list[dict[str, Any]], path: Path) -> Path:
    """log2 p vs log10 lr: x = diverged, colour = final val loss, p = inf at the right, and
    the stable region's boundary (``divergence_boundary``, P(diverged) = 1/2) as a line."""
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
    fit = divergence_boundary(obs)
    fin_pts = _fit_points(obs)
    if fit is not None and abs(fit["b_lr"]) > 1e-9:  # only inside the searched (p, lr) box
        x0 = min(math.log2(o["p"]) for o in fin_pts)
        x1 = max(math.log2(o["p"]) for o in fin_pts)
        xs = [x0 + i * (x1 - x0) / 50 for i in range(51)]
        n_div = sum(o["status"] == "diverged" for o in fin_pts)
        for prob, style, lw, lab in ((0.5, "--", 1.2, f"P(diverged) = 1/2 (logistic fit, "
                                      f"{len(fin_pts)} trials, {n_div} diverged)"),
                                     (0.1, ":", 0.8, "P = 0.1 and 0.9"), (0.9, ":", 0.8, None)):
            z = math.log(prob / (1 - prob))
            ax.plot(xs, [(z - fit["b0"] - fit["b_p"] * x) / fit["b_lr"] for x in xs], "r",
                    ls=style, lw=lw, label=lab)
    else:
        note = boundary_note(obs) or "no boundary drawn: the fit has no lr dependence"
        ax.text(0.02, 0.02, note, transform=ax.transAxes, fontsize=7, color="0.3",
                ha="left", va="bottom")
    lrs = [math.log10(o["lr"]) for o in pts]
    if lrs:  # the searched lr range (a fitted line never stretches the axis)
        pad = 0.08 * (max(lrs) - min(lrs) or 1.0)
        ax.set_ylim(min(lrs) - pad, max(lrs) + pad)
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
    a = getattr(res, "answer", None) or {}
    bf = a.get("best_finite")
    if bf is not None:
        lo, hi = a["p_range"]
        lines += ["", f"**Best finite p = {_fmt_p(bf['p'])}** (lr {bf['lr']:.3g}): final val "
                  f"loss {bf['mean']:.4f}, 95% CI {_fmt_ci(bf)} over {bf['n']} seeds; finite p "
                  f"within noise of it (Welch, alpha {a['alpha']}): [{_fmt_p(lo)}, {_fmt_p(hi)}]"]
    inf = a.get("inf")
    if inf is not None and "diff" in inf:
        verdict = {True: "within noise of", False: "distinguishable from",
                   None: "not comparable (< 2 seeds) with"}[inf["within_noise"]]
        diff = "-" if math.isnan(inf["diff"]) else f"{inf['diff']:+.4f}"
        ci = "" if math.isnan(inf["diff_lo"]) else \
            f", 95% CI [{inf['diff_lo']:+.4f}, {inf['diff_hi']:+.4f}]"
        pv = "" if math.isnan(inf["welch_p"]) else f", Welch p = {inf['welch_p']:.3g}"
        lines.append(f"**p = inf is {verdict} the best finite p**: inf - best = {diff}{ci}{pv}")
    lines += ["", "![response curve](response_curve.png)"]
    lines += ["", "| rank | p | lr | mean final val loss | 95% CI | completed seeds | diverged |",
              "|---:|---:|---:|---:|---|---:|---:|"]
    for i, r in enumerate(([b] if b else []) + res.runners_up, 1):
        mean = "-" if math.isnan(r["mean"]) else f"{r['mean']:.4f}"
        lines.append(f"| {i} | {_fmt_p(r['p'])} | {r['lr']:.3g} | {mean} | {_fmt_ci(r)} | "
                     f"{r['n']} | {r['n_diverged']} |")
    div = [o for o in res.stage1 if o["status"] == "diverged"]
    lines += ["", "## Where (p, lr) diverged", "",
              f"{len(div)} of {len(res.stage1)} search trials diverged "
              "(each told to the sampler as a violated constraint `diverged`, with its penalty "
              "value; ASHA-stopped trials as PRUNED). "
              + (boundary_note(res.stage1).capitalize() + "." if boundary_note(res.stage1) else
                 "The dashed line is the boundary of the stable region: a logistic regression "
                 "of diverged vs not on (log2 p, log10 lr) over the finite-p trials, "
                 "P(diverged) = 1/2, drawn inside the searched range, with P = 0.1 and 0.9 "
                 "dotted (how sharp the fit is, not its uncertainty)."), "",
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
