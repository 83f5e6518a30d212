"""``<sweep>/sweep.json``: what was run, with every path relative to the folder.

A sweep folder can then be moved, renamed back, copied or ``ray rsync-down``-ed: status,
report, eval and resume read (and write) the folder they are given. URIs outside the folder
(an MLflow server, ``s3://``) stay as given. Older manifests held absolute paths: a path that
was the default inside the folder's former location is mapped to the folder's own. A relative
path is the folder's and must stay inside it (orchestrator/store/targets.py checks every one).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.store.targets import (
    SQLITE,
    FolderError,
    check_entries,
    check_inside,
    check_named_inside,
    check_tree,
    check_utf8_path,
    resolve_local,
)

__all__ = ["ManifestError", "write_manifest", "read_manifest", "check_writes_inside",
           "MANIFEST", "SweepTargets", "sweep_targets"]

MANIFEST = "sweep.json"
_SQLITE = "sqlite:///"
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")  # as the Parquet sink's partition values


class ManifestError(FolderError):
    """sweep.json missing, corrupt or of the wrong shape, or naming a place a sweep folder's
    file may not (targets.py); the message is one line."""


def _relative(root: Path, value: str | None, sqlite: bool) -> str | None:
    if not value:
        return value
    prefix = _SQLITE if sqlite and value.startswith(_SQLITE) else ""
    if sqlite and not prefix:
        return value
    path = Path(value[len(prefix):])
    try:
        rel = path.resolve().relative_to(root.resolve())
    except ValueError:
        return value
    return prefix + "./" + rel.as_posix()


def _absolute(root: Path, value: str | None, sqlite: bool, default: str) -> str:
    if not value:
        return (_SQLITE if sqlite else "") + str(root / default)
    prefix = _SQLITE if sqlite and value.startswith(_SQLITE) else ""
    rest = value[len(prefix):]
    path = Path(rest)
    # an old absolute manifest: <old folder>/<default> -> this folder's own, if it has one,
    # even while the old folder still exists: a copy (rsync-down) must read and write itself,
    # never the folder it was copied from
    if "://" not in rest and path.is_absolute() and path.name == default \
            and (root / default).exists():
        return prefix + str(root / default)
    what = "mlflow_uri" if sqlite else "parquet_root"
    try:  # relative: the folder's, and inside it; absolute or a URI: as recorded
        return resolve_local(root, value, sqlite, what)
    except FolderError as e:
        raise ManifestError(str(e)) from None


def write_manifest(root: Path, data: dict[str, Any]) -> None:
    """Atomically write sweep.json with in-folder paths made relative."""
    root = Path(root)
    out = dict(data)
    out["mlflow_uri"] = _relative(root, out.get("mlflow_uri"), sqlite=True)
    out["parquet_root"] = _relative(root, out.get("parquet_root"), sqlite=False)
    # a fresh name, created exclusively: a planted .sweep.json.tmp symlink is never followed
    tmp = root / f".{MANIFEST}.tmp-{uuid.uuid4().hex[:12]}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(out, indent=2))
        os.replace(tmp, root / MANIFEST)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_manifest(root: Path) -> dict[str, Any]:
    """sweep.json with paths resolved against ``root``; a ManifestError names what is wrong."""
    root = Path(root)
    mf = root / MANIFEST
    if not mf.is_file():
        raise ManifestError(f"{root}: not a geosweep sweep folder (no {MANIFEST})")
    try:
        data = json.loads(mf.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError(f"{mf} is corrupt ({type(e).__name__}: {str(e)[:80]}); restore it "
                            "from a copy of the sweep") from None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        raise ManifestError(f"{mf} is not a geosweep manifest (a JSON object with a 'name'); "
                            "restore it from a copy of the sweep")
    if not _NAME.match(data["name"]) or set(data["name"]) == {"."}:
        # the name becomes a Parquet partition and part of paths (eval/sweep=NAME/)
        raise ManifestError(f"{mf}: name {data['name'][:80]!r} is not a sweep name (letters, "
                            "digits, '_', '-', '.'); restore it from a copy of the sweep")
    trials = data.get("trials", 0)
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 0:
        raise ManifestError(f"{mf}: 'trials' must be a count, got {trials!r}")
    for k in ("mlflow_uri", "parquet_root"):
        if data.get(k) is not None and not isinstance(data[k], str):
            raise ManifestError(f"{mf}: {k!r} must be a string, got {data[k]!r}")
    # no mlflow_uri recorded: None (the report says so); readers that need a store use
    # the folder's default sqlite
    if data.get("mlflow_uri"):
        data["mlflow_uri"] = _absolute(root, data["mlflow_uri"], True, "mlflow.db")
    data["parquet_root"] = _absolute(root, data.get("parquet_root"), False, "parquet")
    return data


def check_writes_inside(root: Path, target: str | Path, hint: str = "") -> None:
    """``target``, a place inside the sweep folder that a command writes (``report/``, the
    in-folder Parquet root), must not lead outside it through a symlink (targets.py). Targets
    outside the folder by name (``parquet_root: s3://...`` or ``/data/x`` in sweep.json) are
    left alone."""
    root = Path(root).absolute()
    t = Path(target)
    if "://" in str(target) or not t.is_absolute():
        return
    norm = Path(os.path.normpath(t))
    if norm != root and root not in norm.parents:
        return  # outside by name: sweep.json says so
    try:
        check_inside(root, norm, hint=hint or "; replace it by a folder")
    except FolderError as e:
        raise ManifestError(str(e)) from None


# --- a sweep folder's targets, for its writers (the rules of targets.py) --------------------

@dataclass(frozen=True)
class SweepTargets:
    """A sweep folder's write targets, resolved and checked (``sweep_targets``)."""

    root: Path  # the folder (absolute, its symlinks not resolved)
    name: str  # the sweep's name (sweep.json)
    manifest: dict  # sweep.json as read_manifest returns it (paths resolved and checked)
    store_uri: str  # the MLflow store to write: sweep.json's, else the folder's own sqlite
    parquet_root: str  # the Parquet dataset root

    @property
    def store_in_folder(self) -> bool:
        """The MLflow store is a local sqlite file inside the folder (ours to check)."""
        if not self.store_uri.startswith(SQLITE):
            return False
        p = Path(os.path.normpath(self.store_uri[len(SQLITE):]))
        return p == self.root or self.root in p.parents

    @property
    def store_path(self) -> Path | None:
        """The sqlite file of a local store, else None."""
        return Path(self.store_uri[len(SQLITE):]) if self.store_uri.startswith(SQLITE) else None

    def inside(self, *parts: str) -> Path:
        """``root/parts...`` checked: no symlink on its way leads outside the folder."""
        return check_inside(self.root, Path(*parts))

    def parquet_target(self, *parts: str) -> str:
        """A place under the Parquet root (``eval/sweep=S``); checked when it is in the folder."""
        base = self.parquet_root
        if "://" in base and not base.startswith("file://"):
            return "/".join([base.rstrip("/"), *parts])
        local = Path(base.removeprefix("file://"), *parts)
        norm = Path(os.path.normpath(local))
        if norm == self.root or self.root in norm.parents:
            check_inside(self.root, norm)
        return str(local)


def sweep_targets(root: str | os.PathLike, deep: bool = False) -> SweepTargets:
    """The targets of the sweep folder ``root``, every one checked; ``deep``: also every
    symlink under the trees a resumed sweep writes (``ray/``, ``parquet/``, ``mlartifacts/``).
    Raises FolderError (ManifestError for a broken sweep.json) in one line."""
    root = Path(root).expanduser().absolute()
    check_utf8_path(root, "sweep folder")
    check_entries(root)
    manifest = read_manifest(root)
    store = manifest.get("mlflow_uri") or f"{SQLITE}{root / 'mlflow.db'}"
    for key, value in (("mlflow_uri", str(store)), ("parquet_root", manifest["parquet_root"])):
        check_named_inside(root, value, key)  # no symlink on the way out
    t = SweepTargets(root, str(manifest["name"]), manifest, str(store),
                     str(manifest["parquet_root"]))
    if deep:
        for sub in ("ray", "parquet", "mlartifacts"):
            check_tree(root, sub)
    return t
