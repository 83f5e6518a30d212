"""``--set KEY=VALUE`` on a sweep spec (``geosweep run`` / ``search-p``), before validation.

Grammar (also in README and ``--help``):

* ``KEY`` is the dotted path of a field in the spec's YAML: ``budget.steps=50``,
  ``search.num_samples=4``, ``seeds=2``, ``scheduler.type=none``, ``name=my_sweep``.
* Two sections are maps whose keys are themselves dotted config keys: ``workload.overrides``
  and ``space``. Below them the longest key already present wins, else the whole rest of the
  path is one key: ``workload.overrides.optim.lr=3e-3``,
  ``space.optim.lr={grid: [1e-3, 3e-3]}``, ``space.optim.lr.grid=[1e-3, 3e-3]``.
* ``VALUE`` is a number when it reads as one (``3e-3``, ``1_000``, ``inf``, ``nan``), else YAML
  (``true``, ``[1, 2]``, ``{family: spheret}``, ``null``): ``workloads.config.parse_value``.

The edited mapping is then validated like the file itself, so an unknown field or a bad value
is the usual one-line ``SpecError`` naming the field.
"""

from __future__ import annotations

import copy
from typing import Any

from orchestrator.spec.sweep_spec import SpecError

__all__ = ["DOTTED_MAPS", "parse_set", "apply_sets", "load_spec_with_sets"]

# sections whose keys are dotted workload-config keys, not nested mappings
DOTTED_MAPS = (("workload", "overrides"), ("space",))


def parse_set(item: str) -> tuple[str, Any]:
    """``"budget.steps=50"`` -> ``("budget.steps", 50)``; one-line SpecError if malformed."""
    from workloads.config import ConfigError, parse_value

    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not p for p in key.split(".")):
        raise SpecError(f"--set: expected KEY=VALUE with a dotted KEY (e.g. budget.steps=50), "
                        f"got {item!r}")
    try:
        return key, parse_value(text)
    except ConfigError as e:
        raise SpecError(f"--set {key}: {e}") from None


def _set(data: dict, parts: list[str], value: Any, full: str) -> None:
    node: Any = data
    path: tuple[str, ...] = ()
    i = 0
    while i < len(parts) - 1:
        if path in DOTTED_MAPS:
            rest = parts[i:]
            # the longest existing key (``optim.lr`` of ``optim.lr.grid``), else all of it
            for j in range(len(rest), 0, -1):
                k = ".".join(rest[:j])
                if k in node or j == 1:
                    break
            if k not in node:
                k, j = ".".join(rest), len(rest)
            if j == len(rest):
                node[k] = value
                return
            parts = parts[:i] + [k] + rest[j:]
        part = parts[i]
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise SpecError(f"--set {full}: {where} is {child!r}, not a section")
        node = child
        path = path + (part,)
        i += 1
    node[parts[-1]] = value


def apply_sets(data: Any, items: list[str]) -> dict:
    """A copy of the spec mapping ``data`` with every ``KEY=VALUE`` of ``items`` applied."""
    if not isinstance(data, dict):
        raise SpecError("spec: the top level must be a mapping of sections")
    out = copy.deepcopy(data)
    for item in items:
        key, value = parse_set(item)
        _set(out, key.split("."), value, key)
    return out


def load_spec_with_sets(ref: str, items: list[str] | None):
    """``load_spec(ref)`` with ``--set`` items applied before validation, for a new sweep
    (``run``, ``search-p``). A search (random, Optuna) given more than one seed is refused in
    one line: it runs each sampled configuration once, with ``seeds[0]``, so the other seeds
    would be ignored (issue 33 §8). A resumed sweep's own spec.yaml may list more seeds: those
    ``resume --more-seeds`` added; it is not read through here."""
    from orchestrator.spec.yaml_reader import load_spec_data, spec_from_dict

    data = load_spec_data(ref)
    spec = spec_from_dict(apply_sets(data, items or []))
    if spec.search.algorithm != "grid" and len(spec.seeds) > 1 and spec.seed_budget is None:
        given = "--set seeds" if any(parse_set(i)[0] == "seeds" for i in items or []) \
            else "seeds"
        raise SpecError(
            f"{given}: search.algorithm {spec.search.algorithm} runs each sampled configuration "
            f"once, with seed {spec.seeds[0]}, so {len(spec.seeds)} seeds would be "
            "ignored; give one seed, then repeat the completed configurations with geosweep "
            "resume DIR --more-seeds N (or use search.algorithm grid)")
    return spec
