"""What the training loop hands to the outside world, without knowing who listens.

The loop calls ``report(Report)`` every ``train.eval_every`` steps and once at the end; the
orchestrator forwards it to Ray, a plain ``geosweep train`` prints it. Per-step values are
batched into ``curve`` so nothing is lost between reports. The loop asks a ``StepMonitor``
after every optimizer step whether training has diverged (rules live in the orchestrator).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["CurvePoint", "Report", "StepInfo", "StepMonitor", "Divergence"]


@dataclass
class CurvePoint:
    step: int
    split: str  # train | val
    metric: str  # loss | lr | grad_norm | tokens_per_s | acc | ...
    value: float
    wall_time: float  # seconds since the run (not the process) started


@dataclass
class Divergence:
    # nonfinite_loss | nonfinite_grad | loss_vs_best | loss_vs_initial | grad_explosion | ...
    reason: str  # the rule that fired
    step: int
    detail: str = ""  # e.g. "loss=13.2 > 12.8"
    value: float | None = None  # the value that crossed the rule's bound


@dataclass
class Report:
    step: int  # optimizer steps completed
    scalars: dict[str, float]  # latest summary values, e.g. {"train/loss": .., "val/loss": ..}
    curve: list[CurvePoint] = field(default_factory=list)  # everything since the last report
    rows: list[dict[str, Any]] = field(default_factory=list)  # tidy metric rows (see metrics/)
    checkpoint: str | None = None  # folder of a checkpoint written at this step
    done: bool = False
    divergence: Divergence | None = None
    rank: int = 0
    world_size: int = 1


@dataclass
class StepInfo:
    step: int
    loss: float
    grad_norm: float  # global norm before clipping (inf/nan when non-finite)
    lr: float
    # only what the monitor's ``signals(step)`` asked for: max_logit | sigma_max_q | update_ratio
    extras: dict[str, float] = field(default_factory=dict)
    param_max: float | None = None  # max |parameter| after the step; inf/nan if any is
    chance_loss: float | None = None  # ln(classes): the loss of the uniform predictor


class StepMonitor(Protocol):
    """Asked after every optimizer step; returns a Divergence to stop the run at once.

    Optional (the loop looks them up with ``getattr``): ``signals(step) -> set[str]``, the
    ``StepInfo.extras`` to measure for that step (measured only when asked: they cost a probe
    forward or an SVD), and ``check_eval(step, val_loss, final) -> Divergence | None``, asked
    after every eval (``final``: the last one of the run).
    """

    def check(self, info: StepInfo) -> Divergence | None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...
