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
           "sweep_dir"]

DEFAULT_OUT = "geosweep-runs"


def load_cli_spec(ref: str, args: argparse.Namespace | None = None):
    """The validated spec (with --mlflow-uri / --parquet-root applied), or a UsageError."""
    from orchestrator.sweep.spec import SpecError
    from orchestrator.sweep.spec_set import load_spec_with_sets

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


def check_out_dir(out: str) -> Path:
    p = Path(out).expanduser().resolve()
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
    if not uri or not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=3).read()
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise UsageError(f"--mlflow-uri: MLflow server {uri} is unreachable ({e})") from None


def check_address(address: str | None) -> None:
    if not address or address == "auto":
        return
    import socket
    from urllib.parse import urlparse

    u = urlparse(address if "://" in address else f"ray://{address}")
    host, port = u.hostname, u.port or (8265 if u.scheme.startswith("http") else 6379)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as e:
        raise UsageError(f"--address: cannot reach Ray at {address} ({e})") from None


def prepare_sweep_folder(target: Path, resume: bool, overwrite: bool) -> None:
    """An existing sweep folder is kept only with --resume and deleted only with --overwrite."""
    if target.exists() and not target.is_dir():
        raise UsageError(f"--out: {target} exists and is not a folder")
    if target.exists() and any(target.iterdir()):
        if overwrite:
            shutil.rmtree(target)
        elif not resume:
            raise UsageError(f"{target} already exists: use --resume to continue it or "
                             "--overwrite to start again")


def sweep_dir(ref: str) -> Path:
    p = Path(ref).expanduser().resolve()
    if not (p / "sweep.json").exists():
        raise UsageError(f"{ref}: not a geosweep sweep folder (no sweep.json)")
    return p
