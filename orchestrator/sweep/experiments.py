"""The Tune experiments of one sweep: the first, and the extensions that add seeds or samples.

Tune cannot add trials to a finished experiment (``Tuner.restore`` only finishes what it
planned), so ``geosweep resume DIR --more-seeds N`` / ``--num-samples N`` runs one more Tune
experiment in the same sweep folder (``ray/tune-2``, ``ray/tune-3``, ...) that writes into the
same MLflow parent, Parquet dataset and Optuna study. Each experiment is described by a small
JSON file next to its Tune folder (``ray/<name>.json``: the spec it ran with and, for an
explicit trial list, the trials), so an interrupted extension resumes like the first one.

What an extension runs:
- ``--more-seeds N`` on a grid: every arm of the spec with N new seeds (max seed + 1, ...);
- ``--more-seeds N`` on a search (random/Optuna): every completed trial's params again with N
  new seeds: the repeats a confidence interval needs, for the configurations the search found;
- ``--num-samples N`` on a search: N more trials; Optuna continues the study in
  ``<sweep>/optuna.db`` (it sees every earlier trial), random search draws from a new stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.spec.sweep_spec import SpecError, SweepSpec

__all__ = ["Experiment", "Extension", "FIRST", "plan_extension", "load_experiment",
           "save_experiment", "experiment_names", "build_experiment_search"]

FIRST = "tune"  # the first experiment's folder under ray/
_FINAL = ("completed", "diverged", "stopped", "failed")


@dataclass
class Extension:
    """What ``geosweep resume --more-seeds N / --num-samples N`` asks for."""

    more_seeds: int = 0
    num_samples: int = 0
    # --until-decided: the new seeds go to these arms (labels) only, the baseline included
    only_arms: frozenset[str] | None = None

    def __bool__(self) -> bool:
        return bool(self.more_seeds or self.num_samples)


@dataclass
class Experiment:
    name: str  # folder under ray/ ("tune", "tune-2", ...)
    spec: SweepSpec  # what the experiment's searcher is built from
    trials: list[dict[str, Any]] | None = None  # an explicit trial list (flat params)

    @property
    def count(self) -> int:
        from orchestrator.sweep.space import count_trials

        return len(self.trials) if self.trials is not None else count_trials(self.spec)


def experiment_names(ray_root: Path) -> list[str]:
    """The sweep's experiments in the order they ran (the first one has no JSON of its own
    in sweeps written before extensions existed)."""
    names = [FIRST]
    k = 2
    while (ray_root / f"{FIRST}-{k}.json").exists():
        names.append(f"{FIRST}-{k}")
        k += 1
    return names


def save_experiment(ray_root: Path, exp: Experiment) -> None:
    ray_root.mkdir(parents=True, exist_ok=True)
    body = {"name": exp.name, "spec": exp.spec.model_dump(mode="json"), "trials": exp.trials}
    tmp = ray_root / f".{exp.name}.json.tmp"
    tmp.write_text(json.dumps(body, indent=1, default=str))
    tmp.replace(ray_root / f"{exp.name}.json")


def load_experiment(ray_root: Path, name: str, fallback: SweepSpec) -> Experiment:
    path = ray_root / f"{name}.json"
    if not path.exists():
        return Experiment(name, fallback)
    body = json.loads(path.read_text())
    return Experiment(name, SweepSpec.model_validate(body["spec"]), body.get("trials"))


def _int_seed(v: Any) -> int:
    return int(round(float(v)))


def plan_extension(spec: SweepSpec, records: list[dict[str, Any]], ext: Extension,
                   planned: int, index: int) -> tuple[SweepSpec, Experiment]:
    """(the sweep's spec after the extension, the extension experiment ``tune-<index>``).

    ``records``: every trial of the sweep so far (Parquet); ``planned``: trials planned so far.
    Raises ``SpecError`` (one line) when the extension does not apply or the sweep is unfinished.
    """
    if ext.more_seeds and ext.num_samples:
        raise SpecError("--more-seeds and --num-samples: give one of them per resume")
    if ext.more_seeds < 0 or ext.num_samples < 0:
        raise SpecError("--more-seeds/--num-samples must be positive")
    unfinished = [r["trial"] for r in records if r.get("status") not in _FINAL]
    if unfinished or len(records) < planned:
        raise SpecError(f"the sweep is not finished ({len(records) - len(unfinished)} of "
                        f"{planned} trials done): run `geosweep resume DIR` first")
    name = f"{FIRST}-{index}"
    algo = spec.search.algorithm
    if ext.num_samples:
        if algo == "grid":
            raise SpecError("--num-samples: a grid sweep runs every arm once per seed; use "
                            "--more-seeds N for repeats")
        search = spec.search.model_copy(update={"num_samples": ext.num_samples,
                                                "seed": spec.search.seed + 7919 * index})
        ext_spec = spec.model_copy(update={"search": search})
        total = spec.search.model_copy(
            update={"num_samples": spec.search.num_samples + ext.num_samples})
        return spec.model_copy(update={"search": total}), Experiment(name, ext_spec)

    seen = {_int_seed(r["seed"]) for r in records if r.get("seed") is not None}
    start = max(seen | set(spec.seeds)) + 1
    new_seeds = list(range(start, start + ext.more_seeds))
    whole = spec.model_copy(update={"seeds": list(spec.seeds) + new_seeds})
    if algo == "grid" and ext.only_arms is not None:  # seeds for some arms only: a list
        from orchestrator.sweep.space import grid_trials

        picked = [t for t in grid_trials(spec.model_copy(update={"seeds": new_seeds}))
                  if spec.arm_label(t) in ext.only_arms]
        if not picked:
            raise SpecError(f"--until-decided: no arm of the grid is named "
                            f"{sorted(ext.only_arms)}")
        return whole, Experiment(name, spec, picked)
    if algo == "grid":
        return whole, Experiment(name, spec.model_copy(update={"seeds": new_seeds}))
    done = [r for r in records if r.get("status") == "completed"]
    if not done:
        raise SpecError("--more-seeds: the search has no completed trial to repeat")
    int_keys = {k for k, p in spec.space.items() if p.kind == "int"}
    trials, arms = [], set()
    for r in sorted(done, key=lambda r: str(r["trial"])):
        params = {k: (int(v) if k in int_keys else v) for k, v in r["params"].items()
                  if k != "train.seed"}
        label = spec.arm_label(params)
        if label in arms or (ext.only_arms is not None and label not in ext.only_arms):
            continue  # the same configuration twice: repeat it once; or not asked for
        arms.add(label)
        trials += [{**params, "train.seed": s} for s in new_seeds]
    if not trials:
        raise SpecError("--until-decided: no completed trial of the arms "
                        f"{sorted(ext.only_arms or [])}")
    return whole, Experiment(name, spec, trials)


def build_experiment_search(exp: Experiment, storage: str | None,
                            study_name: str) -> tuple[dict[str, Any], Any, int]:
    """``(param_space, search_alg, num_samples)`` of one experiment (see space.build_search)."""
    from orchestrator.sweep.space import PREFIX, build_search

    if exp.trials is None:
        return build_search(exp.spec, storage=storage, study_name=study_name)
    from ray import tune
    from ray.tune.search import BasicVariantGenerator

    alg = BasicVariantGenerator(max_concurrent=exp.spec.search.max_concurrent)
    return {PREFIX: tune.grid_search(exp.trials)}, alg, 1
