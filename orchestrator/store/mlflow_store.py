"""One classification of MLflow store failures, before anything opens the store, and
``open_client``: the one way geosweep's writers (the sweep's sink, eval, report, continuity,
ui's runs link) open a store.

Opening a store with ``MlflowClient`` is not harmless: on an SQLite file that is not an MLflow
store it builds MLflow's tables inside it (a foreign database changed); on a folder or an
unreadable file it retries for minutes; on a dead server it retries for minutes; on a corrupt
file it ends in an SQLAlchemy traceback. So every store is classified first (``probe``) and
a problem is one line naming the store and what to do:

============  ===========================================================================
kind          what
============  ===========================================================================
missing       the sqlite file does not exist (a writer that creates stores makes it)
folder        the sqlite path is a folder
not_a_file    a pipe, a device or another non-regular file
unreadable    the file cannot be opened (permissions)
empty         a zero-byte file, or an SQLite file without tables
not_sqlite    not an SQLite database (its header)
corrupt       SQLite says the file is malformed or not a database
locked        another process holds a lock on it past the probe's timeout
foreign       an SQLite database that is not an MLflow store: never touched
other_schema  an MLflow store of another schema version: never migrated (``mlflow db
              upgrade`` is the user's own step, after a backup)
file_store    a folder store, which MLflow 3 no longer writes
unreachable   a server that does not answer ``/health`` within the timeout
refused       a server that refuses the credentials (HTTP 401/403)
not_mlflow    a server that answers, but not as MLflow does
============  ===========================================================================

A URI with userinfo (``http://user:pw@host``) is probed with HTTP basic auth, as MLflow's
client sends it (``MLFLOW_TRACKING_USERNAME``/``PASSWORD`` and ``MLFLOW_TRACKING_TOKEN`` too),
so a server behind basic auth is usable. Every message is redacted (cluster/redact.py).
"""

from __future__ import annotations

import os
import re
import sqlite3
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from cluster.redact import redact

__all__ = ["StoreProblem", "StoreError", "KINDS", "probe", "probe_sqlite", "probe_server",
           "classify_error", "open_client", "health_request", "head_revision"]

KINDS = ("missing", "folder", "not_a_file", "unreadable", "empty", "not_sqlite", "corrupt",
         "locked", "foreign", "other_schema", "file_store", "unreachable", "refused",
         "not_mlflow")
_SQLITE = "sqlite:///"
_MAGIC = b"SQLite format 3\x00"
_MLFLOW_TABLES = {"experiments", "runs", "metrics", "params", "tags"}
_LOCK_TIMEOUT_S = 2.0
HEALTH_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class StoreProblem:
    kind: str  # one of KINDS
    message: str  # one line, redacted, naming the store

    def __str__(self) -> str:
        return self.message


class StoreError(RuntimeError):
    """A store geosweep will not open (``StoreProblem``); one line, exit code 2."""

    def __init__(self, problem: StoreProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


# --- sqlite ---------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def head_revision() -> str | None:
    """The schema version this MLflow's stores have (the head of its alembic migrations), read
    from the migration scripts' text without importing MLflow; None if it cannot be told."""
    import importlib.util

    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "store" / "db_migrations" \
        / "versions"
    revs, downs = set(), set()
    for f in folder.glob("*.py"):
        text = f.read_text(errors="replace")
        rev = re.search(r"^revision\s*=\s*['\"](\w+)['\"]", text, re.M)
        down = re.search(r"^down_revision\s*=\s*(.+)$", text, re.M)
        if rev:
            revs.add(rev.group(1))
        if down:
            downs.update(re.findall(r"['\"](\w+)['\"]", down.group(1)))
    heads = revs - downs
    return heads.pop() if len(heads) == 1 else None


def _ro(path: Path, timeout: float) -> sqlite3.Connection:
    """A read-only connection that never creates the file."""
    return sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=timeout)


