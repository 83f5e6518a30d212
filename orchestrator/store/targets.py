"""Where a command writes, resolved in one place and checked: every write target of a sweep
folder (or of an output folder: ``continuity --out``, ``train --out``) stays inside it,
whatever the folder's own files say (sweep.json, spec.yaml, mlflow.db, symlinks).

The rules, for every writer (``run --resume``, ``resume``, ``eval``, ``report``, ``ui``,
``continuity``, ``train``):

- a place the folder's files name by a relative path (``./parquet``, ``./../elsewhere``,
  ``sqlite:///./mlflow.db``, ``parquet``) is resolved against the folder, never the current
  directory, and must lie inside it once ``..`` and symlinks are resolved;
- a place inside the folder by name (its ``mlflow.db``, ``parquet/``, ``report/``, ``ray/``,
  ``.lock`` ...) must not lead outside through a symlink on its way, the file itself included
  (a symlinked ``mlflow.db`` is refused, not followed);
- a place named outside the folder by an absolute path or a URI (an MLflow server,
  ``s3://``, ``/data/x`` given as ``--parquet-root`` when the sweep was run) is the sweep's
  recorded choice and is left as named;
- every local path is valid UTF-8 (pyarrow and sqlite take UTF-8 text): a folder whose path
  is not is refused in one line.

``FolderError`` is the one-line refusal (the CLI prints it, exit 2). A sweep folder's targets
as a whole, these rules applied, are ``manifest.sweep_targets``.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["FolderError", "check_utf8_path", "check_inside", "check_entries", "check_tree",
           "resolve_local", "check_named_inside", "FOLDER_ENTRIES", "SQLITE"]

SQLITE = "sqlite:///"
# what a sweep folder holds (orchestrator/store/layout.py) and its writers write
FOLDER_ENTRIES = ("sweep.json", "spec.yaml", ".lock", "mlflow.db", "mlartifacts", "parquet",
                  "ray", "optuna.db", "report",
                  # sqlite writes these beside a database it writes (store/sqlite_durability.py:
                  # a sweep's stores are in WAL mode while it runs); a symlink planted under
                  # one of these names would take the writes outside the folder
                  "mlflow.db-wal", "mlflow.db-shm", "mlflow.db-journal",
                  "optuna.db-wal", "optuna.db-shm", "optuna.db-journal")
_HINT = "; replace it by a real folder or file, or name that place in sweep.json"


class FolderError(ValueError):
    """A folder's path or one of its files points where a command must not write; one line."""


def check_utf8_path(path: str | os.PathLike, what: str = "") -> None:
    """Refuse a path that is not valid UTF-8 (a surrogate-escaped byte of the file system)."""
    text = os.fspath(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        byte = text.encode("utf-8", "surrogateescape")[e.start:e.start + 1].hex()
        raise FolderError(f"{what + ': ' if what else ''}the path '{shown}' is not valid UTF-8 "
                          f"(byte 0x{byte}); rename the folder (Parquet and MLflow need UTF-8 "
                          "paths)") from None


def _within(real_root: Path, p: Path) -> bool:
    return p == real_root or real_root in p.parents


def _dest(link: Path) -> Path:
    """Where a symlink leads; a loop is one line."""
    try:
        return link.resolve()
    except (RuntimeError, OSError):  # "Symlink loop" (RuntimeError before Python 3.13)
        raise FolderError(f"{link} is a symlink loop; replace it by a real folder or "
                          "file") from None


def check_inside(root: str | os.PathLike, target: str | os.PathLike, what: str = "",
                 hint: str = _HINT, outside_hint: str | None = None) -> Path:
    """``target`` (absolute, or relative to ``root``) inside ``root``: by name once ``..`` is
    resolved, and through every symlink on its way that exists, the last part included.
    Returns the target as an absolute path under ``root`` (symlinks not resolved)."""
    root = Path(root).absolute()
    check_utf8_path(root, what)
    t = Path(target)
    t = Path(os.path.normpath(t if t.is_absolute() else root / t))
    real = root.resolve()
    label = f"{what}: " if what else ""
    try:
        rel = t.relative_to(root)
    except ValueError:
        raise FolderError(f"{label}{target} is outside the sweep folder {root}"
                          f"{hint if outside_hint is None else outside_hint}") from None
    probe = root
    for part in rel.parts:
        probe = probe / part
        if probe.is_symlink():
            dest = _dest(probe)
            if not _within(real, dest):
                raise FolderError(f"{label}{probe} is a symlink to {dest}, outside the sweep "
                                  f"folder{hint}")
        elif not probe.exists():
            break
    return t


def check_entries(root: str | os.PathLike, names: tuple[str, ...] = FOLDER_ENTRIES) -> None:
    """The folder's own entries that exist (mlflow.db, parquet, report, .lock ...) do not lead
    outside it through a symlink."""
    for name in names:
        check_inside(root, name)


def check_tree(root: str | os.PathLike, sub: str) -> None:
    """No symlink anywhere under ``root/sub`` leads outside the folder (the trees a resumed
    sweep writes into: ``ray/``, ``parquet/``, ``mlartifacts/``)."""
    root = Path(root).absolute()
    real = root.resolve()
    top = check_inside(root, sub)
    if not top.is_dir() or top.is_symlink():
        return
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink() and not _within(real, _dest(p)):
                raise FolderError(f"{p} is a symlink to {_dest(p)}, outside the sweep "
                                  f"folder{_HINT}")


def resolve_local(root: Path, value: str, sqlite: bool, what: str) -> str:
    """A sweep.json value (MLflow URI or Parquet root) as an absolute URI or path: a relative
    local path is taken from ``root`` and must stay inside it by name; URIs and absolute
    places are kept. Symlinks on the way are the writers' check (``manifest.sweep_targets``):
    a reader (``status``) may follow a folder the user linked to a bigger disk."""
    prefix = SQLITE if sqlite and value.startswith(SQLITE) else ""
    rest = value[len(prefix):]
    scheme = urlsplit(rest).scheme if not prefix else ""
    if not prefix and (("://" in rest and not rest.startswith("file://"))
                       or (len(scheme) > 1 and scheme != "file") or rest == "databricks"):
        return value  # a server, s3://, mlflow-artifacts:, databricks: outside by name
    if rest.startswith("file://"):
        prefix, rest = "file://", rest[len("file://"):]
    if not rest:
        return value
    root = Path(root).absolute()
    check_utf8_path(rest, f"sweep.json {what}")
    p = Path(rest)
    if p.is_absolute():
        return value  # as recorded when the sweep ran (inside or outside the folder)
    norm = Path(os.path.normpath(root / p))
    if norm != root and root not in norm.parents:  # relative: the folder's, and inside it
        raise FolderError(f"sweep.json {what}: {rest} is outside the sweep folder {root}; a "
                          "relative path in a sweep folder's files is the folder's (name a "
                          "place outside by its absolute path)")
    return prefix + str(norm)


def check_named_inside(root: Path, value: str, what: str) -> None:
    """A resolved target (``resolve_local``'s result) that lies inside the folder by name does
    not leave it through a symlink on its way (the writers' check)."""
    rest = value.removeprefix(SQLITE).removeprefix("file://")
    if "://" in rest or not Path(rest).is_absolute():
        return
    root = Path(root).absolute()
    norm = Path(os.path.normpath(rest))
    if norm == root or root in norm.parents:
        check_inside(root, norm, f"sweep.json {what}")
