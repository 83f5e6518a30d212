"""A pickle written before the spec language moved (orchestrator/sweep/params.py ->
orchestrator/spec/params.py) still loads once ``alias_moved_modules`` ran: what a resumed
sweep's Tune state holds (the Optuna define-by-run space and its Params)."""

from __future__ import annotations

import importlib
import pickle
import sys

import pytest

from orchestrator.spec.params import Param
from orchestrator.spec.yaml_reader import spec_from_dict
from orchestrator.sweep.moved_modules import MOVED, alias_moved_modules
from orchestrator.sweep.space import DefineByRun


@pytest.fixture
def no_aliases():
    for old in MOVED:
        sys.modules.pop(old, None)
    yield
    for old in MOVED:
        sys.modules.pop(old, None)


def _as_before_the_move(obj) -> bytes:
    # protocol 2 names classes as text ("c<module>\n<name>\n"), so the old path can be put back
    data = pickle.dumps(obj, protocol=2)
    assert b"corchestrator.spec.params\n" in data
    return data.replace(b"corchestrator.spec.params\n", b"corchestrator.sweep.params\n")


def test_an_old_pickle_fails_without_the_aliases_and_loads_with_them(no_aliases):
    spec = spec_from_dict({
        "name": "moved", "workload": {"preset": "gpt-debug", "overrides": {
            "model.residual": {"family": "spheret", "p": 2.0}}},
        "space": {"optim.lr": {"loguniform": [1e-4, 1e-2]},
                  "model.residual.p": {"choice": [1.0, 2.0], "also": ["inf"]}},
        "search": {"algorithm": "optuna-tpe"}})
    old = _as_before_the_move(DefineByRun(spec))
    with pytest.raises(ModuleNotFoundError, match="orchestrator.sweep.params"):
        pickle.loads(old)
    assert sorted(alias_moved_modules()) == sorted(MOVED)
    assert alias_moved_modules() == []  # idempotent
    space = pickle.loads(old)
    params = dict(space.params)
    assert isinstance(params["optim.lr"], Param)
    assert params["optim.lr"].loguniform == [1e-4, 1e-2]
    assert params["model.residual.p"].also == [float("inf")]


def test_every_old_name_maps_to_an_existing_module():
    for old, new in MOVED.items():
        assert importlib.util.find_spec(old) is None or old in sys.modules, old
        assert importlib.import_module(new).__name__ == new
