"""The torch-free name lists that validation reads (workloads/choices.py, residual_params.py)
are the registries' own names, and validating a spec imports no torch."""

from __future__ import annotations

import subprocess
import sys

from workloads import choices
from workloads.geometry.manifolds import MANIFOLDS
from workloads.geometry.msign import MSIGN_METHODS
from workloads.models.mlp import ACTIVATIONS, NORMS
from workloads.residual import RESIDUALS
from workloads.residual_params import FAMILY_PARAMS


def test_name_lists_equal_the_registries():
    assert choices.MSIGN_METHOD_NAMES == tuple(MSIGN_METHODS)
    assert choices.ACTIVATION_NAMES == tuple(ACTIVATIONS)
    assert choices.NORM_NAMES == tuple(NORMS)
    assert choices.CONSTRAINT_NAMES == tuple(MANIFOLDS)
    assert {c for kinds in choices.STRATEGIES.values() for c in kinds.values()} <= set(MANIFOLDS)
    assert tuple(FAMILY_PARAMS) == tuple(RESIDUALS)
    assert all(RESIDUALS[n].Params is FAMILY_PARAMS[n] for n in RESIDUALS)


def test_validating_a_spec_imports_no_torch():
    """What every geosweep command does first (load and validate a shipped spec with a GPT and
    Manifold Muon) leaves torch unimported: its ~2-3 s stay out of a sweep's start."""
    code = ("import sys\n"
            "from orchestrator.spec.yaml_reader import load_spec\n"
            "load_spec('manifold_assignment')\n"
            "load_spec('continuity_mlp')\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
