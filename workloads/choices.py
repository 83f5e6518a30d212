"""The names a workload config may choose, without torch.

Each registry of implementations keeps its own table (``msign.MSIGN_METHODS``, the MLP's
``ACTIVATIONS`` and ``NORMS``, ``manifolds.MANIFOLDS``, the DGram retractions); their names are
also listed here, with the manifold assignment's strategies and its validation, so that
validating a spec (``workloads/validate.py``: every ``geosweep`` command does it before anything
starts) imports no torch, ~2-3 s of a sweep's start. tests/workloads/test_choices.py checks
that every list here equals its registry's names.
"""

from __future__ import annotations

from typing import Any

from workloads.config import ConfigError

__all__ = ["MSIGN_METHOD_NAMES", "DGRAM_RETRACTIONS", "ACTIVATION_NAMES", "NORM_NAMES",
           "CONSTRAINT_NAMES", "DUAL_MODE_NAMES", "DUAL_MODE_DEFAULTS", "STRATEGIES",
           "dual_settings", "validate_assignment"]

MSIGN_METHOD_NAMES = ("polar_express", "ns5", "svd", "gram")  # geometry/msign.MSIGN_METHODS
DGRAM_RETRACTIONS = ("paper_svd_sorted", "colnorm_polar")  # geometry/dgram.dgram_retract
ACTIVATION_NAMES = ("relu", "gelu", "silu", "none", "radial", "radial_rms",  # models/mlp
                    "tanh")
NORM_NAMES = ("none", "layernorm", "rmsnorm")  # models/mlp.NORMS
CONSTRAINT_NAMES = ("none", "stiefel", "dgram")  # geometry/manifolds.MANIFOLDS
DUAL_MODE_NAMES = ("fast", "paper", "exact")  # geometry/dual.DUAL_MODES
# each mode's (dual_tol, dual_steps) where the config leaves them null (docs/science.md §3.2)
DUAL_MODE_DEFAULTS: dict[str, tuple[float, int]] = {
    "fast": (1e-4, 20), "paper": (1e-6, 20), "exact": (1e-6, 100)}

# Manifold Muon's assignment strategies (docs/science.md §3.4): strategy -> {kind: constraint}
STRATEGIES: dict[str, dict[str, str]] = {
    "unconstrained": {"attention": "none", "mlp": "none"},
    "all_stiefel": {"attention": "stiefel", "mlp": "stiefel"},
    "all_dgram": {"attention": "dgram", "mlp": "dgram"},
    "hetero": {"attention": "stiefel", "mlp": "dgram"},
    "hetero_inv": {"attention": "dgram", "mlp": "stiefel"},
}

_KEY = "optim.manifold.assignment"


def dual_settings(mode: str, tol: float | None, steps: int | None) -> tuple[float, int]:
    """``(tol, steps)`` the direction solver runs with: the config's, or ``mode``'s own."""
    dtol, dsteps = DUAL_MODE_DEFAULTS[mode]
    return (dtol if tol is None else float(tol)), (dsteps if steps is None else int(steps))


def validate_assignment(assignment: Any) -> None:
    """Raise ``ConfigError`` (one line) unless ``assignment`` is a strategy or a pattern map."""
    if isinstance(assignment, str):
        if assignment not in STRATEGIES:
            raise ConfigError(
                f"{_KEY}: {assignment!r} is not one of {', '.join(STRATEGIES)} "
                f"(or a {{pattern: constraint}} map)"
            )
        return
    if not isinstance(assignment, dict):
        raise ConfigError(
            f"{_KEY}: expected a strategy name or a {{pattern: constraint}} map, "
            f"got {type(assignment).__name__}"
        )
    for pattern, constraint in assignment.items():
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(f"{_KEY}: pattern {pattern!r} must be a non-empty string")
        if constraint not in CONSTRAINT_NAMES:
            raise ConfigError(
                f"{_KEY}[{pattern!r}]: {constraint!r} is not one of {', '.join(CONSTRAINT_NAMES)}"
            )
