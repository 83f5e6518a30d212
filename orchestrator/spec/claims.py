"""A paper's claim as a spec declares it (``claims:`` in a sweep YAML), for `geosweep report`.

One claim compares two arms of the sweep on one per-trial value and says what the paper found:
which arm should be lower or higher, by how much (``effect``, in the metric's units), after how
many steps, and which controls must pass before the sweep may say "agrees" or "disagrees"
(orchestrator/analysis/verdicts.py applies the rule). Arms are picked by their parameter values
(``arm`` / ``baseline``: dotted space keys -> values), so a claim survives a reordered space.

Controls (docs/science.md §4.5 and §4.3 M2):
- ``first_loss``: every trial's first loss (``cont0/probe_loss``, else ``train/initial_loss``)
  within ``first_loss_tol`` (relative) of ln(``n_classes``); far above it the init, not the
  learning, sets every weight metric.
- ``small_gap``: most matrices with s1/s2 < 1.05 make top-1 singular vectors ill-defined. The
  gap is the one of the claim's matrices: ``w.s1_s2`` for weight metrics, ``gp.s1_s2`` for
  gradient ones, ``wc.s1_s2`` / ``gpc.s1_s2`` for the centred (``ctop1``) ones; at step 0 for a
  ``cont0/`` metric, else at each trial's last metrics step.
- ``ones``: the all-ones control above ``ones_max`` means top vectors lean to the all-ones
  direction (non-negative inputs), not continuity. It is the control of the claim's metric:
  the same time (``cont0/`` at step 0, ``cont/`` at the end) and vectors (``grad_ones_*`` for
  gradient metrics, ``ones_*`` for weights), worst side and arm. The centred metrics
  (``*ctop1*``, workloads/metrics/centred.py) are blind to that direction and refuse it.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from orchestrator.spec.params import strict

__all__ = ["Claim", "CONTROLS"]

CONTROLS = ("first_loss", "small_gap", "ones")
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")


class Claim(BaseModel):
    model_config = strict()

    id: str
    paper: str = Field(min_length=1)  # the paper's name and arXiv id, e.g. "Paper B (2606.13276)"
    text: str = Field(min_length=1)
    metric: str = Field(min_length=1)  # a trials column: final_val_loss, cont/resid_top1_mean, ...
    arm: dict[str, Any]  # space key -> value; must pick exactly one arm of the sweep
    baseline: dict[str, Any]
    direction: Literal["lower", "higher"]  # arm - baseline has this sign in the paper
    effect: float = Field(gt=0)  # |arm - baseline| the paper reports (metric units)
    # "paper": the number is the paper's; "design": the paper gives no number and this is the
    # smallest effect we call meaningful (say why in ``text``)
    effect_source: Literal["paper", "design"] = "paper"
    min_steps: int = Field(1, ge=1)  # every compared trial must have run at least this long
    controls: list[Literal["first_loss", "small_gap", "ones"]] = Field(default_factory=list)
    n_classes: int | None = Field(None, ge=2)  # first_loss: ln(n_classes) is the target
    first_loss_tol: float = Field(0.5, gt=0)  # |first / ln(n) - 1| above this fails
    ones_max: float = Field(0.3, gt=0, lt=1)  # all-ones |cos| above this fails
    alpha: float = Field(0.05, gt=0, lt=0.5)
    power: float = Field(0.8, gt=0.5, lt=1)

    @model_validator(mode="after")
    def _check(self) -> Claim:
        if not _ID.match(self.id):
            raise ValueError(f"id: {self.id!r} must be 1-40 characters of A-Z a-z 0-9 _ . -")
        if not self.arm or not self.baseline:
            raise ValueError(f"{self.id}: arm and baseline must each name at least one "
                             "space key and value")
        if self.arm == self.baseline:
            raise ValueError(f"{self.id}: arm and baseline pick the same arm")
        if "ones" in self.controls and "ctop1" in self.metric:
            raise ValueError(f"{self.id}: {self.metric} is the all-ones-blind metric (its "
                             "vectors are orthogonal to all-ones by construction): drop the "
                             "'ones' control")
        if "first_loss" in self.controls and self.n_classes is None:
            raise ValueError(f"{self.id}: the first_loss control needs n_classes "
                             "(10 for MNIST, the vocabulary size for a GPT)")
        return self
