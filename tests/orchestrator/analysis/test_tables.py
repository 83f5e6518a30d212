"""Markdown cell formatting of the report's tables (orchestrator/analysis/tables.py)."""
import numpy as np

from orchestrator.analysis.tables import _fmt


def test_fmt_says_no_for_false():
    """A False parameter (model.skip) prints "no", not a blank that reads as "not set"."""
    assert (_fmt(True), _fmt(False), _fmt(np.bool_(False)), _fmt(None)) == ("yes", "no", "no", "-")
    assert (_fmt(float("nan")), _fmt(0.123456), _fmt("a|b")) == ("-", "0.1235", "a\\|b")
