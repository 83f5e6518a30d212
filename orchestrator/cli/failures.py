"""Known failures -> one line and an exit code (``main`` asks ``one_line``).

Only exception types we know the meaning of are mapped: a real bug still prints its
traceback. ``CURRENT`` is the sweep folder the command writes, for the "run geosweep resume
DIR" advice (set by the commands that write one); ``writing`` names the folder eval, report
and continuity write, for an error that names no file (pyarrow's and sqlite's).
"""

from __future__ import annotations

import errno
from typing import Any

__all__ = ["one_line", "CURRENT", "INTERRUPTED"]

CURRENT: dict[str, Any] = {"sweep": None, "writing": None}
INTERRUPTED = 130  # the shell's code for SIGINT


def _resume_hint() -> str:
    root = CURRENT.get("sweep")
    return f"; then run geosweep resume {root}" if root else ""


def _oserror(e: OSError) -> tuple[int, str] | None:
    where = e.filename or CURRENT.get("writing") or CURRENT.get("sweep") or "a file"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return 1, f"disk full writing {where}; free space{_resume_hint() or ' and run it again'}"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return 2, f"permission denied writing {where}; choose a writable folder"
    if e.errno == errno.EISDIR:
        return 2, f"{where} is a folder, a file was expected"
    if e.errno == errno.ENOTDIR:
        return 2, f"{where}: a part of this path is a file, not a folder"
    return None


def one_line(e: BaseException) -> tuple[int, str] | None:
    """(exit code, message) for a failure we understand, or None (let it raise)."""
    from orchestrator.store.lock import SweepLocked
    from orchestrator.store.mlflow_store import StoreError
    from orchestrator.store.targets import FolderError

    if isinstance(e, (SweepLocked, FolderError, StoreError)):  # ManifestError is a FolderError
        return 2, str(e)
    if type(e).__name__ == "PartError":  # store/parquet.py (not imported: pyarrow is heavy)
        return 2, str(e)
    name = type(e).__name__
    mod = type(e).__module__ or ""
    if name == "SweepInterrupted":
        return INTERRUPTED, f"interrupted; continue with: {e}"
    if name in ("CheckpointLoadError", "CheckpointError"):
        return 2, str(e)
    if isinstance(e, OSError):
        return _oserror(e)
    if name == "SinkError" or (isinstance(e, RuntimeError) and
                               str(e).startswith("result sink failed")):
        cause = e.__cause__ if e.__cause__ is not None else e
        if isinstance(cause, OSError) and _oserror(cause):
            return _oserror(cause)
        return 1, f"{str(e)[:200]}{_resume_hint()}"
    if mod.startswith("pyarrow") and name in ("ArrowInvalid", "ArrowIOError"):
        first = (str(e).strip().splitlines() or [name])[0][:200]
        return 2, f"a Parquet file is unreadable ({first}); delete the broken part " \
                  "(its trial's rows are then missing) or restore it"
    if mod.startswith(("sqlite3", "sqlalchemy")) and "DatabaseError" in name or \
            name == "DatabaseError":
        return 2, f"an MLflow/Optuna database is corrupt ({str(e).splitlines()[0][:160]}); " \
                  "restore mlflow.db from a copy"
    if mod.startswith("mlflow") and name == "MlflowException":
        msg = str(e).splitlines()[0][:200] if str(e) else name
        return 1, f"MLflow: {msg}"
    return None
