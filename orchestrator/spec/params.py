"""One parameter of a sweep's space (``Param``), its values, and the exact expansion of a space.

Shared by the spec (``orchestrator/spec/sweep_spec.py`` validates every combination) and the search
(``orchestrator/sweep/space.py`` builds Tune/Optuna spaces), so neither imports the other.
``P_KEY`` is the one place that names the retraction exponent p: the key that may be ``inf``,
that the Tune callback tags and the analysis and search-p plot on a log axis.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workloads.config import parse_p

__all__ = ["Param", "KINDS", "P_KEY", "SEED_KEY", "expand", "holds", "strict", "scalar", "ident",
           "fmt", "arm_label"]

KINDS = ("grid", "choice", "uniform", "loguniform", "int")
P_KEY = "model.residual.p"
SEED_KEY = "train.seed"


def strict() -> ConfigDict:
    return ConfigDict(extra="forbid", strict=True, ser_json_inf_nan="constants")


def scalar(v: Any, where: str) -> Any:
    """A space value: str, bool, int or float; the strings inf/.inf mean math.inf."""
    v = parse_p(v)
    if isinstance(v, float) and v != v:
        raise ValueError(f"{where}: NaN is not a valid value")
    if not isinstance(v, (str, bool, int, float)):
        raise ValueError(f"{where}: values must be strings, numbers or booleans, got {v!r}")
    return v


def ident(v: Any) -> tuple[str, Any]:
    """Identity of a space value: 1 and 1.0 are the same number, True is not 1."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return ("num", float(v))
    return (type(v).__name__, v)


def fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "inf" if v == math.inf else f"{v:.6g}"
    return str(v)


class Param(BaseModel):
    """One distribution: exactly one of ``grid | choice | uniform | loguniform | int``.

    ``int`` bounds are inclusive. ``also`` adds special values (``inf`` for p) to any kind;
    ``also_weight`` is the prior weight of each ``also`` value in intervals of the regular
    distribution (one octave of a loguniform range: orchestrator/sweep/also_axis.py), so by
    default p = inf is as likely as p in [32, 64], not 1/2. ``when`` makes the parameter exist
    only where earlier space keys take the given value(s).
    """

    model_config = strict()

    grid: list[Any] | None = None
    choice: list[Any] | None = None
    uniform: list[float] | None = None
    loguniform: list[float] | None = None
    int: list[builtins.int] | None = None  # the YAML word; builtins: the name shadows int
    also: list[Any] = Field(default_factory=list)
    also_weight: float = 1.0
    when: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> Param:
        given = [k for k in KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"needs exactly one of {', '.join(KINDS)}, got "
                             f"{', '.join(given) or 'none'}")
        kind = given[0]
        vals = getattr(self, kind)
        if kind in ("grid", "choice"):
            vals = [scalar(v, kind) for v in vals]
            if not vals:
                raise ValueError(f"{kind} needs at least one value")
            if len(set(map(ident, vals))) != len(vals):
                raise ValueError(f"{kind} values must be distinct, got {vals}")
            setattr(self, kind, vals)
        else:
            if len(vals) != 2:
                raise ValueError(f"{kind} needs [low, high], got {vals}")
            low, high = vals
            if kind == "int" and any(isinstance(v, bool) for v in vals):
                raise ValueError(f"int bounds must be integers, got {vals}")
            if not all(math.isfinite(v) for v in vals):
                raise ValueError(f"{kind} bounds must be finite (use also: [inf]), got {vals}")
            if kind == "loguniform" and not low > 0:
                raise ValueError(f"loguniform low must be > 0, got {fmt(low)}")
            if not low < high:
                raise ValueError(f"{kind} low must be < high, got [{fmt(low)}, {fmt(high)}]")
        self.also = [scalar(v, "also") for v in self.also]
        if not (math.isfinite(self.also_weight) and self.also_weight > 0):
            raise ValueError(f"also_weight must be a finite number > 0, got {self.also_weight}")
        if set(map(ident, self.also)) & set(map(ident, self.values())):
            raise ValueError(f"also repeats a {kind} value: {self.also}")
        when = {}
        for k, v in self.when.items():
            v = list(v) if isinstance(v, list) else [v]
            if not v:
                raise ValueError(f"when.{k} needs at least one value")
            when[k] = [scalar(x, f"when.{k}") for x in v]
        self.when = when
        return self

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) is not None)

    @property
    def discrete(self) -> bool:
        return self.kind in ("grid", "choice")

    def values(self) -> list[Any]:
        """grid/choice values (``also`` excluded)."""
        return list(getattr(self, self.kind)) if self.discrete else []

    def candidates(self) -> list[Any]:
        """Values that stand for the whole distribution when checking it: bounds, also."""
        own = self.values() if self.discrete else list(getattr(self, self.kind))
        return own + list(self.also)


# --- conditions and exact expansion ---------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    """Equality that keeps True apart from 1 (and 'inf' apart from nothing: values are parsed)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def holds(p: Param, trial: Mapping[str, Any]) -> bool:
    return all(k in trial and trial[k] is not None and any(_same(trial[k], v) for v in vals)
               for k, vals in p.when.items())


def expand(space: Mapping[str, Param], values_of: Callable[[Param], list[Any]],
           seeds: list[int]) -> list[dict[str, Any]]:
    """Cartesian product of ``values_of(param)`` in space order x seeds (outermost).

    A conditional param is absent where its condition fails; duplicates are dropped, first
    occurrence kept. Seeds are the outer loop so that every arm's first seed runs first.
    """
    arms: list[dict[str, Any]] = [{}]
    for key, p in space.items():
        grown: list[dict[str, Any]] = []
        for a in arms:
            if holds(p, a):
                grown.extend({**a, key: v} for v in values_of(p))
            else:
                grown.append(a)  # the condition fails: the param is absent from this arm
        arms = grown
    out, seen = [], set()
    for s in seeds:
        for a in arms:
            trial = {**a, "train.seed": s}
            sig = tuple(sorted((k, type(v).__name__, v) for k, v in trial.items()))
            if sig not in seen:
                seen.add(sig)
                out.append(trial)
    return out


def arm_label(flat: Mapping[str, Any], space_keys: list[str]) -> str:
    """``key=value`` pairs without the seed, space keys first in space order; ``base`` when
    empty. A plain function of plain values, so a trial computes it without the spec."""
    order = [k for k in space_keys if k in flat]
    order += sorted(k for k in flat if k not in space_keys and k != SEED_KEY)
    return ",".join(f"{k}={fmt(flat[k])}" for k in order) or "base"
