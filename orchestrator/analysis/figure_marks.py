"""Marks the report's figures share so that none draws what the data cannot support.

- ``diverged_strip``: diverged trials have no loss (their objective is a penalty, a val loss
  before the divergence is not their result), so they are drawn in a labelled band above the
  data, never at a y value on the loss axis.
- ``value_ticks``: tick positions on a positive (log) axis that never overlap: the values
  themselves when they are few and far apart (a grid), else powers of 2 or 10.
- ``fmt_value``: 3 significant digits (``0.00142``, ``10.7``, ``inf``), as tick labels read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["diverged_strip", "value_ticks", "fmt_value", "STRIP_LABEL"]

STRIP_LABEL = "diverged (no loss)"


def fmt_value(v: float) -> str:
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.3g}"


def diverged_strip(ax, lo: float, hi: float, frac: float = 0.14,
                   label: str = STRIP_LABEL) -> float:
    """Give ``ax`` a band above the data range ``[lo, hi]`` (a ``frac`` of it), separated by a
    dashed line and labelled; returns the band's middle y, where diverged marks go."""
    span = hi - lo if hi > lo else max(abs(hi), 1.0) * 0.1
    pad = 0.06 * span
    top = hi + pad
    band = frac * span
    ax.set_ylim(lo - pad, top + band)
    from matplotlib.ticker import MaxNLocator

    ticks = MaxNLocator(nbins=6).tick_values(lo - pad, top)
    ax.set_yticks([t for t in ticks if lo - pad <= t <= top])  # no loss value in the band
    ax.axhline(top, color="0.55", ls="--", lw=0.8)
    ax.text(0.01, top + 0.5 * band, label, transform=ax.get_yaxis_transform(), ha="left",
            va="center", fontsize=7, color="0.35")
    return top + 0.5 * band


def value_ticks(values: Sequence[float], max_ticks: int = 7) -> list[float]:
    """Ticks for a log axis holding ``values`` (finite, > 0): every value when there are at
    most ``max_ticks`` of them at least a factor 1.5 apart, else powers of 2 (of 10 when the
    range spans more than 2**12), thinned to at most ``max_ticks``."""
    v = np.unique(np.asarray([x for x in values if math.isfinite(x) and x > 0], dtype=float))
    if not len(v):
        return []
    if len(v) <= max_ticks and (len(v) < 2 or float(np.min(v[1:] / v[:-1])) >= 1.5):
        return [float(x) for x in v]
    lo, hi = float(v[0]), float(v[-1])
    base = 10.0 if hi / lo > 2.0 ** 12 else 2.0
    k0, k1 = math.floor(math.log(lo, base) + 1e-9), math.ceil(math.log(hi, base) - 1e-9)
    ks = list(range(k0, k1 + 1))
    step = max(1, math.ceil(len(ks) / max_ticks))
    return [base ** k for k in ks[::step]]
