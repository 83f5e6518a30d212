"""``spec.space`` -> what Ray Tune needs: a param_space, a search algorithm, a sample count.

Every path hands the trainable the same shape: ``config["trial"]`` is a flat dict of dotted
overrides plus ``train.seed`` (``flat_from_tune_config`` turns it into the trial's overrides).

- grid: ``{"trial": tune.grid_search(grid_trials(spec))}``, one exact flat dict per trial, so
  conditions and seeds are exact and duplicates are removed before Tune sees them.
- random: one Tune domain per dotted key under ``"trial"``; ``grid`` params stay
  ``tune.grid_search`` (Tune's semantics: every grid point x num_samples). Conditional params
  and params with ``also`` are ``tune.sample_from`` functions, drawn only where the condition
  holds (``None`` where it fails = absent); each ``also`` value is drawn with probability
  ``also_axis.also_probability`` (``also_weight`` intervals of the regular distribution;
  issue 17 §3: it used to be 1/2). The trial seed
  is ``seeds[0]``; confirmation runs over seeds are a later stage.
- optuna-tpe / optuna-gp: ``OptunaSearch`` with a define-by-run function made only of
  ``trial.suggest_*`` calls. Optuna names are ``trial/<dotted key>`` (Ray unflattens on ``/``);
  ``also`` values become a categorical switch ``trial/<key>:special`` in
  ``["none", *also]`` (``inf`` as the string ``"inf"``), and the regular suggest is asked only
  when the switch is ``"none"``; except a loguniform param with ``also`` (p with inf): one
  float ``trial/<key>:axis`` on the extended log2 axis (orchestrator/sweep/also_axis.py), whose
  decoded value the define-by-run function returns as ``trial/<key>``.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.spec.params import Param, holds
from orchestrator.spec.params import expand as expand_space
from orchestrator.sweep.also_axis import also_probability, axis_bounds, axis_decode, uses_axis
from workloads.config import parse_p

if TYPE_CHECKING:  # annotations only: spec.py does not import this module (no cycle)
    from orchestrator.spec.sweep_spec import SweepSpec

__all__ = [
    "PREFIX", "SPECIAL", "AXIS", "REGULAR", "expand", "grid_trials", "count_trials", "build_search",
    "define_by_run", "DefineByRun", "flat_from_tune_config", "optuna_param_name",
]

PREFIX = "trial"  # config[PREFIX] is the trial's flat override dict
SPECIAL = ":special"  # suffix of the categorical switch choosing an ``also`` value
AXIS = ":axis"  # suffix of the extended log2 axis of a loguniform param with also
REGULAR = "none"  # the switch value meaning "draw from the regular distribution"


# --- conditions and exact expansion ----------------------------------------------------------


def expand(spec: SweepSpec, values_of: Callable[[Param], list[Any]],
           seeds: list[int]) -> list[dict[str, Any]]:
    """``params.expand`` over ``spec.space`` (see there)."""
    return expand_space(spec.space, values_of, seeds)


def grid_trials(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every arm (grid/choice values + also) x every seed, conditions respected."""
    return expand(spec, lambda p: p.values() + list(p.also), list(spec.seeds))


def count_trials(spec: SweepSpec) -> int:
    algo = spec.search.algorithm
    if algo == "grid":
        return len(grid_trials(spec))
    if algo == "random":
        n = spec.search.num_samples
        for p in spec.space.values():
            if p.kind == "grid":
                n *= len(p.values()) + len(p.also)
        return n
    return spec.search.num_samples


# --- random search -------------------------------------------------------------------------


def _draw(p: Param, rng: random.Random) -> Any:
    """One draw from the regular distribution (``also`` excluded)."""
    kind = p.kind
    if kind in ("grid", "choice"):
        return rng.choice(p.values())
    low, high = getattr(p, kind)
    if kind == "uniform":
        return rng.uniform(low, high)
    if kind == "loguniform":
        return math.exp(rng.uniform(math.log(low), math.log(high)))
    return rng.randint(low, high)  # int: inclusive bounds


