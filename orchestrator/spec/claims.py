"""A paper's claim as a spec declares it (``claims:`` in a sweep YAML), for `geosweep report`.

One claim compares two arms of the sweep on one per-trial value and says what the paper found:
which arm should be lower or higher, by how much (``effect``, in the metric's units), after how
many steps, and which controls must pass (orchestrator/analysis/verdicts.py applies the rule).
Arms are picked by their parameter values (``arm`` / ``baseline``: dotted space keys ->
values), so a claim survives a reordered space.

Whose claim it is (``source``, issue 30):
- ``paper``: the paper's metric, arms and direction (and its effect where it gives one,
  ``effect_source: paper``). Always reported on that metric: a metric control that flags it
  is shown beside the number, never instead of it.
- ``proxy``: ours (our metric, arm or reading of the paper), with the ``reason`` it exists. A
  failing control withholds its answers.

Values compared:
- a trials column (``final_val_loss``, ``cont/resid_top1_mean``, ``inst/sigma_max_q``, ...);
- ``diverged``: the share of an arm's seeds that diverged (compared by Fisher's exact test);
- ``ROW[m1,m2,...]``: a metrics-table row (``w.top1_v[q,k,gate,up]``) averaged over those
  modules and every layer at each trial's last metrics step.
``versus: METRIC`` compares two values within the same trials (paired by trial) instead of two
arms: ``baseline`` is then empty and ``arm`` may be empty (every trial of the sweep).
``signals``: further values (``{metric, direction}``) whose direction answer is reported beside
the claim's, e.g. the links of a mechanism (Paper B's sigma_max -> logits -> entropy).

Controls (docs/science.md §4.5 and §4.3 M2), evaluated for each arm; the failing arm is named:
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
  gradient metrics, ``ones_*`` for weights). The centred metrics (``*ctop1*``,
  workloads/metrics/centred.py) are blind to that direction and refuse it.
- ``saturation``: SpheretNorm/GeoNorm's share of tokens whose normalised step beta exceeds pi/2
  (``stream/frac_beta_gt_half_pi_max``, worst sublayer, at the end) above ``saturation_max``:
  every sublayer overwrites the stream instead of turning it (arms without the column pass).
- ``outgrew_init``: the cumulative update ||W_t - W_0|| / ||W_0|| (``cont/rel_change_mean``)
  at least 1 at the end, Paper C's condition for its transformer claim.
Always applied, whatever ``controls`` lists: enough completed seeds, ``min_steps``, at most
``max_diverged_share`` of an arm's seeds diverged (no verdict rests on survivors), and "did it
train" for every loss claim (``final_val_loss`` clearly below the data's frequency baseline;
orchestrator/analysis/claim_controls.py).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from orchestrator.spec.params import strict

__all__ = ["Claim", "Signal", "CONTROLS", "METRIC_CONTROLS", "DIVERGED", "parse_rows_metric"]

CONTROLS = ("first_loss", "small_gap", "ones", "saturation", "outgrew_init")
# controls that qualify what the metric means: beside a paper claim's number, blocking a proxy's
METRIC_CONTROLS = ("first_loss", "small_gap", "ones", "saturation")
DIVERGED = "diverged"  # the per-trial 0/1 value "this seed diverged"
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")
_ROWS = re.compile(r"^([A-Za-z0-9_.]+)\[([A-Za-z0-9_]+(?:,[A-Za-z0-9_]+)*)\]$")
Control = Literal["first_loss", "small_gap", "ones", "saturation", "outgrew_init"]


def parse_rows_metric(metric: str) -> tuple[str, list[str]] | None:
    """``"w.top1_v[q,k]"`` -> ``("w.top1_v", ["q", "k"])``; None for a trials column."""
    m = _ROWS.match(metric.replace(" ", ""))
    return (m.group(1), m.group(2).split(",")) if m else None


class Signal(BaseModel):
    """A further value whose direction the verdict reports beside the claim's."""

    model_config = strict()

    metric: str = Field(min_length=1)
    direction: Literal["lower", "higher"]


