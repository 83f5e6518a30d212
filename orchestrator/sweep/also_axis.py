"""The prior weight of a parameter's ``also`` values (``p = inf``): pure functions.

issue 17 §3: ``also: [inf]`` used to be drawn with probability 1/2 (a categorical switch
"regular or inf"), so 5 of 8 quickstart samples were p = inf. Now each ``also`` value weighs
``also_weight`` *intervals* of the regular distribution:

- loguniform: one interval = one octave (a factor 2): p in [0.25, 64] is 8 octaves, so with
  the default weight 1, P(p = inf) = 1 / 9, as likely as p in [32, 64] (inf sits at the top
  end of the log axis, one octave beyond 64);
- choice / grid: one interval = one value (inf as likely as each listed value);
- int: one interval = one integer; uniform: one interval = an eighth of the range (a
  uniform range has no natural unit; eight matches the octaves of the shipped p range).

Optuna (``space.DefineByRun``): a loguniform parameter with ``also`` is one float axis
``u = log2 x`` on ``[log2 lo, log2 hi + w * len(also)]`` (``axis_bounds``), suggested as
``trial/<key>:axis``; the slice above ``log2 hi`` maps to the ``also`` values
(``axis_decode``). TPE/GP then see inf as the neighbour of the largest p, which is what it is
for the retraction (docs/science.md: p -> inf is GeoNorm), and the prior is the weight above.
Other kinds keep Optuna's categorical switch (its prior is the sampler's, not ours).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.spec.params import Param

__all__ = ["UNIFORM_INTERVALS", "regular_intervals", "also_probability", "axis_bounds",
           "axis_decode", "uses_axis"]

UNIFORM_INTERVALS = 8.0


def regular_intervals(p: Param) -> float:
    """How many intervals the regular (non-``also``) distribution of ``p`` spans."""
    kind = p.kind
    if kind in ("grid", "choice"):
        return float(len(p.values()))
    if kind == "loguniform":
        lo, hi = p.loguniform
        return math.log2(hi / lo)
    if kind == "int":
        return float(p.int[1] - p.int[0] + 1)
    return UNIFORM_INTERVALS


def also_probability(p: Param) -> float:
    """Prior probability of EACH ``also`` value: w / (N + w * len(also)); 0 without also."""
    if not p.also:
        return 0.0
    w = p.also_weight
    return w / (regular_intervals(p) + w * len(p.also))


def uses_axis(p: Param) -> bool:
    """Whether Optuna draws ``p`` as one extended log axis (else: the categorical switch)."""
    return p.kind == "loguniform" and bool(p.also)


def axis_bounds(p: Param) -> tuple[float, float]:
    """``[log2 lo, log2 hi + w * len(also)]``: the extended log2 axis of ``p``."""
    lo, hi = p.loguniform
    return math.log2(lo), math.log2(hi) + p.also_weight * len(p.also)


def axis_decode(p: Param, u: float) -> Any:
    """A point of the extended axis -> the value: 2**u inside the range, else an ``also``."""
    lo, hi = p.loguniform
    top = math.log2(hi)
    if u <= top:
        return min(max(2.0 ** u, lo), hi)  # clamp the float round trip to the bounds
    i = int((u - top) / p.also_weight)
    return p.also[min(i, len(p.also) - 1)]
