"""Divergence rules, checked inside the worker after every optimizer step and at every eval.

``DivergenceMonitor`` implements ``workloads.report.StepMonitor``: pure Python floats, O(1)
per step (the optional median rules sort a small fixed window), no torch. Rules, in the order
they are checked (the first that fires names the reason); ``None`` switches a rule off:

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

``penalty_value`` is what the searcher is told for a diverged trial (a loss metric it
minimises), so the sampler learns that the region is bad instead of losing the trial.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workloads.report import Divergence, StepInfo

__all__ = ["DivergenceRules", "DivergenceMonitor", "penalty_value", "spike_bound", "REASONS"]

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


def penalty_value(
    rules: DivergenceRules,
    initial_loss: float | None,
    best_loss: float | None,
    worst_loss: float | None = None,
) -> float:
    """The searcher value of a diverged trial.

    ``initial_loss``: the untrained loss ("no better than not training").
    ``worst``: the largest finite loss the trial saw, clamped to ``[lo, 10 lo]`` with ``lo`` the
    ``loss_vs_initial`` bound of its initial loss: a diverged trial is at least as bad as the
    bound that defines divergence (so it always ranks below a trial that merely did not train),
    a bigger blow-up ranks lower, and the cap keeps a 1e30 loss from flattening a model-based
    sampler's scale. A float is used as is. With no finite start (NaN at step 1) the first
    finite of (initial, best) is the start, else ``1e6``.
    """
    if not isinstance(rules.penalty, str):
        return float(rules.penalty)
    start = next((float(v) for v in (initial_loss, best_loss)
                  if v is not None and math.isfinite(v)), None)
    if start is None:
        return 1e6
    if rules.penalty == "initial_loss":
        return start
    lo = start_bound(rules, start, rules.loss_margin_vs_initial)
    worst = worst_loss if worst_loss is not None and math.isfinite(worst_loss) else lo
    return min(max(float(worst), lo), 10.0 * lo)


class DivergenceMonitor:
    """Stateful checker for one training run; ``state_dict`` goes into checkpoints."""

    def __init__(self, rules: DivergenceRules | None = None) -> None:
        self.rules = rules or DivergenceRules()
        self.initial_loss: float | None = None
        self.chance_loss: float | None = None  # ln(classes), from StepInfo
        self.best_loss: float | None = None  # min of the bias-corrected loss EMA
        self.worst_loss: float | None = None  # max finite raw loss
        self.sigma_q0: float | None = None  # sigma_max(W_Q) at the first measurement
        self._early: list[float] = []  # the first REFERENCE_STEPS finite losses
        self._ema = 0.0
        self._ema_n = 0
        self._strikes = {"loss_vs_initial": 0, "loss_vs_best": 0, "grad_explosion": 0,
                         "loss_spike": 0}
        self._grads: deque[float] = deque(maxlen=self.rules.grad_norm_window)
        self._losses: deque[float] = deque(maxlen=SPIKE_WINDOW)

    # --- protocol -------------------------------------------------------------------------
    def signals(self, step: int) -> frozenset[str]:
        """Extras the loop should measure for ``step`` (empty on most steps)."""
        r = self.rules
        if step != 1 and step % r.signal_every:
            return frozenset()
        wanted = (("max_logit", r.max_logit), ("sigma_max_q", r.sigma_q_growth),
                  ("update_ratio", r.update_ratio_max))
        return frozenset(k for k, v in wanted if v is not None)

    def check(self, info: StepInfo) -> Divergence | None:
        r = self.rules
        step, loss, gn = info.step, float(info.loss), float(info.grad_norm)
        if info.chance_loss is not None:
            self.chance_loss = float(info.chance_loss)
        if r.nonfinite:
            for reason, name, v in (("nonfinite_loss", "loss", loss),
                                    ("nonfinite_grad", "grad_norm", gn),
                                    ("nonfinite_param", "max|param|", info.param_max)):
                if v is not None and not math.isfinite(v):
                    return Divergence(reason, step, f"{name}={v}", float(v))
        found = self._signal_rules(step, info.extras)
        if found is None and r.grad_norm_max is not None and gn > r.grad_norm_max:
            found = Divergence("grad_explosion", step, f"grad_norm={gn:.4g} > {r.grad_norm_max}",
                               gn)
        if found is not None:
            return found
        after_warmup = step > r.warmup_steps
        found = self._grad_median_rule(step, gn, after_warmup)
        if math.isfinite(loss):
            self._update_loss(loss)
            found = found or self._loss_rules(step, loss, after_warmup)
        return found

    def check_eval(self, step: int, val_loss: float, final: bool) -> Divergence | None:
        """A non-finite val loss, or (``final``) a final val loss far above the reference."""
        r = self.rules
        v = float(val_loss)
        if not math.isfinite(v):
            return Divergence("nonfinite_loss", step, f"val loss={v}", v) if r.nonfinite else None
        ref = self.final_reference
        if final and r.final_margin is not None and ref is not None:
            bound = start_bound(r, ref, r.final_margin)
            if v > bound:
                return Divergence("final_loss", step, f"final val loss={v:.4g} > {bound:.4g}", v)
        return None

    @property
    def reference(self) -> float | None:
        """Where the run started: min(first finite loss, lower median of the early losses)."""
        if self.initial_loss is None:
            return None
        return min(self.initial_loss, lower_median(self._early))

    @property
    def final_reference(self) -> float | None:
        """``reference``, capped at ln(classes) when known (the uniform predictor's loss)."""
        refs = [v for v in (self.reference, self.chance_loss) if v is not None]
        return min(refs) if refs else None

    def state_dict(self) -> dict:
        return {
            "initial_loss": self.initial_loss,
            "chance_loss": self.chance_loss,
            "best_loss": self.best_loss,
            "worst_loss": self.worst_loss,
            "sigma_q0": self.sigma_q0,
            "early": list(self._early),
            "ema": self._ema,
            "ema_n": self._ema_n,
            "strikes": dict(self._strikes),
            "grads": list(self._grads),
            "losses": list(self._losses),
        }

    def load_state_dict(self, state: dict) -> None:
        self.initial_loss = state["initial_loss"]
        self.chance_loss = state.get("chance_loss")
        self.best_loss = state["best_loss"]
        self.worst_loss = state["worst_loss"]
        self.sigma_q0 = state.get("sigma_q0")
        # checkpoints from before issue 17 have no early window: the initial loss stands in
        self._early = list(state.get("early", [state["initial_loss"]] * bool(state["ema_n"])))
        self._ema = float(state["ema"])
        self._ema_n = int(state["ema_n"])
        self._strikes.update({k: int(v) for k, v in state["strikes"].items()})
        self._grads = deque(state["grads"], maxlen=self.rules.grad_norm_window)
        self._losses = deque(state.get("losses", []), maxlen=SPIKE_WINDOW)

    def penalty(self) -> float:
        """``penalty_value`` with this run's initial, best and worst losses."""
        return penalty_value(self.rules, self.initial_loss, self.best_loss, self.worst_loss)

    # --- rules ----------------------------------------------------------------------------
    def _strike(self, name: str, violated: bool) -> bool:
        self._strikes[name] = self._strikes[name] + 1 if violated else 0
        return self._strikes[name] >= self.rules.patience

    def _signal_rules(self, step: int, extras: dict[str, float]) -> Divergence | None:
        r = self.rules
        logit = extras.get("max_logit")
        if r.max_logit is not None and logit is not None and logit > r.max_logit:
            return Divergence("logit_bound", step, f"max_logit={logit:.4g} > {r.max_logit}",
                              logit)
        sq = extras.get("sigma_max_q")
        if r.sigma_q_growth is not None and sq is not None and math.isfinite(sq):
            if self.sigma_q0 is None:
                self.sigma_q0 = sq
            elif sq > r.sigma_q_growth * self.sigma_q0:
                growth = sq / self.sigma_q0
                return Divergence("sigma_growth", step,
                                  f"sigma_max(W_Q) grew {growth:.3g}x > {r.sigma_q_growth}", growth)
        ratio = extras.get("update_ratio")
        if r.update_ratio_max is not None and ratio is not None and ratio > r.update_ratio_max:
            return Divergence("update_ratio", step,
                              f"update/weight={ratio:.3g} > {r.update_ratio_max}", ratio)
        return None

    def _grad_median_rule(self, step: int, gn: float, after_warmup: bool) -> Divergence | None:
        r = self.rules
        if r.grad_norm_factor_vs_median is None:
            return None
        found = None
        if after_warmup and len(self._grads) >= 5:
            bound = r.grad_norm_factor_vs_median * lower_median(self._grads)
            if self._strike("grad_explosion", gn > bound):
                found = Divergence("grad_explosion", step, f"grad_norm={gn:.4g} > {bound:.4g}",
                                   gn)
            if gn > bound:
                return found  # keep spikes out of the reference window
        self._grads.append(gn)
        return found

    def _loss_rules(self, step: int, loss: float, after_warmup: bool) -> Divergence | None:
        r = self.rules
        found = None
        spiking = False
        if r.spike_z is not None and len(self._losses) >= 5:
            bound = spike_bound(self._losses, r.spike_z, r.loss_min_delta)
            spiking = loss > bound
            if self._strike("loss_spike", spiking and after_warmup):
                found = Divergence("loss_spike", step, f"loss={loss:.4g} > {bound:.4g}", loss)
        if not spiking:
            self._losses.append(loss)
        if not after_warmup:
            return None
        if r.loss_factor_vs_best is not None and self.best_loss is not None:
            bound = max(r.loss_factor_vs_best * self.best_loss, self.best_loss + r.loss_min_delta)
            if self._strike("loss_vs_best", loss > bound):
                found = Divergence("loss_vs_best", step, f"loss={loss:.4g} > {bound:.4g}", loss)
        if r.loss_margin_vs_initial is not None:
            bound = start_bound(r, self.reference, r.loss_margin_vs_initial)
            if self._strike("loss_vs_initial", loss > bound):
                found = Divergence("loss_vs_initial", step, f"loss={loss:.4g} > {bound:.4g}",
                                   loss)
        return found

    def _update_loss(self, loss: float) -> None:
        if self.initial_loss is None:
            self.initial_loss = loss
        if len(self._early) < REFERENCE_STEPS:
            self._early.append(loss)
        self.worst_loss = loss if self.worst_loss is None else max(self.worst_loss, loss)
        b = self.rules.ema_beta
        self._ema = b * self._ema + (1.0 - b) * loss
        self._ema_n += 1
        smoothed = self._ema / (1.0 - b**self._ema_n)  # bias-corrected, as in Adam
        self.best_loss = smoothed if self.best_loss is None else min(self.best_loss, smoothed)
