"""Checks of where a sweep will write, before Ray starts: the MLflow URI, the Parquet root and
the token cache. A sweep that would fail at its first write is refused with one line, and
nothing is created (a half-made folder would block the next ``run``)."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from orchestrator.cli.errors import UsageError

__all__ = ["check_tracking", "check_writable_dir", "check_cache_dir", "check_mlflow_store",
           "check_local_resources", "check_model_memory", "spec_model_configs",
           "MLFLOW_SCHEMES", "PARQUET_SCHEMES"]

# MLflow stores we can name; the database ones are checked by MLflow when the sweep starts
MLFLOW_SCHEMES = ("", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql",
                  "databricks")
# pyarrow filesystems (pyarrow.fs.FileSystem.from_uri)
PARQUET_SCHEMES = ("", "file", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "az")


def check_writable_dir(path: str | os.PathLike, what: str) -> None:
    """``path`` is (or can be created as) a folder we can write: the nearest existing parent
    is really written to (os.access says yes to root everywhere)."""
    from orchestrator.cli.checks import utf8_path

    p = Path(path).expanduser()
    utf8_path(p.absolute(), what)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{what}: {path} exists and is not a folder")
    probe = p.resolve()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"{what}: {path} cannot be created ({probe} is a file)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".geosweep-probe-", dir=probe))
    except OSError as e:
        raise UsageError(f"{what}: {path} is not writable ({e.strerror})") from None


def check_mlflow_store(uri: str | None, flag: str = "--mlflow-uri") -> None:
    """An MLflow URI's scheme is one we know, and the store it names can be used: a local
    one written, a server reached (store/mlflow_store.py classifies every store problem)."""
    _check_mlflow(uri, flag=flag)


def _check_mlflow(uri: str | None, root: Path | None = None, flag: str = "--mlflow-uri") -> None:
    from orchestrator.store.mlflow_store import probe
    from orchestrator.store.targets import FolderError, check_utf8_path

    if not uri:
        return
    scheme = urlparse(uri).scheme
    if len(scheme) == 1:  # a Windows drive letter is a path
        scheme = ""
    if scheme not in MLFLOW_SCHEMES:
        raise UsageError(f"{flag}: unknown scheme {scheme!r} in {uri!r}; use sqlite:///FILE.db "
                         "or http(s)://SERVER")
    try:
        check_utf8_path(uri, flag)
    except FolderError as e:
        raise UsageError(str(e)) from None
    if scheme == "sqlite":
        path = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else ""
        if not path or path == ":memory:":
            raise UsageError(f"{flag}: {uri!r} names no database file "
                             "(sqlite:///relative.db or sqlite:////absolute.db)")
    # a foreign or other-schema database, a folder, a dead server, a folder store: one line
    found = probe(uri, pages=True, create=True)
    if found is not None:
        raise UsageError(f"{flag}: {found}" if flag else str(found))
    if scheme == "sqlite":
        f = Path(uri[len("sqlite:///"):])
        check_writable_dir(f.parent if str(f.parent) else ".", flag or "mlflow.db")
    elif scheme in ("", "file"):  # MLFLOW_ALLOW_FILE_STORE=true: a folder store
        check_writable_dir(urlparse(uri).path if scheme else uri, flag)


def _check_parquet(root_uri: str | None) -> None:
    if not root_uri:
        return
    scheme = urlparse(root_uri).scheme
    if len(scheme) == 1:
        scheme = ""
    if scheme not in PARQUET_SCHEMES:
        raise UsageError(f"--parquet-root: unknown scheme {scheme!r} in {root_uri!r}; use a "
                         f"folder or one of {', '.join(s + '://' for s in PARQUET_SCHEMES if s)}")
    if scheme in ("", "file"):
        check_writable_dir(urlparse(root_uri).path if scheme else root_uri, "--parquet-root")


def check_tracking(spec: Any, root: Path) -> None:
    """The spec's MLflow store (or the folder's own ``mlflow.db``), Parquet root and token
    cache, before Ray starts: the spec's own fields, checked before the Ray address."""
    if spec.tracking.mlflow_uri:
        _check_mlflow(spec.tracking.mlflow_uri, root)
    elif (Path(root) / "mlflow.db").exists() or (Path(root) / "mlflow.db").is_symlink():
        _check_mlflow(f"sqlite:///{Path(root) / 'mlflow.db'}", root, flag="")
    _check_parquet(spec.tracking.parquet_root)
    check_cache_dir(spec.base_config())


