"""The sweep's own sqlite stores (``mlflow.db``, ``optuna.db``) while its driver writes them:
WAL journal and ``synchronous=NORMAL``; a plain rollback-journal file again when it is done.

Why: with sqlite's defaults (rollback journal, ``synchronous=FULL``) every commit waits for
two or three ``fsync`` calls, measured 19 ms per commit on this project's machines, and a
sweep commits several times per result (MLflow's metrics, the Optuna study's intermediate
value). In WAL mode with ``synchronous=NORMAL`` a commit is one ``write()`` into
``<db>-wal`` (0.03 ms); the WAL is synced only when it is checkpointed into the database.

What it trades (docs/reliability.md, "sqlite stores"):

- ``kill -9`` of the driver (or of any process) loses nothing committed: a commit is in the
  kernel's page cache once ``write()`` returns, and the kernel writes it out whatever happens
  to the process. The next open of the database replays ``<db>-wal``. Proven by
  tests/orchestrator/store/test_sqlite_durability.py (a writer killed with SIGKILL right
  after it acknowledged its commits).
- An OS crash or a power cut can lose the commits since the last checkpoint (the database
  stays consistent: WAL frames are checksummed, a torn tail is dropped). With the defaults it
  would lose none. A sweep resumes from its Tune snapshot and re-runs what is lost.
- While the sweep runs (and after a ``kill -9``), committed data may live in ``<db>-wal``
  only: a copy of the folder must take ``<db>-wal`` with the database (``cp -r``,
  ``rsync -a`` do). When the driver ends the sweep, ``release`` checkpoints the WAL and turns
  the file back into a rollback-journal database, so a finished sweep's folder holds the
  plain ``mlflow.db`` / ``optuna.db`` it always did, and readers that open it read-only
  leave no ``-wal``/``-shm`` files behind.
- WAL needs shared memory between the processes that open the file: a store on a network
  file system (NFS) is not for WAL, as sqlite's own documentation says of any sqlite file
  there.

Only the connections of this process that open a registered file get these settings (a
SQLAlchemy ``connect`` listener: MLflow's and Optuna's engines both, also the engine Optuna
builds again when Tune restores its searcher).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import weakref
from typing import Any

__all__ = ["register", "release", "forget", "registered", "PRAGMAS"]

PRAGMAS = (("journal_mode", "WAL"), ("synchronous", "NORMAL"))
_LOCK = threading.Lock()
_PATHS: set[str] = set()
_ENGINES: dict[str, weakref.WeakSet] = {}
_INSTALLED = False


def _key(path: str | os.PathLike) -> str:
    return os.path.realpath(os.fspath(path))


def registered() -> set[str]:
    """The database files this process opens in WAL mode now (real paths)."""
    with _LOCK:
        return set(_PATHS)


def register(db_path: str | os.PathLike) -> None:
    """From now on, every SQLAlchemy connection this process opens to ``db_path`` uses WAL and
    ``synchronous=NORMAL`` (connections already open keep what they have: register before the
    store is opened)."""
    global _INSTALLED
    key = _key(db_path)
    with _LOCK:
        _PATHS.add(key)
        _ENGINES.setdefault(key, weakref.WeakSet())
        if _INSTALLED:
            return
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        event.listen(Engine, "connect", _on_connect)
        event.listen(Engine, "engine_connect", _on_engine_connect)
        _INSTALLED = True


def _main_file(dbapi_con: sqlite3.Connection) -> str | None:
    for _, name, path in dbapi_con.execute("PRAGMA database_list").fetchall():
        if name == "main":
            return path or None
    return None


def _on_connect(dbapi_con: Any, _record: Any) -> None:
    """A new DBAPI connection of any engine: ours when it opens a registered file."""
    if not isinstance(dbapi_con, sqlite3.Connection) or not _PATHS:
        return
    try:
        path = _main_file(dbapi_con)
        if path is None or _key(path) not in _PATHS:
            return
        for name, value in PRAGMAS:
            dbapi_con.execute(f"PRAGMA {name}={value}")
    except sqlite3.Error:  # locked by another process's transaction: its defaults, still safe
        return


def _on_engine_connect(conn: Any) -> None:
    """Remember the engines that open a registered file (``release`` closes their pools)."""
    if not _PATHS:
        return
    url = conn.engine.url
    if url.get_backend_name() != "sqlite" or not url.database:
        return
    key = _key(url.database)
    if key in _PATHS:
        with _LOCK:
            _ENGINES.setdefault(key, weakref.WeakSet()).add(conn.engine)


def forget(db_path: str | os.PathLike) -> None:
    """Stop giving new connections to ``db_path`` these settings; the file is not touched
    (a store that was refused before anything opened it)."""
    key = _key(db_path)
    with _LOCK:
        _PATHS.discard(key)
        _ENGINES.pop(key, None)


def release(db_path: str | os.PathLike, timeout: float = 2.0) -> bool:
    """The sweep is done with ``db_path``: close this process's pooled connections to it,
    checkpoint its WAL into the database and make it a rollback-journal file again. True when
    it is one; False when another process still has it open (a ``geosweep ui`` reading it),
    in which case it stays in WAL mode, its WAL checkpointed, and sqlite goes on as usual."""
    key = _key(db_path)
    with _LOCK:
        _PATHS.discard(key)
        engines = list(_ENGINES.pop(key, ()))
    for engine in engines:
        engine.dispose()
    if not os.path.isfile(key):
        return False
    try:
        con = sqlite3.connect(key, timeout=timeout)
    except sqlite3.Error:
        return False
    try:
        mode = con.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":
            return True
        with contextlib.suppress(sqlite3.Error):
            if str(con.execute("PRAGMA journal_mode=DELETE").fetchone()[0]).lower() == "delete":
                return True
        with contextlib.suppress(sqlite3.Error):
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return False
    finally:
        con.close()
