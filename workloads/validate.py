"""``validate(cfg)``: check a ``WorkloadConfig`` against the registries that define what is valid.

It lives here, not in ``workloads/config.py``, so that the config stays a leaf of plain values.
The names it checks against come from torch-free modules (``workloads/choices.py``,
``workloads/residual_params.py``) whose lists tests keep equal to the registries of the
implementations, so validating a spec imports no torch; every error message is built from them.
Every failure is one ``ConfigError`` line naming the dotted field and what is valid.
"""

from __future__ import annotations

from typing import Any

from workloads.choices import (
    ACTIVATION_NAMES,
    DGRAM_RETRACTIONS,
    DUAL_MODE_NAMES,
    MSIGN_METHOD_NAMES,
    NORM_NAMES,
    validate_assignment,
)
from workloads.config import ConfigError, GPTConfig, WorkloadConfig, flatten
from workloads.residual_params import family_params

__all__ = ["validate", "choices"]

_POSITIVE = ("optim.lr", "train.steps", "train.batch_size", "train.eval_iters",
             "train.grad_accum", "optim.muon.lr")
_NON_NEGATIVE = ("train.eval_every", "train.metrics_every", "train.checkpoint_every",
                 "train.curve_every",
                 "optim.warmup_steps", "train.epochs", "metrics.grad_probes")
_DEFAULT_ASSIGNMENT = "unconstrained"
_REALS = ("optim.lr", "optim.muon.lr")
_MAX_COUNT = 10**9


def choices(cfg: WorkloadConfig) -> dict[str, tuple[str, ...]]:
    """Dotted key -> its valid names, for the keys that take a name (model-dependent)."""
    out = {
        "data.tokenizer": ("gpt2", "char", "none"),
        "optim.name": ("adamw", "muon", "sgd"),
        "optim.schedule": ("cosine", "constant"),
        "optim.muon.momentum_form": ("sum", "ema"),
        "optim.muon.msign": MSIGN_METHOD_NAMES,
        "optim.manifold.dgram_retraction": DGRAM_RETRACTIONS,
        "optim.manifold.dual_mode": DUAL_MODE_NAMES,
        "train.dtype": ("float32", "bf16"),
    }
    if not isinstance(cfg.model, GPTConfig):
        out["model.activation"] = ACTIVATION_NAMES
        out["model.norm"] = NORM_NAMES
        out["model.init"] = ("depth_scaled", "fan_in")
    return out


def validate(cfg: WorkloadConfig) -> WorkloadConfig:
    """Check every field a user can get wrong; raise ConfigError with one line. Returns cfg."""
    flat = flatten(cfg)
    for key, valid in choices(cfg).items():
        if flat.get(key) not in valid:
            raise ConfigError(f"{key}: {flat.get(key)!r} is not one of {', '.join(valid)}")
    _check_numbers(cfg, flat)
    _check_model(cfg)
    _check_optim(cfg)
    return cfg


def _check_numbers(cfg: WorkloadConfig, flat: dict[str, Any]) -> None:
    for key in _POSITIVE:
        v = flat[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v != v:
            raise ConfigError(f"{key}: must be > 0, got {v!r}")
        if v == float("inf"):
            raise ConfigError(f"{key}: must be finite, got {v!r}")
    for key in ("optim.beta1", "optim.beta2", "optim.sgd_momentum"):
        v = flat[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
            raise ConfigError(f"{key}: must be in [0, 1), got {v!r}")
    if not 0.0 <= cfg.data.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction: must be in [0, 1), got {cfg.data.val_fraction!r}")
    for key in _NON_NEGATIVE:
        if flat[key] < 0:
            raise ConfigError(f"{key}: must be >= 0, got {flat[key]!r}")
    for key in _POSITIVE + _NON_NEGATIVE:
        # counts: a typo'd 1e30 steps would start Ray and train forever (int64 columns too)
        if key not in _REALS and flat[key] > _MAX_COUNT:
            raise ConfigError(f"{key}: at most {_MAX_COUNT:.0e}, got {flat[key]!r}")
    seed = cfg.train.seed
    # numpy's and torch's seeders take [0, 2**32): a larger one failed inside the loop
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ConfigError(f"train.seed: must be an integer in [0, 2**32), got {seed!r}")
    dev = cfg.train.device
    if not (dev in ("auto", "cpu", "cuda") or dev.startswith("cuda:")):
        raise ConfigError(f"train.device: {dev!r} is not one of auto, cpu, cuda, cuda:N")


def _check_model(cfg: WorkloadConfig) -> None:
    m = cfg.model
    if isinstance(m, GPTConfig):
        if m.arch not in ("gpt", "llama"):
            raise ConfigError(f"model.arch: {m.arch!r} is not one of gpt, llama, mlp")
        for key in ("n_layer", "n_head", "n_embd", "block_size"):
            if getattr(m, key) <= 0:
                raise ConfigError(f"model.{key}: must be > 0, got {getattr(m, key)!r}")
        if m.n_embd % m.n_head:
            raise ConfigError(f"model.n_embd: {m.n_embd} is not divisible by "
                              f"model.n_head={m.n_head}")
        if cfg.data.tokenizer == "none":
            raise ConfigError("data.tokenizer: a GPT needs gpt2 or char, got 'none'")
        family_params(m.residual)  # the family validates its own parameters
        return
    for key in ("width", "depth", "d_in", "n_classes"):
        if getattr(m, key) <= 0:
            raise ConfigError(f"model.{key}: must be > 0, got {getattr(m, key)!r}")
    if m.init_scale <= 0:
        raise ConfigError(f"model.init_scale: must be > 0, got {m.init_scale!r}")


def check_dual(m: Any) -> None:
    """The direction solver's fields of ``optim.manifold`` (a ManifoldConfig): one-line
    ConfigError naming the bad one."""
    key = "optim.manifold."
    if m.dual_mode not in DUAL_MODE_NAMES:
        raise ConfigError(f"{key}dual_mode: {m.dual_mode!r} is not one of "
                          f"{', '.join(DUAL_MODE_NAMES)}")
    steps = m.dual_steps
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                              or not 1 <= steps <= 10_000):
        raise ConfigError(f"{key}dual_steps: must be an integer in [1, 10000] (or null for the "
                          f"mode's own), got {steps!r}")
    tol = m.dual_tol
    if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float))
                            or not 0.0 <= tol < float("inf")):
        raise ConfigError(f"{key}dual_tol: must be a number >= 0 (or null for the mode's "
                          f"own), got {tol!r}")
    lr = m.dual_lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0.0 < lr < float("inf"):
        raise ConfigError(f"{key}dual_lr: must be a finite number > 0, got {lr!r}")
    if m.dual_warm_start is not None and not isinstance(m.dual_warm_start, bool):
        raise ConfigError(f"{key}dual_warm_start: expected true/false (or null for the mode's "
                          f"own), got {m.dual_warm_start!r}")


def _check_optim(cfg: WorkloadConfig) -> None:
    o = cfg.optim
    validate_assignment(o.manifold.assignment)
    check_dual(o.manifold)
    # Only Muon applies a manifold assignment; with AdamW every assignment trained the same
    # model, so a sweep over assignments ran identical arms. Refused instead of ignored.
    if o.name != "muon" and o.manifold.assignment != _DEFAULT_ASSIGNMENT:
        raise ConfigError(f"optim.manifold.assignment: {o.manifold.assignment!r} needs "
                          f"optim.name muon (Manifold Muon); optim.name {o.name!r} ignores it")
