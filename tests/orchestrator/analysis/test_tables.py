"""Markdown cell formatting of the report's tables (orchestrator/analysis/tables.py)."""
import numpy as np

from orchestrator.analysis.tables import _fmt


def test_fmt_says_no_for_false():
    """A False parameter (model.skip) prints "no", not a blank that reads as "not set"."""
    assert (_fmt(True), _fmt(False), _fmt(np.bool_(False)), _fmt(None)) == ("yes", "no", "no", "-")
    assert (_fmt(float("nan")), _fmt(0.123456), _fmt("a|b")) == ("-", "0.1235", "a\\|b")


def test_seed_means_equal_the_groupby_mean():
    """arm_table's per-arm seed means equal _by_seed's pandas groupby mean (NaN skipped, an
    all-NaN seed -> NaN, inf kept), on random data with repeated seeds."""
    import math

    import pandas as pd

    from orchestrator.analysis.load import _by_seed
    from orchestrator.analysis.tables import _seed_means

    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 12))
        seeds = rng.integers(0, 4, n)
        vals = rng.normal(size=n)
        vals[rng.random(n) < 0.2] = np.nan
        vals[rng.random(n) < 0.05] = np.inf
        want = _by_seed(pd.DataFrame({"seed": seeds, "m": vals}), "m").to_dict()
        got = _seed_means(seeds.astype(object), vals)
        assert set(got) == set(want)
        for k, v in want.items():
            # equal up to summation order (pandas sums with compensation)
            assert (math.isnan(v) and math.isnan(got[k])) or got[k] == v or math.isclose(
                got[k], v, rel_tol=1e-12), (k, v, got[k])
