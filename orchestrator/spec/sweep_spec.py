"""The sweep spec: one validated pydantic model per YAML section (docs/contracts.md "Sweep spec").

Every error a user can make becomes ONE line naming the dotted field and what would be valid,
raised as ``SpecError``: pydantic's ``ValidationError`` is reduced to its first error
(``format_validation_error`` in orchestrator/spec/yaml_reader.py, which also reads the YAML),
and the cross-field rules (algorithm vs. parameter kinds, ASHA vs. budget, space values vs.
the workload config) raise lines of the same shape.

A trial is a flat dict of dotted overrides (``{"optim.lr": 1e-3, "train.seed": 0}``) applied to
the preset, then the workload overrides, then the budget (``base_config``/``trial_config``).
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.spec.claims import Claim
from orchestrator.spec.divergence_rules import DivergenceRules
from orchestrator.spec.params import P_KEY, Param, arm_label, expand, fmt, ident, strict
from orchestrator.spec.report_seeds import AutoSeeds, ReportSpec
from orchestrator.spec.sections import Budget, Resources, Scheduler, Search, Tracking, Workload
from workloads.config import (
    ConfigError,
    WorkloadConfig,
    apply_overrides,
    flatten,
    to_dict,
)
from workloads.validate import validate

__all__ = [
    "SpecError", "Param", "Workload", "Search", "Scheduler", "Budget", "Resources", "Tracking",
    "SweepSpec",
]

MAX_ARMS = 100_000  # arms (and grid trials) a sweep may have: counted, never built
MAX_CHECKED_COMBOS = 256  # corner combinations of a space validated against the workload
_NAME = re.compile(r"^[a-z0-9_-]{1,64}$")
_KEY = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+$")
_POSITIVE = (P_KEY, "optim.lr", "optim.muon.lr")  # > 0; inf allowed only for p
_BUDGET = {"steps": "train.steps", "eval_every": "train.eval_every",
           "metrics_every": "train.metrics_every", "checkpoint_every": "train.checkpoint_every",
           "curve_every": "train.curve_every"}
_CHECKPOINTS_PER_TRIAL = 10  # default: a worker failure loses at most ~10% of a trial


class SpecError(ValueError):
    """A user-facing sweep-spec error; its message is one line naming the bad field."""


# --- the spec ------------------------------------------------------------------------------


class SweepSpec(BaseModel):
    model_config = strict()

    name: str
    description: str | None = None
    workload: Workload
    space: dict[str, Param] = Field(default_factory=dict)
    seeds: list[int] = Field(default_factory=lambda: [0])
    search: Search = Field(default_factory=Search)
    scheduler: Scheduler = Field(default_factory=Scheduler)
    divergence: DivergenceRules = Field(default_factory=DivergenceRules)
    budget: Budget = Field(default_factory=Budget)
    resources: Resources = Field(default_factory=Resources)
    tracking: Tracking = Field(default_factory=Tracking)
    # the papers' claims this sweep can test (orchestrator/spec/claims.py); `geosweep report`
    # gives each a verdict by orchestrator/analysis/verdicts.py
    claims: list[Claim] = Field(default_factory=list)
    report: ReportSpec = Field(default_factory=ReportSpec)
    seed_budget: AutoSeeds | None = None  # set by ``seeds: {auto: true, ...}``

    @model_validator(mode="before")
    @classmethod
    def _auto_seeds(cls, d: Any) -> Any:
        # seeds: {auto: true, min, max, effect}: start with min seeds, the budget is kept in
        # seed_budget (orchestrator/spec/report_seeds.py); to_yaml writes both, so it round-trips
        if isinstance(d, dict) and isinstance(d.get("seeds"), dict):
            d = dict(d)
            try:
                auto = AutoSeeds.model_validate(d["seeds"])
            except ValidationError as e:
                err = e.errors()[0]
                where = ".".join(map(str, ("seeds", *err["loc"])))
                raise ValueError(f"{where}: {err['msg'].removeprefix('Value error, ')}; "
                                 "seeds: auto takes auto, min, max, effect, alpha, power, "
                                 "per_round") from None
            d["seeds"], d["seed_budget"] = list(range(auto.min)), auto
        return d

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r} must be 1-64 characters of a-z 0-9 _ -")
        return v

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds(cls, v: Any) -> list[int]:
        if isinstance(v, int) and not isinstance(v, bool):
            if not 1 <= v <= 10_000:
                raise ValueError(f"an int n means seeds 0..n-1 and must be in [1, 10000], got {v}")
            return list(range(v))
        # numpy's and torch's seeders take < 2**32: a larger seed fails only inside a trial
        ok = (isinstance(v, list) and v and all(isinstance(s, int) and not isinstance(s, bool)
                                                 and 0 <= s < 2**32 for s in v))
        if not ok:
            raise ValueError("expected an int n >= 1 or a non-empty list of ints in [0, 2**32), "
                             f"got {str(v)[:80]}")
        if len(v) > 10_000:
            raise ValueError(f"at most 10000 seeds, got {len(v)}")
        if len(set(v)) != len(v):
            raise ValueError(f"must be distinct, got {v}")
        return v

    @model_validator(mode="after")
    def _cross_check(self) -> SweepSpec:
        self._check_budget()
        base = self.base_config()
        self._check_keys()
        self._unify_numbers(base)
        self._check_algorithm()
        self._check_values(base)
        self._resolve_scheduler(base)
        self._check_claims()
        return self

    # --- cross-field rules ---------------------------------------------------------------
    def _check_budget(self) -> None:
        ov = self.workload.overrides
        for field, key in _BUDGET.items():
            b = getattr(self.budget, field)
            if b is not None and key in ov and ov[key] != b:
                raise ValueError(f"budget.{field}: {b} conflicts with workload.overrides "
                                 f"{key}={ov[key]!r}; set it in one place")
        if self.budget.steps is not None and ov.get("train.epochs"):
            raise ValueError("budget.steps: conflicts with workload.overrides train.epochs > 0 "
                             "(epochs set the steps); set one")
        try:
            t = self.base_config().train
        except ConfigError as e:
            raise ValueError(f"workload.overrides: {e}") from None
        if t.checkpoint_every and t.eval_every and t.checkpoint_every % t.eval_every:
            where = "budget" if self.budget.checkpoint_every is not None else \
                "workload.overrides train"
            raise ValueError(f"{where}.checkpoint_every: {t.checkpoint_every} is not a multiple "
                             f"of eval_every ({t.eval_every}); checkpoints are taken at reports")

    def _check_keys(self) -> None:
        keys = list(self.space)
        for i, (key, p) in enumerate(self.space.items()):
            if not _KEY.match(key):
                raise ValueError(f"space.{key}: not a dotted config key like optim.lr")
            if key == "train.seed":
                raise ValueError("space.train.seed: seeds are set by the top-level seeds field")
            if key in _BUDGET.values() or key == "train.epochs":
                raise ValueError(f"space.{key}: the training length is set by budget, "
                                 "not searched")
            for w, vals in p.when.items():
                if w not in keys[:i]:
                    raise ValueError(f"space.{key}.when: {w!r} must be a space key listed "
                                     f"before {key!r}; earlier keys: {', '.join(keys[:i]) or '-'}")
                q = self.space[w]
                if q.discrete:
                    occurs = set(map(ident, q.values() + q.also))
                    never = [v for v in vals if ident(v) not in occurs]
                    if never:
                        raise ValueError(f"space.{key}.when: {w}={fmt(never[0])} never occurs; "
                                         f"{w} takes {', '.join(map(fmt, q.values()))}")

    def _unify_numbers(self, base: WorkloadConfig) -> None:
        """One numeric type per param (floats if any value or the config field is a float), so
        trial tables get one column type: ``p: {grid: [1, 2], also: [inf]}`` -> 1.0, 2.0, inf."""
        current = flatten(base)
        for key, p in self.space.items():
            nums = [v for v in p.candidates() if isinstance(v, (int, float))
                    and not isinstance(v, bool)]
            if p.kind == "int" or not any(isinstance(v, float) for v in nums) and not (
                    isinstance(current.get(key), float) or key in _POSITIVE):
                continue
            fl = [float(v) if isinstance(v, int) and not isinstance(v, bool) else v
                  for v in p.values()]
            if p.discrete:
                setattr(p, p.kind, fl)
            p.also = [float(v) if isinstance(v, int) and not isinstance(v, bool) else v
                      for v in p.also]

    def _check_algorithm(self) -> None:
        algo = self.search.algorithm
        if algo == "grid":
            for key, p in self.space.items():
                if not p.discrete:
                    raise ValueError(f"space.{key}: {p.kind} needs search.algorithm random, "
                                     "optuna-tpe or optuna-gp; grid search takes grid or choice")
            if self.search.num_samples != 1:
                raise ValueError("search.num_samples: grid search runs every arm x seed once; "
                                 "use seeds for repeats")
            return
        if not self.space:
            raise ValueError(f"space: search.algorithm {algo} needs at least one parameter")
        if all(p.kind == "grid" for p in self.space.values()):
            raise ValueError(f"search.algorithm: {algo} over grid params only repeats the same "
                             "trials; use algorithm grid or a choice/range param")
        for key, p in self.space.items():
            if p.kind == "grid" and algo != "random":
                raise ValueError(f"space.{key}: grid is exhaustive and not searchable by {algo}; "
                                 "use choice")
            if p.kind == "grid" and p.when:
                raise ValueError(f"space.{key}: a conditional grid param cannot be random-"
                                 "searched; use choice")

    def _check_values(self, base: WorkloadConfig) -> None:
        # counted before anything is built: a 2 kB spec can name 10**8 arms
        # (discrete values only: a continuous range is one axis of a random/Optuna search)
        bound = math.prod(len(p.candidates()) if p.discrete else 1 for p in self.space.values())
        if bound > MAX_ARMS:
            raise ValueError(f"space: up to {bound} arms (the product of every parameter's "
                             f"values), more than the {MAX_ARMS} a sweep may have; split it")
        if self.search.algorithm == "grid" and bound * len(self.seeds) > MAX_ARMS:
            raise ValueError(f"space x seeds: up to {bound * len(self.seeds)} grid trials, more "
                             f"than the {MAX_ARMS} a sweep may have; use fewer seeds or values")
        for key, p in self.space.items():
            if key in _POSITIVE:
                for v in p.candidates():
                    num = isinstance(v, (int, float)) and not isinstance(v, bool)
                    if not num or not v > 0 or (v == math.inf and key != P_KEY):
                        valid = "> 0 (or inf)" if key == P_KEY else "finite and > 0"
                        raise ValueError(f"space.{key}: values must be {valid}, got {fmt(v)}")
            ctx = self._context(key)
            for v in p.candidates():
                try:
                    validate(apply_overrides(base, {**ctx, key: v}))
                except ConfigError as e:
                    raise ValueError(f"space.{key}: {fmt(v)} is invalid: {e}") from None
        combos = expand(self.space, lambda p: p.candidates(), [self.seeds[0]])
        for flat in combos[:MAX_CHECKED_COMBOS]:
            try:
                validate(apply_overrides(base, flat))
            except ConfigError as e:
                raise ValueError(f"space: the combination {self.arm_label(flat)} is invalid: "
                                 f"{e}") from None

    def _check_claims(self) -> None:
        """Claim ids unique; each claim's arm/baseline keys are space keys taking those values."""
        seen: set[str] = set()
        for c in self.claims:
            if c.id in seen:
                raise ValueError(f"claims: id {c.id!r} occurs twice")
            seen.add(c.id)
            for side in ("arm", "baseline"):
                for key, v in getattr(c, side).items():
                    if key not in self.space:
                        raise ValueError(f"claims.{c.id}.{side}: {key!r} is not a space key; "
                                         f"space keys: {', '.join(self.space) or '-'}")
                    p = self.space[key]
                    if p.discrete and ident(v) not in set(map(ident, p.values() + p.also)):
                        raise ValueError(f"claims.{c.id}.{side}: {key}={fmt(v)} never occurs; "
                                         f"{key} takes {', '.join(map(fmt, p.values()))}")

    def _context(self, key: str) -> dict[str, Any]:
        """Values of the keys ``key``'s condition depends on (recursively), first allowed."""
        ctx: dict[str, Any] = {}
        for w, vals in self.space[key].when.items():
            ctx.update(self._context(w))
            ctx[w] = vals[0]
        return ctx

    def _resolve_scheduler(self, base: WorkloadConfig) -> None:
        s, t = self.scheduler, base.train
        if s.type == "none":
            for f in ("grace_period", "reduction_factor", "max_t"):
                if getattr(s, f) is not None:
                    raise ValueError(f"scheduler.{f}: only for type asha, got type none")
            return
        if not 0 < t.eval_every < t.steps:
            raise ValueError(f"scheduler: asha needs intermediate reports, but eval_every="
                             f"{t.eval_every} and steps={t.steps}; lower budget.eval_every")
        s.max_t = t.steps if s.max_t is None else s.max_t
        s.grace_period = t.eval_every if s.grace_period is None else s.grace_period
        s.reduction_factor = 3.0 if s.reduction_factor is None else s.reduction_factor
        if s.max_t > t.steps:
            raise ValueError(f"scheduler.max_t: {s.max_t} exceeds the budget of {t.steps} steps")
        if not s.grace_period < s.max_t:
            raise ValueError(f"scheduler.grace_period: must be < max_t ({s.max_t}), got "
                             f"{s.grace_period}")

    # --- configs and labels --------------------------------------------------------------
    def base_config(self) -> WorkloadConfig:
        """Preset + workload overrides + budget, validated (a fresh object each call)."""
        from workloads.config import preset

        cfg = preset(self.workload.preset)
        budget = {k: getattr(self.budget, f) for f, k in _BUDGET.items()
                  if getattr(self.budget, f) is not None}
        if self.budget.steps is not None and cfg.train.epochs:
            budget["train.epochs"] = 0  # the budget's steps are the training length
        cfg = validate(apply_overrides(cfg, {**self.workload.overrides, **budget}))
        t = cfg.train
        if self.budget.checkpoint_every is None and not t.checkpoint_every and t.steps \
                and t.eval_every:
            every = t.eval_every * max(1, round(t.steps / _CHECKPOINTS_PER_TRIAL / t.eval_every))
            cfg = apply_overrides(cfg, {"train.checkpoint_every": every})
        return cfg

    def trial_config(self, flat_overrides: dict[str, Any]) -> WorkloadConfig:
        """The base config with one trial's flat dotted overrides applied, validated."""
        try:
            return validate(apply_overrides(self.base_config(), flat_overrides))
        except ConfigError as e:
            raise SpecError(f"trial {self.arm_label(flat_overrides)}: {e}") from None

    def trial_plan(self) -> dict[str, Any]:
        """What every trial needs, as plain values (JSON), resolved and validated here on the
        driver once: a trial composes its config from it without rebuilding the spec."""
        return {"base": to_dict(self.base_config()), "space_keys": list(self.space),
                "rules": self.divergence.model_dump(), "metric": self.search.metric,
                "resources": self.resources.model_dump()}

    def arm_label(self, flat: dict[str, Any]) -> str:
        """``key=value`` pairs without the seed, in space order; ``base`` when empty."""
        return arm_label(flat, list(self.space))

    def to_yaml(self) -> str:
        """The resolved spec as YAML (``inf`` as ``.inf``); ``load`` of it gives this spec."""
        d = self.model_dump()
        d["space"] = {k: p.model_dump(exclude_defaults=True) for k, p in self.space.items()}
        for k in ("report", "seed_budget"):  # optional sections: written only when given
            if d[k] in (None, ReportSpec().model_dump()):
                del d[k]
        return yaml.safe_dump(d, sort_keys=False, default_flow_style=None, width=100)