class _ConditionalDraw:
    """A ``tune.sample_from`` callable; a class, not a closure, so Tune can pickle it.

    Tune passes no random state to ``sample_from``: the draws come from ``rng`` (seeded by
    ``search.seed``), shared by all params of one ``build_search`` call."""

    def __init__(self, key: str, p: Param, rng: random.Random) -> None:
        self.key, self.p, self.rng = key, p, rng

    def __deepcopy__(self, memo: dict) -> _ConditionalDraw:
        # Tune deep-copies the param_space per variant; a copied rng would repeat its draws.
        return self

    def __call__(self, config: Any) -> Any:
        from ray.tune.search.sample import Domain
        from ray.tune.search.variant_generator import RecursiveDependencyError

        trial = config[PREFIX] if PREFIX in config else config["config"][PREFIX]
        for w in self.p.when:
            if isinstance(trial.get(w), Domain):  # not drawn yet: Tune retries after it
                raise RecursiveDependencyError(f"{self.key} depends on {w}")
        if not holds(self.p, trial):
            return None  # absent: the condition fails
        if not self.p.also:
            return _draw(self.p, self.rng)
        u, q = self.rng.random(), also_probability(self.p)
        i = int(u / q) if q > 0 else len(self.p.also)
        return self.p.also[i] if i < len(self.p.also) else _draw(self.p, self.rng)


def _random_space(spec: SweepSpec, rng: random.Random) -> dict[str, Any]:
    from ray import tune

    space: dict[str, Any] = {}
    for key, p in spec.space.items():
        if p.kind == "grid":
            space[key] = tune.grid_search(p.values() + list(p.also))
        elif p.when or p.also:
            space[key] = tune.sample_from(_ConditionalDraw(key, p, rng))
        elif p.kind == "choice":
            space[key] = tune.choice(p.values())
        elif p.kind == "uniform":
            space[key] = tune.uniform(*p.uniform)
        elif p.kind == "loguniform":
            space[key] = tune.loguniform(*p.loguniform)
        else:
            space[key] = tune.randint(p.int[0], p.int[1] + 1)  # Tune's upper bound is exclusive
    space["train.seed"] = spec.seeds[0]
    return space


# --- Optuna define-by-run ------------------------------------------------------------------


def optuna_param_name(key: str) -> str:
    """The Optuna parameter name of a dotted key (``trial/optim.lr``)."""
    return f"{PREFIX}/{key}"


def _enc(v: Any) -> Any:
    """Categorical choices as Optuna can store them (JSON): inf as the string 'inf'."""
    return "inf" if isinstance(v, float) and math.isinf(v) and v > 0 else v


def _dec(v: Any) -> Any:
    if parse_p(v) is math.inf:
        return math.inf
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        return v.item()  # numpy scalar -> Python scalar
    return v


class DefineByRun:
    """An Optuna define-by-run space: only ``trial.suggest_*`` calls; returns the seed.

    A class rather than a closure because ``OptunaSearch.save`` pickles it with ``pickle``.
    """

    def __init__(self, spec: SweepSpec) -> None:
        self.params = list(spec.space.items())
        self.constant = {optuna_param_name("train.seed"): spec.seeds[0]}

    def __call__(self, trial: Any) -> dict[str, Any]:
        got: dict[str, Any] = {}
        decoded: dict[str, Any] = {}
        for key, p in self.params:
            if not holds(p, got):
                continue
            name = optuna_param_name(key)
            if uses_axis(p):
                got[key] = axis_decode(p, trial.suggest_float(name + AXIS, *axis_bounds(p)))
                decoded[name] = _enc(got[key])
                continue
            if p.also:
                switch = trial.suggest_categorical(name + SPECIAL,
                                                   [REGULAR, *(_enc(v) for v in p.also)])
                if switch != REGULAR:
                    got[key] = _dec(switch)
                    continue
            if p.kind == "choice":
                got[key] = _dec(trial.suggest_categorical(name, [_enc(v) for v in p.values()]))
            elif p.kind == "uniform":
                got[key] = trial.suggest_float(name, *p.uniform)
            elif p.kind == "loguniform":
                got[key] = trial.suggest_float(name, *p.loguniform, log=True)
            else:
                got[key] = trial.suggest_int(name, *p.int)
        return {**self.constant, **decoded}


