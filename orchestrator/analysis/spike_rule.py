"""The report's default loss-spike rule, also the rule a trial record's ``spikes`` count is
made with when the trial ends (orchestrator/sweep/callback.py); no heavy imports, so the
driver and the report's config can share it."""

from __future__ import annotations

__all__ = ["SPIKE_FACTOR", "SPIKE_MIN_DELTA", "spike_rule"]

SPIKE_FACTOR = 1.5  # below the divergence rule's 4x-best: spikes the run survived
SPIKE_MIN_DELTA = 0.1  # as DivergenceRules.loss_min_delta: 0.01 -> 0.02 is noise


def spike_rule(factor: float, min_delta: float) -> str:
    """The rule a count was made with, as stored next to it (``spikes_rule``)."""
    return f"factor={float(factor)!r},min_delta={float(min_delta)!r}"
