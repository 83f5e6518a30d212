"""The sweep spec's simple sections (workload, search, scheduler, budget, resources, tracking).

Split out of orchestrator/spec/sweep_spec.py to keep files small; ``SweepSpec`` there composes them
and re-exports every name, so ``from orchestrator.spec.sweep_spec import Budget`` still works.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from orchestrator.spec.params import strict
from workloads.config import PRESETS

__all__ = ["Workload", "Search", "Scheduler", "Budget", "Resources", "Tracking"]


class Workload(BaseModel):
    model_config = strict()

    preset: str
    overrides: dict[str, Any] = Field(default_factory=dict)

    @field_validator("preset")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in PRESETS:
            raise ValueError(f"unknown preset {v!r}; valid: {', '.join(PRESETS)}")
        return v


class Search(BaseModel):
    model_config = strict()

    algorithm: Literal["grid", "random", "optuna-tpe", "optuna-gp"] = "grid"
    num_samples: int = Field(1, ge=1, le=100_000)  # as --num-samples and a grid's trials
    max_concurrent: int = Field(1, ge=1)
    metric: str = Field("val/loss", min_length=1)
    mode: Literal["min", "max"] = "min"
    seed: int = Field(0, ge=0, lt=2**32)  # the sampler's seed (random, TPE/GP), not a trial's


class Scheduler(BaseModel):
    """ASHA in training steps (Tune ``time_attr="step"``); unset values come from the budget."""

    model_config = strict()

    type: Literal["none", "asha"] = "none"
    grace_period: int | None = Field(None, ge=1)
    reduction_factor: float | None = Field(None, gt=1)
    max_t: int | None = Field(None, ge=1)


class Budget(BaseModel):
    """Mapped onto train.steps / eval_every / metrics_every / checkpoint_every / curve_every;
    unset: the preset's, except checkpoint_every: unset (and 0 in the preset and overrides) it
    becomes the multiple of eval_every nearest steps / 10, so that a killed worker resumes its
    trial from a recent checkpoint (checkpoints are taken at reports only). 0 turns them off
    (the final checkpoint stays). curve_every k > 1 stores every k-th step's train curve: a
    k-th of the driver's per-step cost (docs/platform.md), no spike count (docs/contracts.md)."""

    model_config = strict()

    steps: int | None = Field(None, ge=1)
    eval_every: int | None = Field(None, ge=1)
    metrics_every: int | None = Field(None, ge=0)
    checkpoint_every: int | None = Field(None, ge=0)
    # the per-step train curve every k steps (and at every report); 0: at reports only
    curve_every: int | None = Field(None, ge=0)


class Resources(BaseModel):
    model_config = strict()

    workers_per_trial: int = Field(1, ge=1)
    cpus_per_worker: float = Field(1.0, gt=0)
    gpus_per_worker: float = Field(0.0, ge=0)
    custom: dict[str, float] = Field(default_factory=dict)  # Ray custom resources per worker
    executor: Literal["auto", "in_trial", "train"] = "auto"
    max_failures: int = Field(1, ge=0)  # infrastructure retries (Tune FailureConfig)

    @field_validator("gpus_per_worker")
    @classmethod
    def _whole(cls, v: float) -> float:
        if v > 1 and not float(v).is_integer():
            raise ValueError(f"above 1 must be a whole number (Ray), got {v}")
        return v

    @field_validator("custom")
    @classmethod
    def _custom(cls, d: dict[str, float]) -> dict[str, float]:
        for k, v in d.items():
            if k in ("CPU", "GPU", "memory", "object_store_memory") or not k:
                raise ValueError(f"{k!r} is not a custom resource name "
                                 "(use cpus_per_worker / gpus_per_worker)")
            if not v >= 0:
                raise ValueError(f"{k}: must be >= 0, got {v}")
        return d

    @model_validator(mode="after")
    def _check(self) -> Resources:
        if self.executor == "in_trial" and self.workers_per_trial > 1:
            raise ValueError(f"executor in_trial runs one worker, got workers_per_trial="
                             f"{self.workers_per_trial}; use train or auto")
        return self


class Tracking(BaseModel):
    model_config = strict()

    mlflow_uri: str | None = None
    parquet_root: str | None = None
    experiment: str | None = None
    # final model weights kept as MLflow artifacts (orchestrator/store/weights.py)
    keep_weights: Literal["best", "all", "none"] = "best"
