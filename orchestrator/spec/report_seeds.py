"""Two small spec sections of issue 17: ``report`` (the named baseline) and ``seeds: auto``.

``report: {baseline: ARM}``: the arm the report compares every other arm with, an arm label
or a mapping of space keys to values (orchestrator/analysis/baseline.py resolves it).

``seeds: {auto: true, min: 2, max: 8, effect: 0.02}``: the sweep starts with ``min`` seeds
(0 .. min-1), and ``geosweep resume DIR --until-decided`` adds seeds, one round at a time, to
the arms whose comparison with the baseline is still undecided, until decided or ``max``
seeds (orchestrator/analysis/decide.py). ``effect``: the smallest difference of the metric
worth detecting; a comparison whose MDE is at or below it is decided even when its CI holds 0.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = ["ReportSpec", "AutoSeeds"]


class ReportSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    baseline: str | dict[str, Any] | None = None


class AutoSeeds(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    auto: bool = True
    min: int = 2
    max: int = 8
    effect: float = 0.02
    alpha: float = 0.05
    power: float = 0.8
    per_round: int = 1

    @model_validator(mode="after")
    def _check(self) -> AutoSeeds:
        if not self.auto:
            raise ValueError("auto: must be true (give an int or a list of seeds otherwise)")
        if not 2 <= self.min <= self.max <= 10_000:
            raise ValueError(f"needs 2 <= min <= max <= 10000, got min={self.min}, "
                             f"max={self.max}")
        if not self.effect > 0:
            raise ValueError(f"effect: must be > 0 (the smallest difference worth detecting), "
                             f"got {self.effect}")
        if not (0 < self.alpha < 1 and 0 < self.power < 1):
            raise ValueError(f"alpha and power must be in (0, 1), got {self.alpha}, "
                             f"{self.power}")
        if self.per_round < 1:
            raise ValueError(f"per_round: must be >= 1, got {self.per_round}")
        return self