class Claim(BaseModel):
    model_config = strict()

    id: str
    paper: str = Field(min_length=1)  # the paper's name and arXiv id, e.g. "Paper B (2606.13276)"
    source: Literal["paper", "proxy"]  # whose claim this is (module docstring)
    reason: str | None = None  # proxy: why it exists (what of the paper it stands in for)
    text: str = Field(min_length=1)
    metric: str = Field(min_length=1)  # a trials column, ``diverged`` or ``ROW[modules]``
    arm: dict[str, Any]  # space key -> value; must pick exactly one arm of the sweep
    baseline: dict[str, Any] = Field(default_factory=dict)  # empty only with ``versus``
    versus: str | None = None  # a second value of the same trials (instead of a baseline arm)
    direction: Literal["lower", "higher"]  # arm - baseline has this sign in the paper
    effect: float = Field(gt=0)  # |arm - baseline| the paper reports (metric units)
    # "paper": the number is the paper's; "design": the paper gives no number and this is the
    # smallest effect we call meaningful (say why in ``text``)
    effect_source: Literal["paper", "design"] = "paper"
    # the smallest effect of interest: "no effect of the claimed size" needs the interval inside
    # +-this (equivalence); default: the effect itself when it is ours (design), else none
    smallest_effect: float | None = Field(None, gt=0)
    min_steps: int = Field(1, ge=1)  # every compared trial must have run at least this long
    controls: list[Control] = Field(default_factory=list)
    signals: list[Signal] = Field(default_factory=list)
    n_classes: int | None = Field(None, ge=2)  # first_loss: ln(n_classes) is the target
    first_loss_tol: float = Field(0.5, gt=0)  # |first / ln(n) - 1| above this fails
    ones_max: float = Field(0.3, gt=0, lt=1)  # all-ones |cos| above this fails
    saturation_max: float = Field(0.5, gt=0, lt=1)  # share of tokens with beta > pi/2
    # an arm that lost more than this share of its seeds to divergence gives no verdict on
    # its survivors (the rates and their Fisher comparison are still reported)
    max_diverged_share: float = Field(0.2, ge=0, lt=1)
    alpha: float = Field(0.05, gt=0, lt=0.5)
    power: float = Field(0.8, gt=0.5, lt=1)

    @model_validator(mode="after")
    def _check(self) -> Claim:
        if not _ID.match(self.id):
            raise ValueError(f"id: {self.id!r} must be 1-40 characters of A-Z a-z 0-9 _ . -")
        if self.source == "proxy" and not (self.reason or "").strip():
            raise ValueError(f"{self.id}: a proxy claim needs a reason (what of the paper it "
                             "stands in for, and why ours)")
        if self.versus is not None:
            if self.baseline:
                raise ValueError(f"{self.id}: versus compares two values of the same trials; "
                                 "drop baseline")
            if self.versus == self.metric or DIVERGED in (self.metric, self.versus):
                raise ValueError(f"{self.id}: versus must be another per-trial value than "
                                 f"metric ({self.metric}), not diverged")
        elif not self.arm or not self.baseline:
            raise ValueError(f"{self.id}: arm and baseline must each name at least one "
                             "space key and value (or give versus)")
        elif self.arm == self.baseline:
            raise ValueError(f"{self.id}: arm and baseline pick the same arm")
        for m in (self.metric, self.versus, *(g.metric for g in self.signals)):
            if m is not None and "[" in m and parse_rows_metric(m) is None:
                raise ValueError(f"{self.id}: {m!r} is not ROW[module,...] (e.g. "
                                 "w.top1_v[q,k,gate,up])")
        if self.metric == DIVERGED and set(self.controls) & {"small_gap", "ones"}:
            raise ValueError(f"{self.id}: a divergence-rate claim has no singular vectors to "
                             "control: drop small_gap / ones")
        if "ones" in self.controls and "ctop1" in self.metric:
            raise ValueError(f"{self.id}: {self.metric} is the all-ones-blind metric (its "
                             "vectors are orthogonal to all-ones by construction): drop the "
                             "'ones' control")
        if "first_loss" in self.controls and self.n_classes is None:
            raise ValueError(f"{self.id}: the first_loss control needs n_classes "
                             "(10 for MNIST, the vocabulary size for a GPT)")
        return self
