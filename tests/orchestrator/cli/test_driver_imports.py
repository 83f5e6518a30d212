"""What `geosweep run` does before Ray starts (load and validate the spec, check its corpora,
import the sweep driver) imports neither torch nor scipy.stats nor MLflow: their ~5 s would
come before the first trial (issue 16 §1). MLflow is imported on a thread while Ray starts;
torch only in the trials."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = """
import sys
from orchestrator.cli.checks import check_spec_corpora, load_cli_spec
for name in ("quickstart", "manifold_assignment", "continuity_mlp"):
    check_spec_corpora(load_cli_spec(name))
import orchestrator.sweep.tuner
print(sorted(m for m in ("torch", "scipy.stats", "mlflow") if m in sys.modules))
"""


@pytest.mark.timeout(120)
def test_the_driver_reaches_ray_start_without_heavy_imports():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         timeout=110)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
