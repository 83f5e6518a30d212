"""Start or join Ray with the environment geosweep needs; nothing here knows about models.

Facts this encodes (docs/platform.md): usage stats off (no network), a fast Ray Train
health-check poll (``ray.train.report`` otherwise waits ~2 s per report), Ray's log noise
quieted, temp files in a folder we choose, and a local Ray that listens on 127.0.0.1 only.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from cluster.ray_loopback import is_loopback_address, loopback_env, loopback_in_effect
from cluster.start_retry import init_with_retry

__all__ = ["ray_env", "prepare", "connect", "shutdown", "started_here", "worker_env",
           "RayStartError"]

# True once connect() has started a local Ray in this process (not joined one): only that Ray
# is this process's to shut down; a warm Ray or a cluster goes on serving other drivers, and
# the driver's exit is all it needs to drop this one's job.
_STARTED = False


class RayStartError(RuntimeError):
    """Ray could not be started or joined; the message is one line."""

# Environment every Ray process of a sweep gets (driver, Tune trials, Train workers).
_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "RAY_AIR_NEW_OUTPUT": "0",
    "TUNE_MAX_PENDING_TRIALS_PG": "8",
    # Tune's experiment snapshot (what `geosweep resume` restores) every 2 s instead of >= 10 s:
    # a trial started within the period before a driver crash is lost to Tune (sweep.py
    # _close_orphans). The snapshot of a sweep is a few kB.
    "TUNE_GLOBAL_CHECKPOINT_S": "2",
    # Tune also forces a snapshot when a trial checkpointed num_to_keep (2) times since the
    # last one, and then warns that snapshots "may become a bottleneck": ours are a few kB on
    # the sweep's own storage (measured: no cost, benchmarks/sweep_efficiency.py).
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
    # Ray starts one worker per CPU for its first driver, with no job and no runtime_env: our
    # jobs' workers have one (worker_env()), so those never serve a trial (a local start: they
    # register, sit idle and are killed ~1 s later) and only cost 2 Python processes' start
    # (~1.5 CPU-s each) on the cores that Ray's own start needs.
    "RAY_prestart_worker_first_driver": "0",
    "HF_DATASETS_OFFLINE": os.environ.get("HF_DATASETS_OFFLINE", "0"),
    "PYTHONWARNINGS": "ignore::DeprecationWarning",
}


def ray_env() -> dict[str, str]:
    """Set (and return) the environment variables geosweep wants before Ray starts."""
    for k, v in _ENV.items():
        os.environ.setdefault(k, v)
    return {k: os.environ[k] for k in _ENV}


def worker_env() -> dict[str, str]:
    """Environment for runtime_env: ours plus the caches and offline flags of this machine."""
    env = dict(ray_env())
    for k in ("GEOSWEEP_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME",
              "OMP_NUM_THREADS", "PYTHONPATH"):
        if k in os.environ:
            env[k] = os.environ[k]
    return env


def prepare() -> str | None:
    """Set the environment before ``import ray`` (Ray reads its token settings then): ours,
    and when the warm local Ray of ``geosweep ray start`` runs, its token. Returns that Ray's
    address (None: no warm Ray). Either way the Ray is local: loopback only."""
    ray_env()
    loopback_env()
    from cluster.warm import current, join_env

    warm = current()
    if warm is None:
        return None
    os.environ.pop("RAY_AUTH_TOKEN", None)  # the warm head's own token file wins
    os.environ.update(join_env(warm))
    return warm["address"]


def connect(address: str | None = None, num_cpus: float | None = None,
            temp_dir: str | None = None, quiet: bool = True) -> dict[str, Any]:
    """Join the Ray cluster at ``address``; without one, the warm local Ray of ``geosweep ray
    start`` when it runs (cluster/warm.py), else start a local one. Returns cluster resources."""
    node: dict[str, Any] = {}
    if not address and num_cpus is None and temp_dir is None:
        address = prepare()
        if address:
            node = {"_node_ip_address": "127.0.0.1"}  # the warm head listens on loopback
    else:
        ray_env()
        # a Ray on 127.0.0.1 (started here, or a head that listens on loopback only) is
        # reached at 127.0.0.1: Ray would look for it at the routable IP
        if not address or is_loopback_address(address):
            loopback_env()
    import ray

    if not address or node or is_loopback_address(address):
        loopback_in_effect()

    if ray.is_initialized():
        return ray.cluster_resources()
    kwargs: dict[str, Any] = {
        **node,
        "runtime_env": {"env_vars": worker_env()},
        "log_to_driver": not quiet,
        "logging_level": logging.WARNING if quiet else logging.INFO,
        "configure_logging": True,
    }
    global _STARTED
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            # a raylet that misses Ray's fixed 30 s window on a busy machine: once more
            init_with_retry(lambda: ray.init(num_cpus=num_cpus, include_dashboard=False,
                                             _temp_dir=temp_dir, **kwargs),
                            log=lambda m: print(f"[geosweep] {m}", file=sys.stderr))
            _STARTED = True
    except Exception as e:  # noqa: BLE001 - Ray raises many kinds; the user needs one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        where = f"join Ray at {address}" if address else "start a local Ray"
        raise RayStartError(f"could not {where}: {first}") from e
    return ray.cluster_resources()


def started_here() -> bool:
    """Whether ``connect`` started the Ray this process is connected to."""
    return _STARTED


def shutdown(force: bool = False) -> None:
    """Shut down the local Ray this process started (``connect`` without an address and no
    warm Ray running). A joined Ray (a warm one, a cluster) is left alone unless ``force``
    (a Ray the caller started itself with ``ray.init``): ``ray.shutdown()`` there only
    disconnects, which the process's exit does as well (its job ends when the driver's
    connection closes), and costs a sweep's end time."""
    global _STARTED
    if "ray" not in sys.modules:
        return
    import ray

    if ray.is_initialized() and (_STARTED or force):
        ray.shutdown()
        _STARTED = False
