"""The collapse ceiling: the context-free reference loss (workloads/data/reference.py), the
stable rule with a ceiling, the loss grid, and the ceiling read from a sweep folder's spec."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.analysis.collapse import MARGIN, collapse_ceiling
from orchestrator.analysis.frontier import critical_lr_table, loss_grid, stable_mask
from workloads.data.reference import unigram_cross_entropy

pytestmark = pytest.mark.timeout(120)


def test_unigram_cross_entropy_by_hand():
    train = np.array([0, 0, 0, 1])  # counts 3, 1, 0 over vocab 3; add-one: 4/7, 2/7, 1/7
    val = np.array([0, 1, 2, 2])
    want = -(math.log(4 / 7) + math.log(2 / 7) + 2 * math.log(1 / 7)) / 4
    assert unigram_cross_entropy(train, val, 3) == pytest.approx(want, rel=1e-12)
    # a token id beyond vocab_size widens the vocabulary instead of failing
    assert math.isfinite(unigram_cross_entropy(train, np.array([5]), 3))
    with pytest.raises(ValueError, match="empty"):
        unigram_cross_entropy(train, np.array([], dtype=np.int64), 3)


def test_uniform_stream_reference_is_log_vocab():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, 200_000)
    assert unigram_cross_entropy(ids[:180_000], ids[180_000:], 64) == pytest.approx(
        math.log(64), abs=0.01)


def _t(rows):
    return pd.DataFrame(rows, columns=["model.residual.family", "optim.lr", "seed",
                                       "final_val_loss", "status"])


def test_a_collapsed_run_is_unstable_only_with_a_ceiling():
    t = _t([("a", 1e-3, 0, 2.2, "completed"), ("a", 1e-2, 0, 2.3, "completed"),
            ("a", 1e-1, 0, 3.45, "completed"),  # at the plateau: completed, finite
            ("a", 1.0, 0, math.nan, "diverged")])
    assert list(stable_mask(t)) == [True, True, True, False]
    assert list(stable_mask(t, ceiling=3.3)) == [True, True, False, False]
    assert list(stable_mask(t, ceiling=math.nan)) == [True, True, True, False]
    assert critical_lr_table(t).loc[0, "critical_lr"] == 1e-1
    tab = critical_lr_table(t, ceiling=3.3)
    assert tab.loc[0, "critical_lr"] == 1e-2
    assert tab.loc[0, "best_lr"] == 1e-3 and tab.loc[0, "best_loss"] == pytest.approx(2.2)
    g = loss_grid(t, ceiling=3.3).set_index("family")
    assert g.loc["a", "0.001"] == "2.200 (1/1)" and g.loc["a", "0.1"] == "3.450 (0/1)"
    assert g.loc["a", "1"] == "- (0/1)"


GPT_SPEC = """name: tiny
workload: {preset: gpt-debug}
space:
  model.residual.family: {grid: [pre_ln, post_ln]}
  optim.lr: {grid: [0.001, 0.01]}
"""


def test_ceiling_from_a_sweep_folder(tmp_path):
    from workloads.config import preset
    from workloads.data.reference import context_free_loss

    assert "no spec.yaml" in collapse_ceiling(tmp_path).note
    (tmp_path / "spec.yaml").write_text(GPT_SPEC)
    c = collapse_ceiling(tmp_path)
    ref = context_free_loss(preset("gpt-debug").data)
    assert c.reference == pytest.approx(ref) and c.value == pytest.approx(ref * (1 - MARGIN))
    assert 3.0 < ref < math.log(84)  # char Shakespeare: below uniform over its 84 symbols
    (tmp_path / "spec.yaml").write_text(GPT_SPEC + "  data.max_tokens: {grid: [100000]}\n")
    c = collapse_ceiling(tmp_path)
    assert math.isnan(c.value) and "varies the data" in c.note
    (tmp_path / "spec.yaml").write_text("name: [broken\n")
    c = collapse_ceiling(tmp_path)
    assert math.isnan(c.value) and c.note.startswith("context-free loss unavailable")
