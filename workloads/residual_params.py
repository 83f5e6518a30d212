"""The residual families' parameters and their validation, without torch.

Each family's own parameters are a dataclass here (``FAMILY_PARAMS``: family name -> Params);
``workloads/residual.py`` gives each stream class its Params from this table, and
``family_params`` validates a ``{"family": name, **params}`` mapping against it. Kept apart
from the streams so that validating a spec (``workloads/validate.py``, run by every
``geosweep`` command before anything starts) imports no torch: ~2-3 s of a sweep's start.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from workloads.config import ConfigError, parse_p

__all__ = [
    "FAMILY_PARAMS", "family_params",
    "PreLNParams", "PostLNParams", "PeriLNParams", "PreDyTParams", "KeelParams",
    "GeoNormParams", "SpheretParams",
]


# --- family parameters --------------------------------------------------------------------


@dataclass
class PreLNParams:
    pass


@dataclass
class PostLNParams:
    pass


@dataclass
class PeriLNParams:
    embed_ln: bool = False  # also normalise the embedding h0 = LN(x0)


@dataclass
class PreDyTParams:
    # docs/science.md §2.6, d=768 [DESIGN]: attention-norm a0 in {1, 2}; FFN and final 0.5
    alpha_attn: float = 1.0
    alpha_ffn: float = 0.5
    alpha_final: float = 0.5
    embed_scale: bool = True  # learnable scalar on the embedding, init sqrt(d)


@dataclass
class KeelParams:
    alpha: Any = "L"  # "L" (n_layer), "2L" (sublayers) or a number > 0

    def check(self, key: str) -> None:
        a = self.alpha
        ok = a in ("L", "2L") or (isinstance(a, (int, float)) and not isinstance(a, bool) and a > 0)
        if not ok:
            raise ConfigError(f"{key}.alpha: must be 'L', '2L' or a number > 0, got {a!r}")


@dataclass
class GeoNormParams:
    decay: str = "sublayer"  # lambda_k = 1/sqrt(k) over sublayers | block | none
    radius: str = "learnable"  # ScaleNorm g: learnable scalar init sqrt(d) | fixed sqrt(d)
    inner_norm: str = "none"  # N_k before the branch: none | rmsnorm (learnable gain)
    guard: bool = False  # renormalise to r after each retraction
    # the learnable step a_k = lambda_k softplus(s_k) starts at alpha_init x lambda_k
    # (docs/science.md §2.5 [DESIGN]: 1.0 is the value used so far, 0.05 is nGPT's), and its
    # parameter learns alpha_lr_mult times faster than the optimiser's lr (under Adam-type
    # optimisers; see SpheretNorm)
    alpha_init: float = 1.0
    alpha_lr_mult: float = 1.0
    _choices: ClassVar[dict] = {
        "decay": ("sublayer", "block", "none"),
        "radius": ("learnable", "fixed"),
        "inner_norm": ("none", "rmsnorm"),
    }

    def check(self, key: str) -> None:
        for name, valid in self._choices.items():
            if getattr(self, name) not in valid:
                raise ConfigError(f"{key}.{name}: {getattr(self, name)!r} is not one of "
                                  f"{', '.join(valid)}")
        for name in ("alpha_init", "alpha_lr_mult"):
            v = getattr(self, name)
            if not (0 < v < float("inf")):
                raise ConfigError(f"{key}.{name}: must be a finite number > 0, got {v!r}")


@dataclass
class SpheretParams(GeoNormParams):
    p: float = 1.0  # > 0 or inf; 1 = Proj, 2 = Cayley, inf = GeoNorm

    def check(self, key: str) -> None:
        super().check(key)
        if not self.p > 0:
            raise ConfigError(f"{key}.p: must be > 0 (or inf), got {self.p!r}")


def _coerce(key: str, value: Any, default: Any) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
    elif isinstance(default, float):
        value = parse_p(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        value = float(value)
    return value


def family_params(d: dict, key: str = "model.residual") -> Any:
    """Validate ``{"family": name, **params}``; return the family's Params with defaults filled."""
    if not isinstance(d, dict):
        raise ConfigError(f"{key}: expected a mapping {{family: name, ...}}, got {d!r}")
    d = dict(d)
    name = d.pop("family", None)
    if not isinstance(name, str) or name not in FAMILY_PARAMS:
        raise ConfigError(f"{key}.family: {name!r} is not one of {', '.join(FAMILY_PARAMS)}")
    cls = FAMILY_PARAMS[name]
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    for k in d:
        if k not in fields:
            valid = ", ".join(fields) or "(none)"
            raise ConfigError(f"{key}.{k}: not a parameter of family {name!r}; valid: {valid}")
    params = cls(**{k: _coerce(f"{key}.{k}", v, fields[k]) for k, v in d.items()})
    if hasattr(params, "check"):  # each family checks its own parameters
        params.check(key)
    return params


# family name -> its Params (workloads/residual.py: RESIDUALS has the same names, each stream
# class's ``Params`` is the one here; tests/workloads/test_residual_params.py checks both)
FAMILY_PARAMS: dict[str, type] = {
    "pre_ln": PreLNParams,
    "post_ln": PostLNParams,
    "peri_ln": PeriLNParams,
    "pre_dyt": PreDyTParams,
    "keel": KeelParams,
    "geonorm": GeoNormParams,
    "spheret": SpheretParams,
}
