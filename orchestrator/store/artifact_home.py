"""Where a sweep folder's own MLflow store keeps its artifacts, checked before they are written.

The sqlite store records absolute artifact locations (the experiment's ``artifact_location``,
each run's ``artifact_uri``): a folder moved, copied or ``ray rsync-down``-ed still names the
old place, and a folder from elsewhere can name any folder of yours. MLflow writes artifacts
wherever the store says, so before a writer logs any (``resume``: the spec, provenance and
final weights; ``report``: its tables and figures):

- locations of the form ``<old folder>/mlartifacts/...`` (a moved or copied sweep) are
  rewritten to this folder's ``mlartifacts/``, in one transaction, and the writer says so in
  one line (``relocate``);
- any other local location outside the folder is refused (``outside_artifacts``);
- remote locations (``mlflow-artifacts:``, ``s3://`` ...) belong to their server: left alone.

Only the experiments and runs of the sweep are looked at (MLflow's ``Default`` experiment
points at the ``mlruns/`` of wherever the store was made and is never written).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from orchestrator.store.targets import FolderError

__all__ = ["outside_artifacts", "relocate", "store_in_folder", "ARTIFACTS"]

ARTIFACTS = "mlartifacts"


def _local(uri: str | None) -> Path | None:
    if not uri:
        return None
    if uri.startswith("file://"):
        return Path(uri[len("file://"):])
    if "://" in uri or uri.startswith(("mlflow-artifacts:", "runs:", "models:")):
        return None
    return Path(uri)


def _inside(root: Path, p: Path) -> bool:
    real, dest = root.resolve(), Path(os.path.realpath(p))
    return dest == real or real in dest.parents


def outside_artifacts(root: str | os.PathLike, uri: str | None) -> str | None:
    """Why artifacts at ``uri`` would be written outside the sweep folder ``root``, or None."""
    p = _local(uri)
    if p is None or _inside(Path(root).absolute(), p):
        return None
    return (f"the MLflow store in {root} keeps this run's artifacts at {p}, outside the sweep "
            "folder; geosweep does not write there")


def store_in_folder(uri: str | None, root: str | os.PathLike) -> Path | None:
    """The sqlite file of ``uri`` when it lies inside the folder ``root`` (by name), else None."""
    if not uri or not uri.startswith("sqlite:///"):
        return None
    p = Path(os.path.normpath(uri[len("sqlite:///"):]))
    r = Path(os.path.normpath(Path(root).absolute()))
    return p if r in p.parents else None


def _moved(root: Path, p: Path) -> Path | None:
    """``<old>/mlartifacts/<rest>`` -> ``<root>/mlartifacts/<rest>``; None if not that shape."""
    parts = p.parts
    if ARTIFACTS not in parts:
        return None
    i = len(parts) - 1 - parts[::-1].index(ARTIFACTS)
    return root.joinpath(ARTIFACTS, *parts[i + 1:])


def relocate(root: str | os.PathLike, db: str | os.PathLike, sweep: str,
             experiment: str | None = None) -> str | None:
    """Point the sweep's artifact locations in the folder's store ``db`` into ``root``;
    returns the line to print when some were moved, None when all were inside already.
    Raises FolderError for a location outside that is not a moved sweep's."""
    root = Path(root).absolute()
    con = sqlite3.connect(f"file:{quote(str(db))}", uri=True, timeout=10)
    try:
        names = [n for n in dict.fromkeys((experiment, sweep)) if n]
        q = ",".join("?" * len(names))
        exps = con.execute(
            f"SELECT experiment_id, artifact_location FROM experiments WHERE name IN ({q}) "
            "OR experiment_id IN (SELECT r.experiment_id FROM runs r JOIN tags t ON "
            "t.run_uuid = r.run_uuid WHERE t.key = 'geosweep.sweep' AND t.value = ?)",
            (*names, sweep)).fetchall()
        ids = [e[0] for e in exps]
        runs = con.execute(
            f"SELECT run_uuid, artifact_uri FROM runs WHERE experiment_id IN "
            f"({','.join('?' * len(ids)) or 'NULL'})", ids).fetchall() if ids else []
        moves: list[tuple[str, str, str]] = []  # (table, id, new location)
        old_homes = set()
        for table, rows in (("experiments", exps), ("runs", runs)):
            for key, loc in rows:
                p = _local(loc)
                if p is None or _inside(root, p):
                    continue
                new = _moved(root, p)
                if new is None:
                    raise FolderError(outside_artifacts(root, loc) or str(loc))
                moves.append((table, key, str(new)))
                old_homes.add(str(p).split(f"/{ARTIFACTS}")[0])
        if not moves:
            return None
        with con:
            for table, key, new in moves:
                col, idc = (("artifact_location", "experiment_id") if table == "experiments"
                            else ("artifact_uri", "run_uuid"))
                con.execute(f"UPDATE {table} SET {col} = ? WHERE {idc} = ?", (new, key))
    finally:
        con.close()
    olds = ", ".join(sorted(old_homes)[:2])
    return (f"[geosweep] {db}: the sweep's artifact locations pointed into {olds} (the folder "
            f"was moved or copied); {len(moves)} now point into {root / ARTIFACTS}")
