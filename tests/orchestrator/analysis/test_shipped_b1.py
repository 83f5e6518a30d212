"""docs/results.md §0h's verdicts recompute from the shipped trials table: the report's rule on
docs/results/manifold_assignment_b1/trials.csv (one row per trial) gives the shipped
verdicts.csv, answers and numbers, for the claims search_spaces/manifold_assignment_b1.yaml
declares."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from orchestrator.analysis.verdicts import verdict_table
from orchestrator.spec.yaml_reader import load_spec

ROOT = Path(__file__).resolve().parents[3]
RUN = ROOT / "docs/results/manifold_assignment_b1"


def _trials() -> pd.DataFrame:
    t = pd.read_csv(RUN / "trials.csv")
    # the arm label is the run's parameter ("optim.manifold.assignment=hetero"): its column
    for key, value in (label.split("=", 1) for label in t["arm"]):
        t.loc[t["arm"] == f"{key}={value}", key] = value
    return t


def test_b1_verdicts_recompute_from_the_shipped_trials():
    shipped = pd.read_csv(RUN / "verdicts.csv").set_index("claim")
    spec = load_spec("manifold_assignment_b1")
    got = verdict_table(list(spec.claims), _trials(),
                        reference_loss=float(shipped["trained_reference"].iloc[0]))
    got = got.set_index("claim")
    assert list(got.index) == list(shipped.index) == ["B1", "B1u"]
    for claim in shipped.index:
        for col in ("verdict", "direction", "size", "design"):
            assert got.loc[claim, col] == shipped.loc[claim, col], (claim, col)
        for col in ("diff", "lo", "hi", "p_holm", "mde"):
            assert got.loc[claim, col] == pytest.approx(shipped.loc[claim, col], rel=1e-9), \
                (claim, col)
    # what §0h states
    assert (got.loc["B1", "direction"], got.loc["B1", "size"]) == ("confirmed", "larger")
    assert got.loc["B1u", "direction"] == "opposite"
    assert got.loc["B1", "n_arm"] == got.loc["B1", "n_baseline"] == 24