def define_by_run(spec: SweepSpec) -> DefineByRun:
    """The define-by-run function of ``spec`` for ``OptunaSearch(space=...)``."""
    return DefineByRun(spec)


def _sampler(spec: SweepSpec) -> Any:
    import optuna

    # Optuna's default of 10 random start-up trials would make a small search purely random.
    startup = min(10, max(2, spec.search.num_samples // 3))
    seed = spec.search.seed
    if spec.search.algorithm == "optuna-gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup,
                                         warn_independent_sampling=False)
    conditional = any(p.when or p.also for p in spec.space.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # group=True: TPE models each conditional sub-space jointly instead of falling back
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup,
                                          multivariate=True, group=conditional)


# --- the entry point -----------------------------------------------------------------------


def build_search(spec: SweepSpec, *, storage: Any = None,
                 study_name: str | None = None) -> tuple[dict[str, Any], Any, int]:
    """``(param_space, search_alg, num_samples)`` for ``tune.Tuner``.

    ``search_alg`` already enforces ``search.max_concurrent`` (a ``BasicVariantGenerator`` for
    grid/random, a ``ConcurrencyLimiter`` around ``OptunaSearch`` for Optuna); ``storage`` and
    ``study_name`` go to ``OptunaSearch`` (an RDB study can be resumed and inspected);
    ``storage`` may be an ``optuna.storages.BaseStorage`` or an RDB URL string.
    """
    from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter

    s = spec.search
    if s.algorithm == "grid":
        from ray import tune

        alg = BasicVariantGenerator(max_concurrent=s.max_concurrent)
        return {PREFIX: tune.grid_search(grid_trials(spec))}, alg, 1
    if s.algorithm == "random":
        alg = BasicVariantGenerator(max_concurrent=s.max_concurrent, random_state=s.seed)
        return {PREFIX: _random_space(spec, random.Random(s.seed))}, alg, s.num_samples
    from orchestrator.sweep.optuna_search import ResumableOptunaSearch as OptunaSearch

    if isinstance(storage, str):  # an RDB URL; OptunaSearch asserts a BaseStorage object
        import optuna

        storage = optuna.storages.RDBStorage(storage)
    storage = _mirrored(storage, study_name)
    # Trials report the searcher's value under "objective" (orchestrator/sweep/worker.py): the
    # spec's metric, or a penalty for a diverged trial.
    searcher = OptunaSearch(space=define_by_run(spec), metric="objective", mode=s.mode,
                            sampler=_sampler(spec), storage=storage, study_name=study_name)
    return {}, ConcurrencyLimiter(searcher, max_concurrent=s.max_concurrent), s.num_samples


def _mirrored(storage: Any, study_name: str | None) -> Any:
    """An RDB study as the searcher's in-memory copy, written through to the RDB off Tune's
    event loop (orchestrator/sweep/study_mirror.py); any other storage as it is."""
    import optuna

    if not isinstance(storage, optuna.storages.RDBStorage) or study_name is None:
        return storage
    from orchestrator.sweep.study_mirror import MirroredStorage, use_rdb

    use_rdb(study_name, storage.url)  # a restored searcher of this study opens this RDB
    return MirroredStorage(storage, study_name)


def flat_from_tune_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The trial's flat dotted overrides from what Tune hands the trainable.

    Accepts ``{"trial": {...}}`` (every path above) or the flat dict itself; resolves the
    ``:special`` switches, drops absent (``None``) conditional params, turns ``"inf"`` into
    ``math.inf`` and numpy scalars into Python scalars.
    """
    trial = config[PREFIX] if isinstance(config.get(PREFIX), Mapping) else config
    flat: dict[str, Any] = {}
    for k, v in trial.items():
        if k.endswith(AXIS):
            continue  # the raw axis point; its decoded value is under the key itself
        if k.endswith(SPECIAL):
            if v != REGULAR:
                flat[k[: -len(SPECIAL)]] = _dec(v)
        elif v is not None:
            flat.setdefault(k, _dec(v))
    return flat
