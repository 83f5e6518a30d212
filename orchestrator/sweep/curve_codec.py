"""A report's per-step curve as a few strings in the Tune result, not a dict a point.

The curve (train loss, grad norm, lr of every step since the last report, val loss at each
eval) is most of a result: ~800 points for half a 550-step gpt-debug trial. Tune handles a
result on its event loop, where the reporting trial waits for it (docs/platform.md): it
unpickles it, formats it whole into a debug message whatever the log level (``repr`` of ~800
dicts: ~1.3 ms), and does both again for the copy the trial's ``save`` returns with a
checkpoint. As one string per column the same curve (900 points) unpickles in 0.01 ms
instead of 0.32 and formats in 0.02 ms instead of 1.4; packing it costs the trial 0.6 ms a
report, unpacking the writer 0.4 (measured on this project's 2-core machine). Only the
sink's writer thread (orchestrator/sweep/callback.py) turns it back into the points the
stores take.

Packed form: ``{"series": [[split, metric], ...], "code": uint16 per point (its series),
"step": int64, "value": float64, "wall_time": float64}``, each column little-endian whatever
the host and as base64 text (JSON-safe: Ray Train's controller encodes reports as JSON).
NaN and +-inf values travel as they are; a missing wall time (``CurvePoint`` always has one) as NaN.
"""

from __future__ import annotations

import base64
import math
import sys
from array import array
from collections.abc import Iterable
from typing import Any

__all__ = ["pack_curve", "unpack_curve"]

_KEYS = ("series", "code", "step", "value", "wall_time")
_SWAP = sys.byteorder != "little"  # the columns are little-endian on the wire


def pack_curve(points: Iterable[Any]) -> dict[str, Any]:
    """``CurvePoint``s (or dicts with the same fields) as the packed columns."""
    series: dict[tuple[str, str], int] = {}
    code, step, value, wall = array("H"), array("q"), array("d"), array("d")
    for p in points:
        d = p if isinstance(p, dict) else vars(p)
        sm = (d["split"], d["metric"])
        c = series.get(sm)
        if c is None:
            c = series[sm] = len(series)
        code.append(c)
        step.append(int(d["step"]))
        value.append(float(d["value"]))
        w = d.get("wall_time")
        wall.append(math.nan if w is None else float(w))
    if _SWAP:
        for a in (code, step, value, wall):
            a.byteswap()
    return {"series": [list(sm) for sm in series], "code": _text(code), "step": _text(step),
            "value": _text(value), "wall_time": _text(wall)}


def _text(a: array) -> str:
    """A column's bytes as base64 text: Ray Train's controller JSON-encodes what a worker
    reports (the ``train`` executor), and bytes are not JSON."""
    return base64.b64encode(a.tobytes()).decode("ascii")


def unpack_curve(obj: Any) -> list[dict[str, Any]]:
    """The points ``{step, split, metric, value, wall_time}`` of a packed curve; a list of
    point dicts (a payload built by hand, e.g. in tests) or None is returned as it is / []."""
    if not obj:
        return []
    if isinstance(obj, list):
        return obj
    if not isinstance(obj, dict) or set(obj) != set(_KEYS):
        raise ValueError(f"not a packed curve: {type(obj).__name__} with keys "
                         f"{sorted(obj) if isinstance(obj, dict) else '-'}")
    cols = []
    for key, kind in (("code", "H"), ("step", "q"), ("value", "d"), ("wall_time", "d")):
        a = array(kind)
        try:
            a.frombytes(base64.b64decode(obj[key], validate=True))
        except (ValueError, TypeError) as e:  # binascii.Error is a ValueError
            raise ValueError(f"packed curve: column {key!r} is not {kind} values ({e})") from None
        if _SWAP:
            a.byteswap()
        cols.append(a)
    if len({len(c) for c in cols}) != 1:
        raise ValueError("packed curve: columns of different lengths")
    names = [tuple(sm) for sm in obj["series"]]
    if cols[0] and max(cols[0]) >= len(names):
        raise ValueError("packed curve: a point's series is not in its series list")
    return [{"step": s, "split": names[c][0], "metric": names[c][1], "value": v,
             "wall_time": w} for c, s, v, w in zip(*cols)]