def probe_sqlite(path: str | os.PathLike, pages: bool = False,
                 timeout: float = _LOCK_TIMEOUT_S) -> StoreProblem | None:
    """Why the sqlite file at ``path`` is not an MLflow store of this MLflow's schema, or None.
    ``pages``: also check every page (``PRAGMA quick_check``; the UI and a resumed sweep read
    all of it). Opens the file read-only; writes nothing."""
    p = Path(path)
    name = str(p)

    def problem(kind: str, why: str) -> StoreProblem:
        return StoreProblem(kind, redact(f"MLflow store {name}: {why}"))

    if not p.exists():
        return problem("missing", "does not exist")
    if p.is_dir():
        return problem("folder", "is a folder, not an SQLite file; remove it or restore "
                       "mlflow.db from a copy of the sweep")
    if not p.is_file():
        return problem("not_a_file", "is not a regular file (a pipe, device or socket)")
    try:
        with open(p, "rb") as f:
            head = f.read(16)
    except OSError as e:
        return problem("unreadable", f"cannot be read ({e.strerror}); check its permissions")
    if not head:
        return problem("empty", "is an empty file, not an MLflow store; delete it to start a "
                       "new store")
    if head != _MAGIC:
        return problem("not_sqlite", "is not an SQLite database (file is not a database); "
                       "restore it from a copy of the sweep")
    try:
        con = _ro(p, timeout)
        try:
            if pages:
                ok = con.execute("PRAGMA quick_check(1)").fetchone()
                if not ok or ok[0] != "ok":
                    return problem("corrupt", f"is corrupt ({ok[0] if ok else '?'}); restore "
                                   "it from a copy of the sweep")
            tables = {r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            version = None
            if "alembic_version" in tables:
                row = con.execute("SELECT version_num FROM alembic_version").fetchone()
                version = row[0] if row else None
        finally:
            con.close()
    except sqlite3.Error as e:
        return _sqlite_error(name, e) or problem("corrupt", f"is unreadable ({e})")
    if not tables:
        return problem("empty", "is an SQLite file without tables, not an MLflow store; "
                       "delete it to start a new store")
    if not _MLFLOW_TABLES <= tables:
        shown = ", ".join(sorted(tables)[:4]) + (", ..." if len(tables) > 4 else "")
        return problem("foreign", f"is an SQLite database but not an MLflow store (tables: "
                       f"{shown}); geosweep does not touch it: name another file")
    head_rev = head_revision()
    if head_rev is not None and version != head_rev:
        return problem("other_schema", f"is an MLflow store of schema {version or 'unknown'}, "
                       f"this MLflow expects {head_rev}; geosweep never migrates a store: back "
                       f"it up, then run `mlflow db upgrade sqlite:///{name}` yourself (or use "
                       "the MLflow that made it)")
    return None


def _sqlite_error(name: str, e: BaseException) -> StoreProblem | None:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    low = text.lower()
    if "locked" in low or "busy" in low:
        return StoreProblem("locked", redact(
            f"MLflow store {name}: is locked by another process ({text[:80]}); wait for it to "
            "finish or stop it, then run this again"))
    if "malformed" in low or "not a database" in low or "disk image" in low:
        return StoreProblem("corrupt", redact(
            f"MLflow store {name}: is unreadable ({text[:120]}); restore it from a copy"))
    if "unable to open" in low or "readonly" in low or "read-only" in low:
        return StoreProblem("unreadable", redact(
            f"MLflow store {name}: cannot be opened ({text[:120]}); check the file and its "
            "folder's permissions"))
    if "out-of-date database schema" in low:
        return StoreProblem("other_schema", redact(
            f"MLflow store {name}: is of another schema version; geosweep never migrates a "
            "store (back it up, then `mlflow db upgrade`)"))
    if "no such table" in low:
        return StoreProblem("foreign", redact(
            f"MLflow store {name}: is not an MLflow store ({text[:80]})"))
    return None


# --- servers --------------------------------------------------------------------------------

def health_request(uri: str) -> Any:
    """A ``urllib`` request for the server's ``/health``: the URI without its userinfo, which
    becomes a basic-auth header (as MLflow's client sends it); MLflow's credential variables
    are honoured the same way."""
    import base64
    import urllib.request

    parts = urlsplit(uri)
    user, password = parts.username, parts.password
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    bare = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", ""))
    headers = {}
    if user is None and os.environ.get("MLFLOW_TRACKING_USERNAME"):
        user = os.environ["MLFLOW_TRACKING_USERNAME"]
        password = os.environ.get("MLFLOW_TRACKING_PASSWORD", "")
    if user is not None:
        pair = f"{unquote(user)}:{unquote(password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    elif os.environ.get("MLFLOW_TRACKING_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"
    return urllib.request.Request(bare, headers=headers)


def probe_server(uri: str, timeout: float = HEALTH_TIMEOUT_S) -> StoreProblem | None:
    """Why the MLflow server at ``uri`` cannot be used, or None (it answers ``/health``)."""
    import http.client
    import urllib.error
    import urllib.request

    shown = redact(uri)
    try:
        req = health_request(uri)
    except ValueError as e:  # a port that is no number, a bad IPv6 literal
        return StoreProblem("unreachable", redact(f"MLflow server {shown} is not a valid URL "
                                                  f"({e})"))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read(64)
        return None
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            return StoreProblem("refused", redact(
                f"MLflow server {shown} refused the credentials (HTTP {e.code}); give "
                "http(s)://USER:PASSWORD@HOST or set MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD"))
        return StoreProblem("not_mlflow", redact(
            f"MLflow server {shown} answers HTTP {e.code} at /health: not an MLflow server?"))
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
        why = getattr(e, "reason", None) or e
        return StoreProblem("unreachable", redact(f"MLflow server {shown} is unreachable "
                                                  f"({why})"))


# --- any store ------------------------------------------------------------------------------

def _file_store_allowed() -> bool:
    return os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() in ("1", "true", "yes")


def probe(uri: str, pages: bool = False, create: bool = False) -> StoreProblem | None:
    """Why the store ``uri`` cannot be used, or None. ``create``: a missing sqlite file is
    fine (the writer makes a new store). Databases other than sqlite are left to MLflow."""
    scheme = urlsplit(uri).scheme.lower()
    if len(scheme) == 1:  # a Windows drive letter is a path
        scheme = ""
    if uri.startswith(_SQLITE):
        path = uri[len(_SQLITE):]
        found = probe_sqlite(path, pages=pages)
        if found is not None and found.kind == "missing":
            return None if create else StoreProblem("missing", redact(
                f"MLflow store {uri} does not exist"))
        return found
    if scheme in ("http", "https"):
        return probe_server(uri)
    if scheme in ("", "file") and not _file_store_allowed():
        return StoreProblem("file_store", redact(
            f"MLflow store {uri!r}: a folder store, which MLflow 3 no longer writes; use "
            "sqlite:///FILE.db or http(s)://SERVER (or set MLFLOW_ALLOW_FILE_STORE=true)"))
    return None


def classify_error(uri: str, e: BaseException) -> StoreProblem | None:
    """The store problem an exception raised by an MLflow call on ``uri`` shows (its cause
    chain: MlflowException wraps SQLAlchemy's error, which wraps sqlite3's), or None for any
    other failure (a bug: let it raise)."""
    name = uri[len(_SQLITE):] if uri.startswith(_SQLITE) else redact(uri)
    seen: BaseException | None = e
    for _ in range(6):
        if seen is None:
            break
        if isinstance(seen, StoreError):
            return seen.problem
        found = _sqlite_error(name, seen)
        if found is None and "DatabaseError" in type(seen).__name__:
            text = str(seen).splitlines()[0] if str(seen) else type(seen).__name__
            found = StoreProblem("corrupt", redact(f"MLflow store {name}: is unreadable "
                                                   f"({text[:120]}); restore it from a copy"))
        if found is not None:
            return found
        seen = seen.__cause__ or seen.__context__
    return None


def open_client(uri: str, create: bool = False, pages: bool = False) -> Any:
    """An ``MlflowClient`` on ``uri`` once ``probe`` finds nothing wrong (else StoreError);
    ``create``: a missing sqlite file becomes a new store (from the migrated template:
    store/mlflow_template.py), else it is a problem like any other."""
    found = probe(uri, pages=pages, create=create)
    if found is not None:
        raise StoreError(found)
    if create and uri.startswith(_SQLITE):
        from orchestrator.store.mlflow_template import seed_sqlite_store

        seed_sqlite_store(uri[len(_SQLITE):])
    from mlflow import MlflowClient

    try:
        return MlflowClient(tracking_uri=uri)
    except Exception as e:  # noqa: BLE001 - a store problem is one line; anything else raises
        found = classify_error(uri, e)
        if found is None:
            raise
        raise StoreError(found) from None
