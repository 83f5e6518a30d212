"""[2b] The Ray Train pieces of the ``train`` executor, built to be cheap per trial.

A Ray Train run starts fresh processes for every trial (the controller, its helper actors, the
workers) and each one imports what it unpickles. Measured (benchmarks/train_executor.py) on a
2-core machine, that start was the trial's cost, not the training. What this module changes,
and why the results stay the same:

- ``LeanTorchConfig``: the backend of ``TorchTrainer`` (same process-group set-up, same env
  vars, same CUDA-visible-devices sharing, same device context), but importable without torch:
  Ray's ``TorchConfig`` lives in a module that imports torch, which the controller then
  imports only to unpickle it. torch runs only on the workers (Ray's own set-up functions,
  called there). A 1-worker group gets no ``torch.distributed`` process group: the training
  loop then trains without DDP, which for one rank is the same arithmetic (its all-reduce
  over one rank is the identity) without a rendezvous.
- ``TuneForward``: Ray Tune's ``TuneReportCallback`` (the workers' reports to the Tune
  trial), the same queue and payload, in a module that does not import ``ray.tune`` into the
  controller and every worker.
- ``lean_trainer``: a ``DataParallelTrainer`` without the Ray Data callback when it has no
  datasets (it would start one idle Ray Data actor per trial), and without the placement-group
  cleaner on a Ray whose head serves no dashboard (``keep_pg_cleaner``): the cleaner is one
  more detached actor process per trial that asks Ray's state API, served by the dashboard,
  whether the controller lives; without a dashboard every ask fails and it never cleans.

Nothing here imports torch or ``ray.tune`` at module level: the controller imports this module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ray.train.backend import Backend, BackendConfig
from ray.train.v2.api.callback import UserCallback

__all__ = ["LeanTorchConfig", "TuneForward", "lean_trainer", "keep_pg_cleaner",
           "CHECKPOINT_PATH_KEY"]

CHECKPOINT_PATH_KEY = "checkpoint_path"  # what TuneReportCallback adds for a checkpoint

# Ray's default 30 s for the process-group shutdown call (ray.train.constants)
_SHUTDOWN_TIMEOUT_ENV = "TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S"


@dataclass
class LeanTorchConfig(BackendConfig):
    """``ray.train.torch.TorchConfig``'s fields and behaviour (``backend`` None: nccl with
    GPUs, else gloo), without importing torch where it is unpickled."""

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    @property
    def backend_cls(self) -> type:
        return _LeanTorchBackend

    @property
    def train_func_context(self) -> type:
        return _DeviceContext

    @property
    def framework(self) -> Any:
        from ray.train.v2._internal.util import TrainingFramework

        return TrainingFramework.TORCH

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "init_method": self.init_method,
                "timeout_s": self.timeout_s}


class _LeanTorchBackend(Backend):
    # as Ray's _TorchBackend: workers on a node see each other's GPUs (NCCL needs it)
    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group: Any, backend_config: LeanTorchConfig) -> None:
        import ray
        from ray.train._internal.utils import get_address_and_port

        world = len(worker_group)
        if world > 1:
            addr, port = worker_group.execute_single(0, get_address_and_port)
            if backend_config.init_method == "env":
                worker_group.execute(_set_master, addr, port)
                url = "env://"
            elif backend_config.init_method == "tcp":
                url = f"tcp://{addr}:{port}" if ":" not in addr else f"tcp://[{addr}]:{port}"
            else:
                raise ValueError(f"init_method must be 'env' or 'tcp', not "
                                 f"{backend_config.init_method!r}")
        # LOCAL_RANK, RANK, WORLD_SIZE, ... (torchrun's variables) on every worker, 1 or many
        worker_group.execute(_torch_env)
        if world == 1:
            return
        backend = backend_config.backend or (
            "nccl" if worker_group.get_resources_per_worker().get("GPU", 0) else "gloo")
        ray.get([worker_group.execute_single_async(
            i, _init_group, backend=backend, world_rank=i, world_size=world, init_method=url,
            timeout_s=backend_config.timeout_s) for i in range(world)])

    def on_shutdown(self, worker_group: Any, backend_config: LeanTorchConfig) -> None:
        if len(worker_group) == 1:
            return  # no process group; the worker process ends next, freeing its memory
        import ray
        from ray.exceptions import GetTimeoutError

        futures = worker_group.execute_async(_shutdown_group)
        try:
            ray.get(futures, timeout=float(os.environ.get(_SHUTDOWN_TIMEOUT_ENV, "30")))
        except GetTimeoutError:
            import logging

            logging.getLogger(__name__).warning("torch process group shutdown timed out")


class _DeviceContext:
    """Ray's ``TorchConfigContextManager``: the worker's CUDA device around the train fn."""

    def __enter__(self) -> None:
        from ray.train.torch.config import TorchConfigContextManager

        TorchConfigContextManager().__enter__()

    def __exit__(self, *exc: Any) -> bool:
        return False


# --- run on the workers (module-level: pickled by reference; torch is imported there) -------
def _set_master(addr: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


def _torch_env() -> None:
    from ray.train.torch.config import _set_torch_distributed_env_vars

    _set_torch_distributed_env_vars()


def _init_group(**kwargs: Any) -> None:
    from ray.train.torch.config import _setup_torch_process_group

    _setup_torch_process_group(**kwargs)


def _shutdown_group() -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=True)


# --- the Tune side ------------------------------------------------------------------------------
class TuneForward(UserCallback):
    """Ray Tune's ``TuneReportCallback`` (ray/tune/integration/ray_train.py): rank 0's metrics,
    plus the persisted checkpoint's path, onto the Tune trial's queue. Construct it inside the
    Tune trial."""

    def __init__(self) -> None:
        from ray.train._internal.session import get_session

        session = get_session()
        if session is None:
            raise RuntimeError("TuneForward must be built inside a Tune trial")
        self._queue = session._get_or_create_inter_actor_queue()

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]],
                     checkpoint: Any) -> None:
        out = metrics[0].copy()
        if checkpoint:
            out[CHECKPOINT_PATH_KEY] = checkpoint.path
        self._queue.put(out)


def lean_trainer(train_fn: Any, **kwargs: Any) -> Any:
    """A Ray Train ``DataParallelTrainer`` (``kwargs``: its own) that starts no Ray Data actor
    when it has no datasets, and no placement-group cleaner where it cannot work."""
    return _trainer_cls()(train_fn, **kwargs)


# Ray's placement-group cleaner (ray/train/v2/_internal/execution/controller/
# placement_group_cleaner.py, pinned ray 2.60) asks ``ray.util.state.get_actor`` every second
# whether the controller lives; that client finds the API server in RAY_API_SERVER_ADDRESS,
# else at the dashboard address the head writes to the GCS KV (ray/dashboard/utils.py), which
# it writes even when it serves no HTTP (include_dashboard=False: dashboard.py
# --disable-frontend). Checked on a geosweep-started Ray: every
# ask fails (ServerUnavailable: the cleaner logs and retries forever, never cleaning), or
# with several Rays on the machine the cleaner's monitor thread dies on its first ask.
_API_SERVER_ENV = "RAY_API_SERVER_ADDRESS"


def keep_pg_cleaner(webui_url: str | None, api_server_address: str | None) -> bool:
    """Whether Ray Train's placement-group cleaner can reach Ray's state API.

    ``webui_url``: the dashboard URL the head recorded (``""``: started without a dashboard;
    ``None``: unknown, e.g. no Ray connected). ``api_server_address``: the
    RAY_API_SERVER_ADDRESS setting, if any (the state API served elsewhere). Unknown keeps
    the cleaner: Ray's default."""
    return bool(api_server_address) or webui_url != ""


