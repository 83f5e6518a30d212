"""The public entry points of ``orchestrator`` resolve to their modules, lazily."""

import subprocess
import sys

import pytest

import orchestrator


def test_entry_points_are_the_modules_functions():
    from orchestrator.analysis.load import load_sweep
    from orchestrator.spec.yaml_reader import load_spec
    from orchestrator.store.weights import load_model
    from orchestrator.sweep.tuner import run_sweep

    assert orchestrator.load_spec is load_spec
    assert orchestrator.run_sweep is run_sweep
    assert orchestrator.load_model is load_model
    assert orchestrator.load_sweep is load_sweep
    assert orchestrator.load_spec("quickstart").name == "quickstart"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        orchestrator.nope  # noqa: B018


def test_import_is_cheap():
    code = ("import sys, orchestrator; from orchestrator import cli; "
            "print(sorted(m for m in ('torch', 'ray', 'mlflow', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
