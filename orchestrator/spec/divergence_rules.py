"""The divergence rules a spec declares (``divergence:``), and the pure bounds they use.

``orchestrator/sweep/divergence.py``'s ``DivergenceMonitor`` checks them inside the worker after
every optimizer step and at every eval; ``orchestrator/analysis`` counts loss spikes with the same
``spike_bound``. Rules, in the order they are checked (the first that fires names the reason);
``None`` switches a rule off:

- ``nonfinite_loss`` / ``nonfinite_grad`` / ``nonfinite_param``: the step's loss, global grad
  norm or largest |parameter| is NaN/inf, or (``check_eval``) a val loss is. At once, at any
  step: no warm-up protects a non-finite value.
- Early-warning instability signals (off by default; docs/science.md §3.5), measured by the
  loop every ``signal_every`` steps only when a rule asks for them (``signals``):
  ``logit_bound`` (max attention logit on the probe batch ``> max_logit``),
  ``sigma_growth`` (max over layers of sigma_max(W_Q) ``> sigma_q_growth x`` its value after
  step 1), ``update_ratio`` (max over matrices of ||W_{t+1} - W_t||_F / ||W_t||_F
  ``> update_ratio_max``). At once.
- ``grad_explosion``: grad norm ``> grad_norm_max`` (absolute; at once), or, when
  ``grad_norm_factor_vs_median`` is set, ``> factor x`` the median of the last
  ``grad_norm_window`` grad norms for ``patience`` consecutive steps after warm-up.
- ``loss_vs_initial``: loss ``> max(ref + loss_margin_vs_initial, START_FACTOR x ref)`` for
  ``patience`` consecutive steps, with ``ref = min(first finite loss, lower median of the
  first REFERENCE_STEPS finite losses)``: where the run started, robust to one odd
  first batch. The factor keeps the bound meaningful when the start is large (1e3 + 2 nats
  would be noise there).
- ``loss_vs_best``: loss ``> loss_factor_vs_best x best`` and ``> best + loss_min_delta`` for
  ``patience`` steps; ``best`` is the minimum of a bias-corrected EMA (``ema_beta``) of the
  loss, so one lucky batch does not set it.
- ``loss_spike`` (opt-in): loss ``> spike_bound`` (median + ``spike_z`` robust sigmas, MAD,
  over the last SPIKE_WINDOW non-spiking losses) for ``patience`` steps.
- ``final_loss`` (``check_eval`` at the last eval): the final val loss ``> max(fref +
  final_margin, START_FACTOR x fref)`` with ``fref = min(ref, ln(classes))``. A run
  that ends worse than the uniform predictor by that much is not healthy whatever its start,
  so "completed with val loss 104,296" cannot happen even when every per-step rule was off.

``warmup_steps`` (default 0; it was 20 and hid blow-ups at high lr, issue 17) only delays the
loss rules and the median grad rule. Raw losses plus ``patience`` rather than an EMA: a real
blow-up keeps the raw loss high, so it is caught after exactly ``patience`` steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DivergenceRules", "REASONS", "spike_bound", "start_bound", "lower_median",
           "MAD_SIGMA", "REFERENCE_STEPS", "START_FACTOR", "SPIKE_WINDOW"]

REASONS = (
    "nonfinite_loss",
    "nonfinite_grad",
    "nonfinite_param",
    "logit_bound",
    "sigma_growth",
    "update_ratio",
    "grad_explosion",
    "loss_vs_initial",
    "loss_vs_best",
    "loss_spike",
    "final_loss",
)
MAD_SIGMA = 1.4826  # MAD x this = sigma for normal data
# Fixed rather than fields: a spec's one-line error lists every field of DivergenceRules.
REFERENCE_STEPS = 5  # the early losses whose lower median enters the start reference
START_FACTOR = 1.5  # "far above the start" is also > this x the start (large starts)
SPIKE_WINDOW = 30  # losses in the spike rule's median/MAD window (as stats.spike_count)


class DivergenceRules(BaseModel):
    """Thresholds of the divergence rules; ``None`` switches a rule off."""

    model_config = ConfigDict(extra="forbid")

    nonfinite: bool = True
    warmup_steps: int = Field(0, ge=0)
    patience: int = Field(3, ge=1)
    ema_beta: float = Field(0.9, ge=0.0, lt=1.0)
    loss_factor_vs_best: float | None = Field(4.0, gt=1.0)
    loss_min_delta: float = Field(0.1, ge=0.0)
    loss_margin_vs_initial: float | None = Field(2.0, gt=0.0)
    final_margin: float | None = Field(2.0, gt=0.0)
    grad_norm_max: float | None = Field(1e4, gt=0.0)
    grad_norm_factor_vs_median: float | None = Field(None, gt=1.0)
    grad_norm_window: int = Field(100, ge=5)
    spike_z: float | None = Field(None, gt=0.0)
    max_logit: float | None = Field(None, gt=0.0)
    sigma_q_growth: float | None = Field(None, gt=1.0)
    update_ratio_max: float | None = Field(None, gt=0.0)
    signal_every: int = Field(10, ge=1)
    penalty: Literal["initial_loss", "worst"] | float = "initial_loss"


def lower_median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return s[(len(s) - 1) // 2]


def spike_bound(recent: Sequence[float], z: float, min_delta: float = 0.0) -> float:
    """median + max(z x 1.4826 x MAD, min_delta) of ``recent`` (finite values, len >= 1)."""
    med = statistics.median(recent)
    mad = statistics.median([abs(x - med) for x in recent])
    return med + max(z * MAD_SIGMA * mad, min_delta)


def start_bound(rules: DivergenceRules, ref: float, margin: float | None) -> float:
    """The "far above where it started" bound for a reference loss ``ref``."""
    m = 2.0 if margin is None else margin
    return max(ref + m, START_FACTOR * ref)