def _webui_url() -> str | None:
    """The dashboard URL the head node recorded in the GCS KV (``""`` when it runs none);
    None when no Ray is connected or the key cannot be read. One KV read."""
    import ray

    if not ray.is_initialized():
        return None
    try:
        # pinned ray 2.60: what Node reads for a worker (ray/_private/node.py); the head
        # writes "webui:url" = "" when it starts without a dashboard (ray/_private/services.py
        # start_api_server, dashboard_url = "" for include_dashboard=False)
        from ray._private.services import get_webui_url_from_internal_kv

        return get_webui_url_from_internal_kv()
    except Exception:  # noqa: BLE001 - a private API: unknown keeps Ray's default
        return None


_CLS: list[type] = []


def _trainer_cls() -> type:
    if _CLS:
        return _CLS[0]
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import (
        PlacementGroupCleanerCallback,
    )
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    class _LeanTrainer(DataParallelTrainer):
        def _create_default_callbacks(self) -> list:
            callbacks = super()._create_default_callbacks()
            drop: tuple[type, ...] = ()
            if not self.datasets:
                drop += (DatasetsCallback,)
            if not keep_pg_cleaner(_webui_url(), os.environ.get(_API_SERVER_ENV)):
                drop += (PlacementGroupCleanerCallback,)
            return [c for c in callbacks if not isinstance(c, drop)]

    _CLS.append(_LeanTrainer)
    return _LeanTrainer