def check_cache_dir(cfg: Any) -> None:
    """The token cache (``data.cache_dir``, else ``$GEOSWEEP_CACHE``) is written at the first
    run of a corpus: it must be writable before anything starts."""
    cache = cfg.data.cache_dir or os.environ.get("GEOSWEEP_CACHE")
    if cache:
        check_writable_dir(cache, "data.cache_dir")


def _local_cpus() -> float:
    """The CPUs a local Ray gets: this process's CPU set, capped by a cgroup v2 quota."""
    n = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1.0, math.ceil(float(quota) / float(period))))
    except (OSError, ValueError):
        pass
    return n


def _local_gpus() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    gpus = Path("/proc/driver/nvidia/gpus")
    return len(list(gpus.iterdir())) if gpus.is_dir() else 0


def check_local_resources(spec: Any, address: str | None) -> None:
    """On a local Ray (no --address, no RAY_ADDRESS) a trial that asks for more CPUs or GPUs
    than this machine has, or for custom resources, would wait forever: Tune only warns."""
    if address or os.environ.get("RAY_ADDRESS"):
        return  # a cluster may autoscale; its resources are its own
    from cluster.warm import current

    r = spec.resources
    warm = current()
    cpus = float(warm["num_cpus"]) if warm and warm.get("num_cpus") else _local_cpus()
    need_cpu = r.workers_per_trial * r.cpus_per_worker
    where = "the warm local Ray (geosweep ray start)" if warm else "this machine"
    if need_cpu > cpus:
        raise UsageError(f"resources: a trial needs {need_cpu:g} CPUs ({r.workers_per_trial} "
                         f"worker(s) x {r.cpus_per_worker:g}) but {where} has {cpus:g}; "
                         "lower resources.cpus_per_worker or run on a cluster (--address)")
    need_gpu = r.workers_per_trial * r.gpus_per_worker
    gpus = _local_gpus()
    if need_gpu > gpus:
        raise UsageError(f"resources: a trial needs {need_gpu:g} GPUs but {where} has {gpus}; "
                         "set resources.gpus_per_worker: 0 or run on a cluster (--address)")
    if r.custom:
        raise UsageError(f"resources.custom: {', '.join(r.custom)}: a local Ray has no custom "
                         "resources, the trials would wait forever; use --address")
    check_model_memory(spec_model_configs(spec))  # a warm Ray's memory is this machine's


def _machine_bytes() -> int:
    """This machine's memory, capped by a cgroup v2 limit."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            total = min(total, int(limit))
    except (OSError, ValueError):
        pass
    return total


def check_model_memory(cfgs: Any, where: str = "this machine",
                       hint: str = " or run on a cluster (--address)") -> None:
    """A workload whose weights, gradients and optimizer state alone (a lower bound,
    workloads/model_size.py) exceed the machine's memory would only fail later, out of memory
    in its trial: refuse it now, naming the model."""
    from workloads.model_size import approx_params, min_train_bytes

    have = _machine_bytes()
    for label, cfg in cfgs:
        need = min_train_bytes(cfg)
        if need > have:
            raise UsageError(
                f"{label}: a model of {approx_params(cfg.model):.3g} parameters needs at "
                f"least {need / 2**30:.1f} GiB to train (fp32 weights, gradients, optimizer "
                f"state) but {where} has {have / 2**30:.1f} GiB; check model.* (n_embd, "
                f"n_layer, width, depth){hint}")


def spec_model_configs(spec: Any) -> list[tuple[str, Any]]:
    """The spec's base workload, and the base with each discrete model.* value of its space
    (one key at a time: the grid itself is never built)."""
    from orchestrator.sweep.gpu_fit import plan_configs
    from workloads.config import apply_overrides

    return plan_configs(spec.base_config(), spec.space, apply_overrides, prefixes=("model.",))
