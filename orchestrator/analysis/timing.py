"""Stage timings of ``geosweep report`` (wall and CPU seconds per stage), for
benchmarks/report_scale.py: with ``GEOSWEEP_REPORT_TIMINGS=FILE`` in the environment the
report command writes them to FILE as JSON. Off by default, and then ``stage`` costs nothing
but a context manager. ``listen(fn)``: ``fn(name)`` as each stage starts (the report command's
progress lines)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["ENV", "start", "stage", "recorded", "listen"]

ENV = "GEOSWEEP_REPORT_TIMINGS"
_active: dict[str, list[float]] | None = None
_listener: Callable[[str], None] | None = None


def listen(fn: Callable[[str], None] | None) -> None:
    """Call ``fn(stage name)`` when a stage starts (None: stop)."""
    global _listener
    _listener = fn


def start() -> None:
    """Record the stages from now on (forgets earlier ones)."""
    global _active
    _active = {}


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Time the block as ``name`` (added up when a stage runs more than once)."""
    if _listener is not None:
        _listener(name)
    if _active is None:
        yield
        return
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        w, c = _active.setdefault(name, [0.0, 0.0])
        _active[name] = [w + time.perf_counter() - w0, c + time.process_time() - c0]


def recorded() -> dict[str, dict[str, float]]:
    """stage -> {"wall_s", "cpu_s"}, in the order the stages first ran."""
    return {k: {"wall_s": round(w, 3), "cpu_s": round(c, 3)}
            for k, (w, c) in (_active or {}).items()}
