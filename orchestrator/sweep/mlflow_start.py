"""The sweep's default MLflow store, built on a thread beside Ray's start and the first trials.

Building it costs seconds of CPU (MLflow's imports ~2.5 s, then the sqlite schema migrations of
a new store ~2-4 s on 2 cores, docs/platform.md): in series it delayed the first trial by all
of it. Now the thread first imports MLflow's modules (``imported``) while the driver starts or
joins Ray, then builds the store while Tune starts the first trials; the result sink's writer
(orchestrator/sweep/callback.py) waits for the store at its first MLflow write. The driver
waits for the imports before it imports Tune: two threads importing overlapping module trees
at once can meet in Python's per-module import locks (a ``_DeadlockError``).
"""

from __future__ import annotations

import threading
from typing import Any

from orchestrator.store.layout import SweepPaths
from orchestrator.sweep.spec import SweepSpec

__all__ = ["StoreThread", "mlflow_sink", "mlflow_imports"]


def mlflow_imports() -> None:
    """What building the store imports, MLflow's lazily imported sqlalchemy store included."""
    from orchestrator.store.mlflow import import_sqlite_store

    import_sqlite_store()
    import orchestrator.sweep.provenance  # noqa: F401


def mlflow_sink(spec: SweepSpec, paths: SweepPaths) -> Any:
    """The sweep's MLflow writer with its parent run."""
    from orchestrator.store.mlflow import MlflowSink
    from orchestrator.sweep.provenance import provenance

    mlflow = MlflowSink(paths.mlflow_uri, spec.tracking.experiment or spec.name, spec.name,
                        artifact_location=str(paths.artifacts))
    mlflow.start_parent(spec.to_yaml(), params={"sweep": spec.name}, provenance=provenance())
    return mlflow


class StoreThread:
    """``first()`` then ``fn(*args)`` on a thread. ``wait_imported()`` returns once ``first``
    ended (or failed: ``wait`` reports it); ``wait()`` returns ``fn``'s value or raises the
    error of either."""

    def __init__(self, fn: Any, *args: Any, first: Any = mlflow_imports) -> None:
        self._out: Any = None
        self._err: BaseException | None = None
        self._imported = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(first, fn, args), daemon=True,
                                        name="geosweep-sinks")
        self._thread.start()

    def _run(self, first: Any, fn: Any, args: tuple) -> None:
        try:
            try:
                first()
            finally:
                self._imported.set()
            self._out = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised by wait()
            self._err = e

    def wait_imported(self) -> None:
        self._imported.wait()

    def wait(self, quiet: bool = False) -> Any:
        """The store (None after an error when ``quiet``)."""
        self._thread.join()
        if self._err is not None and not quiet:
            raise self._err
        return self._out
