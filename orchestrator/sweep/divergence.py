"""The divergence monitor: the spec's rules (orchestrator/spec/divergence_rules.py, where each
rule is described) checked inside the worker after every optimizer step and at every eval.

``DivergenceMonitor`` implements ``workloads.report.StepMonitor``: pure Python floats, O(1)
per step (the optional median rules sort a small fixed window), no torch.

``penalty_value`` is what the searcher is told for a diverged trial (a loss metric it
minimises), so the sampler learns that the region is bad instead of losing the trial.
"""

from __future__ import annotations

import math
from collections import deque

from orchestrator.spec.divergence_rules import (
    REFERENCE_STEPS,
    SPIKE_WINDOW,
    DivergenceRules,
    lower_median,
    spike_bound,
    start_bound,
)
from workloads.report import Divergence, StepInfo

__all__ = ["DivergenceMonitor", "penalty_value"]


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
