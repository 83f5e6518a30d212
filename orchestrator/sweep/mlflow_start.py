"""The sweep's default MLflow store, built on a thread beside Ray's start and the first trials.

Building it costs seconds of CPU (MLflow's imports ~2.5 s, then the sqlite schema migrations of
a new store ~2-4 s on 2 cores): in series it delayed the first trial by all of it. The driver
first imports what it needs up to the first trial (``import_driver_modules``: Tune, the sinks),
then starts the thread, which imports MLflow and builds the store while Ray starts (or is
joined) and Tune starts the first trials; the result sink's writer (orchestrator/sweep/
callback.py) waits for the store at its first MLflow write. Imports in that order never run
on both threads at once for the same module trees: two threads importing overlapping trees
can meet in Python's per-module import locks (a ``_DeadlockError``); between Ray's start
and the first trial, Tune imports only its own ``ray.air`` integration modules.
"""

from __future__ import annotations

import threading
from typing import Any

from orchestrator.spec.sweep_spec import SweepSpec
from orchestrator.store.layout import SweepPaths

__all__ = ["StoreThread", "mlflow_sink", "import_driver_modules"]


def mlflow_sink(spec: SweepSpec, paths: SweepPaths) -> Any:
    """The sweep's MLflow writer with its parent run."""
    from orchestrator.store.mlflow import MlflowSink
    from orchestrator.sweep.provenance import provenance

    mlflow = MlflowSink(paths.mlflow_uri, spec.tracking.experiment or spec.name, spec.name,
                        artifact_location=str(paths.artifacts))
    mlflow.start_parent(spec.to_yaml(), params={"sweep": spec.name}, provenance=provenance())
    return mlflow


def import_driver_modules(optuna_url: str | None = None) -> Any:
    """What the driver imports between Ray's start and the first trial (Tune, the sinks, the
    trial driver), imported before the store's thread starts importing MLflow's modules.
    ``optuna_url``: the Optuna study's RDB, opened here (returned) since opening it imports
    sqlalchemy and alembic as MLflow's store does (~0.8 s, after Ray's start otherwise)."""
    import ray.tune  # noqa: F401
    import ray.tune.schedulers  # noqa: F401

    import orchestrator.store.parquet  # noqa: F401
    import orchestrator.sweep.callback  # noqa: F401
    import orchestrator.sweep.experiments  # noqa: F401
    import orchestrator.sweep.trial  # noqa: F401

    if optuna_url is None:
        return None
    import optuna

    return optuna.storages.RDBStorage(optuna_url)


class StoreThread:
    """``fn(*args)`` on a thread; ``wait()`` returns its value or raises its error."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self._out: Any = None
        self._err: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True,
                                        name="geosweep-sinks")
        self._thread.start()

    def _run(self, fn: Any, args: tuple) -> None:
        try:
            self._out = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised by wait()
            self._err = e

    def wait(self, quiet: bool = False) -> Any:
        """The store (None after an error when ``quiet``)."""
        self._thread.join()
        if self._err is not None and not quiet:
            raise self._err
        return self._out
