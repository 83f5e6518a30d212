"""Early divergence rules, checked inside the worker after every optimizer step.

``DivergenceMonitor`` implements ``workloads.report.StepMonitor``: pure Python floats, O(1)
per step (the optional median rule sorts a small fixed window), no torch. Rules, in the
order they are checked (the first that fires names the reason):

- ``nonfinite_loss`` / ``nonfinite_grad``: the step's loss or global grad norm is NaN/inf.
  Fires at once.
- ``logit_bound``: ``StepInfo.extras["max_logit"] > max_logit`` (when both are set). At once.
- ``grad_explosion``: grad norm ``> grad_norm_max`` (absolute; at once), or, when
  ``grad_norm_factor_vs_median`` is set, ``> factor x`` the median of the last
  ``grad_norm_window`` finite grad norms for ``patience`` consecutive steps after warmup.
  The absolute bound is the default because early grad norms vary over orders of magnitude
  and clipping is common; the median rule is opt-in.
- ``loss_vs_initial``: after ``warmup_steps``, loss ``> initial + loss_margin_vs_initial``
  for ``patience`` consecutive steps. ``initial`` is the first finite loss seen (the loss
  of the untrained model, ~ln(vocab) for a language model).
- ``loss_vs_best``: after ``warmup_steps``, loss ``> loss_factor_vs_best x best`` and
  ``> best + loss_min_delta`` for ``patience`` consecutive steps. ``best`` is the minimum of
  a bias-corrected EMA of the loss (``ema_beta``), so one lucky batch does not set it.

Why raw losses plus ``patience`` rather than comparing the EMA itself: a real blow-up keeps
the raw loss high, so it is caught after exactly ``patience`` steps (default 3, far below any
report interval), while an EMA would take a blow-up-dependent number of steps to cross the
bound. A single noisy batch cannot fire a loss rule unless ``patience = 1``.
``loss_min_delta`` keeps the factor rule quiet when the best loss is tiny (e.g. 0.01 -> 0.05
on MNIST is noise, not divergence).

``penalty_value`` is the value reported to the searcher for a diverged trial (for a loss
metric minimised by the searcher), so the sampler learns that the region is bad instead of
losing the trial.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workloads.report import Divergence, StepInfo

__all__ = ["DivergenceRules", "DivergenceMonitor", "penalty_value", "REASONS"]

REASONS = (
    "nonfinite_loss",
    "nonfinite_grad",
    "logit_bound",
    "grad_explosion",
    "loss_vs_initial",
    "loss_vs_best",
)


class DivergenceRules(BaseModel):
    """Thresholds of the divergence rules; ``None`` switches a rule off."""

    model_config = ConfigDict(extra="forbid")

    nonfinite: bool = True
    warmup_steps: int = Field(20, ge=0)
    patience: int = Field(3, ge=1)
    ema_beta: float = Field(0.9, ge=0.0, lt=1.0)
    loss_factor_vs_best: float | None = Field(4.0, gt=1.0)
    loss_min_delta: float = Field(0.1, ge=0.0)
    loss_margin_vs_initial: float | None = Field(2.0, gt=0.0)
    grad_norm_max: float | None = Field(1e4, gt=0.0)
    grad_norm_factor_vs_median: float | None = Field(None, gt=1.0)
    grad_norm_window: int = Field(100, ge=5)
    max_logit: float | None = Field(None, gt=0.0)
    penalty: Literal["initial_loss", "worst"] | float = "initial_loss"


def penalty_value(
    rules: DivergenceRules,
    initial_loss: float | None,
    best_loss: float | None,
    worst_loss: float | None = None,
) -> float:
    """The searcher value of a diverged trial.

    ``initial_loss``: the untrained loss (the sampler sees "no better than not training").
    ``worst``: the largest finite loss seen (falls back to the initial loss). A float is used
    as is. When no finite loss was ever seen (NaN at step 1) the largest finite value among
    the inputs is used, else ``1e6``.
    """
    if not isinstance(rules.penalty, str):
        return float(rules.penalty)
    order = [worst_loss, initial_loss] if rules.penalty == "worst" else [initial_loss]
    for v in order + [best_loss]:
        if v is not None and math.isfinite(v):
            return float(v)
    return 1e6


class DivergenceMonitor:
    """Stateful checker for one training run; ``state_dict`` goes into checkpoints."""

    def __init__(self, rules: DivergenceRules | None = None) -> None:
        self.rules = rules or DivergenceRules()
        self.initial_loss: float | None = None
        self.best_loss: float | None = None  # min of the bias-corrected loss EMA
        self.worst_loss: float | None = None  # max finite raw loss
        self._ema = 0.0
        self._ema_n = 0
        self._strikes = {"loss_vs_initial": 0, "loss_vs_best": 0, "grad_explosion": 0}
        self._grads: deque[float] = deque(maxlen=self.rules.grad_norm_window)

    # --- protocol -------------------------------------------------------------------------
    def check(self, info: StepInfo) -> Divergence | None:
        r = self.rules
        loss, gn = float(info.loss), float(info.grad_norm)
        if r.nonfinite and not math.isfinite(loss):
            return Divergence("nonfinite_loss", info.step, f"loss={loss}")
        if r.nonfinite and not math.isfinite(gn):
            return Divergence("nonfinite_grad", info.step, f"grad_norm={gn}")
        logit = info.extras.get("max_logit")
        if r.max_logit is not None and logit is not None and logit > r.max_logit:
            return Divergence("logit_bound", info.step, f"max_logit={logit:.4g} > {r.max_logit}")
        if r.grad_norm_max is not None and gn > r.grad_norm_max:
            detail = f"grad_norm={gn:.4g} > {r.grad_norm_max}"
            return Divergence("grad_explosion", info.step, detail)

        after_warmup = info.step > r.warmup_steps
        found = self._grad_median_rule(info.step, gn, after_warmup)
        if math.isfinite(loss):
            found = found or self._loss_rules(info.step, loss, after_warmup)
            self._update_loss(loss)
        return found

    def state_dict(self) -> dict:
        return {
            "initial_loss": self.initial_loss,
            "best_loss": self.best_loss,
            "worst_loss": self.worst_loss,
            "ema": self._ema,
            "ema_n": self._ema_n,
            "strikes": dict(self._strikes),
            "grads": list(self._grads),
        }

    def load_state_dict(self, state: dict) -> None:
        self.initial_loss = state["initial_loss"]
        self.best_loss = state["best_loss"]
        self.worst_loss = state["worst_loss"]
        self._ema = float(state["ema"])
        self._ema_n = int(state["ema_n"])
        self._strikes = {k: int(v) for k, v in state["strikes"].items()}
        self._grads = deque(state["grads"], maxlen=self.rules.grad_norm_window)

    def penalty(self) -> float:
        """``penalty_value`` with this run's initial, best and worst losses."""
        return penalty_value(self.rules, self.initial_loss, self.best_loss, self.worst_loss)

    # --- rules ----------------------------------------------------------------------------
    def _strike(self, name: str, violated: bool) -> bool:
        self._strikes[name] = self._strikes[name] + 1 if violated else 0
        return self._strikes[name] >= self.rules.patience

    def _grad_median_rule(self, step: int, gn: float, after_warmup: bool) -> Divergence | None:
        r = self.rules
        if r.grad_norm_factor_vs_median is None:
            return None
        found = None
        if after_warmup and len(self._grads) >= 5:
            med = sorted(self._grads)[len(self._grads) // 2]
            bound = r.grad_norm_factor_vs_median * med
            if self._strike("grad_explosion", gn > bound):
                found = Divergence("grad_explosion", step, f"grad_norm={gn:.4g} > {bound:.4g}")
            if gn > bound:
                return found  # keep spikes out of the reference window
        self._grads.append(gn)
        return found

    def _loss_rules(self, step: int, loss: float, after_warmup: bool) -> Divergence | None:
        r = self.rules
        if not after_warmup or self.initial_loss is None:
            return None
        found = None
        if r.loss_margin_vs_initial is not None:
            bound = self.initial_loss + r.loss_margin_vs_initial
            if self._strike("loss_vs_initial", loss > bound):
                found = Divergence("loss_vs_initial", step, f"loss={loss:.4g} > {bound:.4g}")
        if r.loss_factor_vs_best is not None and self.best_loss is not None:
            bound = max(r.loss_factor_vs_best * self.best_loss, self.best_loss + r.loss_min_delta)
            if self._strike("loss_vs_best", loss > bound) and found is None:
                found = Divergence("loss_vs_best", step, f"loss={loss:.4g} > {bound:.4g}")
        return found

    def _update_loss(self, loss: float) -> None:
        if self.initial_loss is None:
            self.initial_loss = loss
        self.worst_loss = loss if self.worst_loss is None else max(self.worst_loss, loss)
        b = self.rules.ema_beta
        self._ema = b * self._ema + (1.0 - b) * loss
        self._ema_n += 1
        smoothed = self._ema / (1.0 - b**self._ema_n)  # bias-corrected, as in Adam
        self.best_loss = smoothed if self.best_loss is None else min(self.best_loss, smoothed)
