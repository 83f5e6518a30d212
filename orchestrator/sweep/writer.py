"""One background thread that runs writes in the order they were handed over.

Tune's event loop calls the searcher and the callbacks between a trial's report and the
moment that trial may train on (``tune.report`` blocks until the driver has finished with
the result): a write there is paid by the trial. What only has to be on disk before Tune's
next experiment snapshot (and before the next thing that reads it) goes to a
``SerialWriter``; ``flush`` waits for it.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["SerialWriter", "flush_all", "flush_at_end"]

log = logging.getLogger(__name__)
_LIVE: weakref.WeakSet = weakref.WeakSet()
_HOLDERS: weakref.WeakSet = weakref.WeakSet()  # objects that hold writes back until flush()


class SerialWriter:
    """``submit(fn, *args)`` runs ``fn(*args)`` on one daemon thread, in submission order;
    ``flush()`` waits for every submitted call and raises the first error any of them
    raised. Pickles to a fresh, idle writer (Tune pickles searchers and callbacks)."""

    def __init__(self, name: str = "geosweep-writer") -> None:
        self.name = name
        self._queue: queue.Queue | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        _LIVE.add(self)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._queue is None:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._drain, name=self.name, daemon=True)
            self._thread.start()
        self._queue.put((fn, args))

    def pending(self) -> int:
        """Calls submitted and not yet finished."""
        return self._queue.unfinished_tasks if self._queue is not None else 0

    def flush(self) -> None:
        if self._queue is not None:
            self._queue.join()
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _drain(self) -> None:
        while True:
            fn, args = self._queue.get()
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - raised by flush()
                log.error("%s: %r", self.name, e)
                self._error = self._error or e
            finally:
                # no reference to the call kept while idle (its bound object may go)
                fn = args = None
                self._queue.task_done()

    def __getstate__(self) -> dict:
        return {"name": self.name}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["name"])


def flush_at_end(holder: Any) -> None:
    """``holder.flush()`` runs in ``flush_all`` (an object that hands its writes to a writer
    only at times of its own choosing, e.g. orchestrator/sweep/study_mirror.py)."""
    _HOLDERS.add(holder)


def flush_all() -> None:
    """Flush every writer of this process (the end of a sweep: nothing left queued)."""
    for h in list(_HOLDERS):
        h.flush()
    for w in list(_LIVE):
        w.flush()
