"""The saturation control over training: the worst sublayer per trial and step, the mean over
an arm's seeds; nothing for arms (or sweeps) without sphere families."""

from __future__ import annotations

import pandas as pd
import pytest

from orchestrator.analysis.saturation import beta_table, write_saturation
from orchestrator.analysis.tables import _md_table


def _rows():
    rows = []
    for trial, share in (("t0", (0.0, 1.0)), ("t1", (0.2, 0.6))):
        for step, f in ((100, 0.0), (200, 1.0)):
            for k, s in enumerate(share):
                rows.append({"trial": trial, "step": step, "metric": "stream.frac_beta_gt_half_pi",
                             "module": "stream", "layer": k, "next_layer": -1, "value": s * f})
                rows.append({"trial": trial, "step": step, "metric": "stream.beta_mean",
                             "module": "stream", "layer": k, "next_layer": -1,
                             "value": 10 * s * f + 0.1})
    rows.append({"trial": "t2", "step": 200, "metric": "w.s1_s2", "module": "q", "layer": 0,
                 "next_layer": -1, "value": 2.0})
    return pd.DataFrame(rows)


TRIALS = pd.DataFrame({"trial": ["t0", "t1", "t2"], "arm": ["p=1", "p=1", "pre_ln"]})


def test_worst_sublayer_then_mean_over_seeds(tmp_path):
    tab = beta_table(TRIALS, _rows()).set_index(["arm", "step"])
    assert tab.loc[("p=1", 200), "saturated_share"] == pytest.approx((1.0 + 0.6) / 2)
    assert tab.loc[("p=1", 200), "beta_max"] == pytest.approx((10.1 + 6.1) / 2)
    assert tab.loc[("p=1", 100), "saturated_share"] == 0.0
    assert tab.loc[("p=1", 200), "seeds"] == 2
    assert "pre_ln" not in tab.index.get_level_values("arm")
    lines = write_saturation(TRIALS, _rows(), tmp_path, _md_table)
    assert (tmp_path / "beta.csv").exists() and "| p=1 | 0 | 0.8 |" in "\n".join(lines)
    assert write_saturation(TRIALS, _rows().query("module != 'stream'"), tmp_path,
                            _md_table) == []
