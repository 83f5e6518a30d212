"""A new sweep's sqlite MLflow store, copied from a migrated empty template.

MLflow builds a new sqlite store by running its whole chain of schema migrations (alembic),
~2-4 s of CPU on 2 cores, while a sweep's first trials start. The database it ends with
holds the schema and MLflow's default experiment, nothing of a sweep. That database is made
once per MLflow/SQLAlchemy version in the cache folder (``$GEOSWEEP_CACHE`` or
``~/.cache/geosweep``, as the datasets) and copied into each new sweep folder; MLflow then
only checks that the schema is current. A store that exists is never touched, and without a
writable cache MLflow builds the store as before.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

__all__ = ["seed_sqlite_store", "template_path"]


def template_path() -> Path:
    import mlflow
    import sqlalchemy

    from workloads.data.cache import cache_root

    name = f"mlflow-{mlflow.__version__}-sqlalchemy-{sqlalchemy.__version__}.db"
    return cache_root() / "mlflow-templates" / name


def _make_template(path: Path) -> None:
    """MLflow's own new store, written under a unique name and renamed into place (two
    sweeps that make it at once both end with a whole file)."""
    from mlflow import MlflowClient

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.unlink(tmp)  # MLflow creates the database itself
    try:
        MlflowClient(f"sqlite:///{tmp}").search_experiments()  # runs the migrations
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _own_default_experiment(db: str) -> None:
    """MLflow's default experiment as this process would have made it: created now, its
    artifacts in ./mlruns of the current directory (the template's are the maker's)."""
    import time

    now = int(time.time() * 1000)
    con = sqlite3.connect(db)
    try:
        with con:
            con.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, "
                        "last_update_time = ? WHERE experiment_id = 0",
                        (os.path.join(os.path.abspath("mlruns"), "0"), now, now))
    finally:
        con.close()


def seed_sqlite_store(db: str | os.PathLike) -> bool:
    """Copy the template to ``db`` when ``db`` does not exist yet; True if it did."""
    db = Path(db)
    if db.exists():
        return False
    try:
        path = template_path()
        if not path.exists():
            _make_template(path)
        db.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=db.name + ".", suffix=".tmp", dir=db.parent)
        os.close(fd)
    except Exception:  # noqa: BLE001 - no writable cache, a read-only sweep folder, MLflow
        return False  # failing on the cache's filesystem: it is only a shortcut, MLflow builds it
    try:
        shutil.copyfile(path, tmp)
        _own_default_experiment(tmp)
        os.replace(tmp, db)  # never a half-copied store under the real name
        return True
    except (OSError, sqlite3.Error):  # as above: MLflow builds it
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
