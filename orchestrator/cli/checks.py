"""Checks every command shares, run before anything is written or Ray is started: the spec,
the output folder, local corpora, the MLflow server and the Ray address. Each failure is one
``UsageError`` line."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

from orchestrator.cli.errors import UsageError

__all__ = ["DEFAULT_OUT", "load_cli_spec", "check_out_dir", "check_corpora",
           "check_spec_corpora", "check_mlflow_uri", "check_address", "prepare_sweep_folder",
           "sweep_dir", "utf8_path"]

DEFAULT_OUT = "geosweep-runs"


def load_cli_spec(ref: str, args: argparse.Namespace | None = None):
    """The validated spec (with --mlflow-uri / --parquet-root applied), or a UsageError."""
    from orchestrator.spec.sets import load_spec_with_sets
    from orchestrator.spec.sweep_spec import SpecError

    try:
        spec = load_spec_with_sets(ref, getattr(args, "set", None))
        if args is not None:
            upd: dict[str, Any] = {}
            if getattr(args, "mlflow_uri", None):
                upd["mlflow_uri"] = args.mlflow_uri
            if getattr(args, "parquet_root", None):
                upd["parquet_root"] = args.parquet_root
            if upd:
                spec = spec.model_copy(update={"tracking": spec.tracking.model_copy(update=upd)})
        return spec
    except SpecError as e:
        raise UsageError(str(e)) from None


def utf8_path(path: str | os.PathLike, what: str) -> None:
    """A path that is not valid UTF-8 is one line (targets.check_utf8_path), not a pyarrow or
    sqlite traceback later."""
    from orchestrator.store.targets import FolderError, check_utf8_path

    try:
        check_utf8_path(path, what)
    except FolderError as e:
        raise UsageError(str(e)) from None


def check_out_dir(out: str) -> Path:
    p = Path(out).expanduser().resolve()
    utf8_path(p, "--out")
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        raise UsageError(f"--out: {out!r} is not writable")
    # os.access says yes to root everywhere (and /proc says yes to anyone): really try it.
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".geosweep-probe-", dir=probe))
    except OSError as e:
        raise UsageError(f"--out: {out!r} is not writable ({e.strerror})") from None
    return p


def check_corpora(values: list[Any], where: str) -> None:
    """Local corpus files must exist before Ray starts (a trial would only fail later)."""
    from workloads.data import DataError, resolve_corpus
    from workloads.data.corpora import HUB_CORPORA

    for v in values:
        if isinstance(v, str) and v != "mnist" and v not in HUB_CORPORA:
            try:
                resolve_corpus(v)
            except DataError as e:
                raise UsageError(f"{where}{e}") from None


def check_spec_corpora(spec) -> None:
    check_corpora([spec.base_config().data.corpus], "")
    p = spec.space.get("data.corpus")
    if p is not None:
        check_corpora(p.candidates(), "space.")


def check_mlflow_uri(uri: str | None) -> None:
    """A server URI answers ``/health`` (with basic auth when it carries userinfo); every
    other store is checked by ``preflight.check_mlflow_store``."""
    if not uri or not uri.startswith(("http://", "https://")):
        return
    from orchestrator.store.mlflow_store import probe_server

    found = probe_server(uri)
    if found is not None:
        raise UsageError(f"--mlflow-uri: {found}")


def check_address(address: str | None) -> None:
    """The Ray cluster answers, and speaks gRPC (the GCS or a Ray Client server), within
    seconds; ``RAY_ADDRESS`` is checked the same way when --address is not given."""
    flag = "--address"
    if not address and os.environ.get("RAY_ADDRESS"):
        address, flag = os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    if not address or address in ("auto", "local"):
        return
    import socket
    from urllib.parse import urlparse

    u = urlparse(address if "://" in address else f"ray://{address}")
    try:
        host, port = u.hostname, u.port or (8265 if u.scheme.startswith("http") else 6379)
    except ValueError as e:
        raise UsageError(f"{flag}: {address!r} is not host:port ({e})") from None
    if not host:
        raise UsageError(f"{flag}: {address!r} is not host:port")
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            if not u.scheme.startswith("http"):
                _grpc_handshake(s, address, flag)
    except OSError as e:
        raise UsageError(f"{flag}: cannot reach Ray at {address} ({e})") from None


_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _grpc_handshake(s, address: str, flag: str) -> None:
    """A gRPC server (Ray's GCS, Ray Client) answers the HTTP/2 preface with a SETTINGS frame;
    the dashboard (8265), Redis or anything else does not (or hangs: the 3 s timeout)."""
    s.settimeout(3)
    s.sendall(_H2_PREFACE)
    try:
        head = s.recv(9)
    except TimeoutError:
        head = b""
    if len(head) < 4 or head[3] != 0x04:
        raise UsageError(f"{flag}: {address} answers but is not a Ray GCS or Ray Client port "
                         "(the dashboard is :8265; the GCS is usually :6379, Ray Client :10001)")


def prepare_sweep_folder(target: Path, resume: bool, overwrite: bool) -> None:
    """An existing sweep folder is kept only with --resume and deleted only with --overwrite.
    Its lock (orchestrator/store/lock.py) is taken before it is resumed or emptied: a folder
    another driver writes is neither."""
    from orchestrator.store.lock import LOCK_FILE, lock_sweep

    def used() -> bool:
        return target.exists() and any(p.name != LOCK_FILE for p in target.iterdir())

    if target.exists() and not target.is_dir():
        raise UsageError(f"--out: {target} exists and is not a folder")
    if used() and not (overwrite or resume):
        raise UsageError(f"{target} already exists: use --resume to continue it or "
                         "--overwrite to start again")
    lock_sweep(target)
    if used() and overwrite:  # everything but the lock we hold (a new file = a second lock)
        for p in target.iterdir():
            if p.name != LOCK_FILE:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def sweep_dir(ref: str) -> Path:
    p = Path(ref).expanduser().resolve()
    utf8_path(p, "sweep folder")
    if not (p / "sweep.json").exists():
        raise UsageError(f"{ref}: not a geosweep sweep folder (no sweep.json)")
    return p
