"""The packed per-step curve of a Tune result (orchestrator/sweep/curve_codec.py)."""

from __future__ import annotations

import json
import math
import pickle

import pytest

from orchestrator.spec.divergence_rules import DivergenceRules
from orchestrator.sweep.curve_codec import pack_curve, unpack_curve
from orchestrator.sweep.worker import make_payload
from workloads.report import CurvePoint, Report


def _points() -> list[CurvePoint]:
    out = []
    for s in range(1, 301):
        out += [CurvePoint(s, "train", "loss", 4.0 - 1e-3 * s, 0.01 * s),
                CurvePoint(s, "train", "grad_norm", math.inf if s == 7 else 1.3, 0.01 * s),
                CurvePoint(s, "train", "lr", 1e-3, 0.01 * s)]
    out.append(CurvePoint(300, "val", "loss", math.nan, 3.0))
    out.append(CurvePoint(2**40, "val", "cont/a/b", -0.0, 1e9))  # a metric name with '/'
    return out


def test_points_come_back_exactly_in_order():
    pts = _points()
    got = unpack_curve(pickle.loads(pickle.dumps(pack_curve(pts))))
    want = [vars(p) for p in pts]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in w:
            if isinstance(w[k], float) and math.isnan(w[k]):
                assert math.isnan(g[k])
            else:
                assert g[k] == w[k] and type(g[k]) is type(w[k]), (k, g[k], w[k])
    assert math.copysign(1.0, got[-1]["value"]) == -1.0  # -0.0 stays -0.0


def test_the_packed_form_is_a_handful_of_objects():
    """What Tune unpickles and formats per result: four strings and the series names,
    not five objects a point (the time it saves is measured in the module's docstring)."""
    pts = _points()
    packed = pack_curve(pts)
    assert [type(packed[k]) for k in ("code", "step", "value", "wall_time")] == [str] * 4
    assert json.loads(json.dumps(packed)) == packed  # Ray Train's controller JSON-encodes it
    assert packed["series"] == [["train", "loss"], ["train", "grad_norm"], ["train", "lr"],
                                ["val", "loss"], ["val", "cont/a/b"]]


def test_empty_lists_and_bad_input():
    assert unpack_curve(pack_curve([])) == []
    assert unpack_curve(None) == [] and unpack_curve([]) == []
    by_hand = [{"step": 1, "split": "train", "metric": "loss", "value": 1.0, "wall_time": 0.1}]
    assert unpack_curve(by_hand) is by_hand  # a payload built by hand goes through as it is
    packed = pack_curve(_points()[:3])
    with pytest.raises(ValueError, match="not a packed curve"):
        unpack_curve({"step": packed["step"]})
    with pytest.raises(ValueError, match="different lengths"):
        unpack_curve({**packed, "value": pack_curve(_points()[:1])["value"]})
    with pytest.raises(ValueError, match="packed curve"):
        unpack_curve({**packed, "value": packed["value"][:12]})  # not whole float64s
    with pytest.raises(ValueError, match="series"):
        unpack_curve({**packed, "series": packed["series"][:1]})


def test_the_worker_payload_carries_the_packed_curve():
    pts = _points()[:6]
    rep = Report(step=2, scalars={"train/loss": 3.9}, curve=pts)
    out = make_payload(rep, {"node": "n", "params": {}, "arm": "a", "seed": 0}, "val/loss",
                       4.0, DivergenceRules(), {})
    assert isinstance(out["_curve"]["value"], str)
    assert unpack_curve(out["_curve"]) == [vars(p) for p in pts]
