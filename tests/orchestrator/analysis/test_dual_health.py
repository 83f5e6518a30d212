"""The dual-convergence table on constructed metric rows (orchestrator/analysis/dual_health.py)."""

from __future__ import annotations

import pandas as pd
import pytest

from orchestrator.analysis.dual_health import dual_settings, dual_table, write_dual

TOL, CAP = 1e-6, 20


def _rows(trial: str, module: str, residuals: list[float], passes: list[int]) -> list[dict]:
    out = []
    for step, (r, p) in enumerate(zip(residuals, passes)):
        for metric, v in (("optim/dual_residual", r), ("optim/dual_passes", p)):
            out.append({"trial": trial, "step": 100 * step, "metric": metric, "module": module,
                        "layer": 0, "next_layer": -1, "value": float(v)})
    return out


def _data():
    trials = pd.DataFrame({"trial": ["t0", "t1", "t2"],
                           "arm": ["assign=stiefel", "assign=dgram", "assign=none"]})
    rows = (_rows("t0", "fc", [1e-7, 5e-7, 2e-7, 9e-7], [8, 10, 12, 14])
            + _rows("t1", "fc", [1e-7, 3e-7], [7, 9])
            # square DGram: two samples hit the cap above tol, one reached tol on the last pass,
            # one stopped early above tol (a batch-mate used the budget)
            + _rows("t1", "o", [1e-2, 3e-4, 8e-7, 1e-7, 5e-5], [20, 20, 20, 6, 12])
            + [{"trial": "t2", "step": 0, "metric": "val/loss", "module": "", "layer": -1,
                "next_layer": -1, "value": 2.0}])
    return pd.DataFrame(rows), trials


def _settings(trials):
    return pd.DataFrame({"trial": trials["trial"], "tol": TOL, "cap": float(CAP)})


def test_table_counts_tolerance_and_cap():
    metrics, trials = _data()
    tab = dual_table(metrics, trials, _settings(trials)).set_index(["arm", "module"])
    st = tab.loc[("assign=stiefel", "fc")]
    assert st["n"] == 4 and st["at_tol"] == 1.0 and st["capped"] == 0.0
    assert st["res_max"] == pytest.approx(9e-7) and st["passes_max"] == 14
    assert st["passes_mean"] == pytest.approx(11.0)
    sq = tab.loc[("assign=dgram", "o")]
    # the 3rd sample used all 20 passes but ended below tol: converged, not capped
    assert sq["at_tol"] == pytest.approx(0.4) and sq["capped"] == pytest.approx(0.4)
    assert sq["res_max"] == pytest.approx(1e-2)
    # the arm without manifold matrices has no row; arms keep the trials table's order
    assert [a for a, _ in tab.index] == ["assign=stiefel", "assign=dgram", "assign=dgram"]


def test_a_trial_specific_tolerance_is_used():
    metrics, trials = _data()
    trials = trials.assign(**{"optim.manifold.dual_tol": [None, 1e-1, None]})
    s = dual_settings("/nonexistent", trials)
    assert s.set_index("trial").loc["t1", "tol"] == 1e-1
    assert s.set_index("trial").loc["t0", "tol"] == 1e-4  # the default mode's (fast)
    tab = dual_table(metrics, trials, s).set_index(["arm", "module"])
    assert tab.loc[("assign=dgram", "o"), "at_tol"] == 1.0


def test_a_null_tolerance_is_the_trials_modes_own():
    _, trials = _data()
    trials = trials.assign(**{"optim.manifold.dual_mode": ["exact", "paper", "fast"],
                              "optim.manifold.dual_steps": [None, 7, None]})
    s = dual_settings("/nonexistent", trials).set_index("trial")
    assert (s.loc["t0", "tol"], s.loc["t0", "cap"]) == (1e-6, 100.0)
    assert (s.loc["t1", "tol"], s.loc["t1", "cap"]) == (1e-6, 7.0)
    assert (s.loc["t2", "tol"], s.loc["t2", "cap"]) == (1e-4, 20.0)


def test_no_dual_rows_no_section(tmp_path):
    metrics, trials = _data()
    plain = metrics[~metrics["metric"].str.startswith("optim/")]
    assert write_dual(plain, trials, tmp_path, tmp_path) == []
    assert not (tmp_path / "dual.csv").exists()


def test_section_names_every_unconverged_matrix_worst_first(tmp_path):
    metrics, trials = _data()
    # a second arm whose square matrix also missed the tolerance, less often
    metrics = pd.concat([metrics, pd.DataFrame(
        _rows("t0", "o", [1e-7, 2e-7, 3e-3, 1e-7], [3, 3, 20, 3]))], ignore_index=True)
    trials = trials.assign(**{"optim.manifold.dual_tol": TOL})  # the trials ran at 1e-6
    lines = write_dual(metrics, trials, tmp_path, tmp_path)
    text = "\n".join(lines)
    assert "Not converged everywhere" in text
    first, second = text.index("o in assign=dgram in 60%"), text.index("o in assign=stiefel in 25%")
    assert first < second
    assert "fc in" not in text  # the converged ones are not named
    assert (tmp_path / "dual.csv").is_file()
    back = pd.read_csv(tmp_path / "dual.csv")
    assert len(back) == 4 and set(back.columns) >= {"at_tol", "capped", "res_max"}
