"""The lean Ray Train pieces of the ``train`` executor (orchestrator/sweep/lean_train.py): they
do what Ray's TorchConfig / TuneReportCallback do, without torch or ray.tune where unpickled.

Pure unit tests (a recording fake worker group); the real runs are test_sweep_ray.py (2 workers,
DDP over gloo) and test_faults.py (1 worker, killed and restarted, equal to a plain run)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.sweep import lean_train as lt

ROOT = Path(__file__).resolve().parents[3]


class FakeGroup:
    """Records the calls a backend makes on a worker group of ``n`` workers."""

    def __init__(self, n: int, resources: dict | None = None) -> None:
        self.n, self.resources, self.calls = n, resources or {"CPU": 1.0}, []

    def __len__(self) -> int:
        return self.n

    def get_resources_per_worker(self) -> dict:
        return self.resources

    def execute(self, fn, *args, **kwargs):
        self.calls.append(("all", fn, args, kwargs))
        return [None] * self.n

    def execute_async(self, fn, *args, **kwargs):
        self.calls.append(("all_async", fn, args, kwargs))
        return [f"ref-{i}" for i in range(self.n)]

    def execute_single(self, rank, fn, *args, **kwargs):
        self.calls.append((rank, fn, args, kwargs))
        return ("10.1.2.3", 29500)

    def execute_single_async(self, rank, fn, *args, **kwargs):
        self.calls.append((f"{rank}_async", fn, args, kwargs))
        return f"ref-{rank}"


@pytest.fixture
def no_ray_get(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", lambda refs, **kw: refs)


def test_one_worker_gets_torchs_env_but_no_process_group(no_ray_get):
    g = FakeGroup(1)
    backend = lt.LeanTorchConfig(backend="gloo").backend_cls()
    backend.on_start(g, lt.LeanTorchConfig(backend="gloo"))
    assert [(c[0], c[1]) for c in g.calls] == [("all", lt._torch_env)]
    g.calls.clear()
    backend.on_shutdown(g, lt.LeanTorchConfig())
    assert g.calls == []  # nothing to tear down


@pytest.mark.parametrize("resources, backend", [({"CPU": 0.49}, "gloo"),
                                                ({"CPU": 1.0, "GPU": 1.0}, "nccl")])
def test_two_workers_rendezvous_as_ray_does(no_ray_get, resources, backend):
    from ray.train._internal.utils import get_address_and_port

    g = FakeGroup(2, resources)
    lt.LeanTorchConfig().backend_cls().on_start(g, lt.LeanTorchConfig())
    assert g.calls[0][:2] == (0, get_address_and_port)
    assert g.calls[1] == ("all", lt._set_master, ("10.1.2.3", 29500), {})
    assert g.calls[2][:2] == ("all", lt._torch_env)
    inits = g.calls[3:]
    assert [c[0] for c in inits] == ["0_async", "1_async"]
    for rank, c in enumerate(inits):
        assert c[1] is lt._init_group
        assert c[3] == {"backend": backend, "world_rank": rank, "world_size": 2,
                        "init_method": "env://", "timeout_s": 1800}
    g.calls.clear()
    lt.LeanTorchConfig().backend_cls().on_shutdown(g, lt.LeanTorchConfig())
    assert [c[:2] for c in g.calls] == [("all_async", lt._shutdown_group)]


def test_tcp_init_method_and_a_bad_one(no_ray_get):
    g = FakeGroup(2)
    lt.LeanTorchConfig(init_method="tcp").backend_cls().on_start(
        g, lt.LeanTorchConfig(init_method="tcp"))
    assert g.calls[-1][3]["init_method"] == "tcp://10.1.2.3:29500"
    with pytest.raises(ValueError, match="init_method"):
        lt.LeanTorchConfig().backend_cls().on_start(FakeGroup(2),
                                                    lt.LeanTorchConfig(init_method="x"))


def test_same_config_and_worker_side_calls_as_rays_torch_backend():
    """The fields, the GPU sharing and the Ray functions the workers call: an upgrade of Ray
    that renames or reshapes them fails here, not in a sweep."""
    from ray.train.torch import config as rtc

    assert lt.LeanTorchConfig().to_dict() == rtc.TorchConfig().to_dict()
    assert lt.LeanTorchConfig().framework == rtc.TorchConfig().framework
    assert lt._LeanTorchBackend.share_cuda_visible_devices == \
        rtc._TorchBackend.share_cuda_visible_devices
    params = inspect.signature(rtc._setup_torch_process_group).parameters
    assert {"backend", "world_rank", "world_size", "init_method", "timeout_s"} <= set(params)
    assert "destroy_process_group" in inspect.signature(rtc._shutdown_torch).parameters
    assert callable(rtc._set_torch_distributed_env_vars)
    assert hasattr(rtc.TorchConfigContextManager, "__enter__")


def test_tune_forward_puts_rank0_metrics_and_the_checkpoint_path():
    class Q:
        items: list = []

        def put(self, x):
            self.items.append(x)

    class Ckpt:
        path = "/store/train-x/checkpoint_000001"

    cb = object.__new__(lt.TuneForward)
    cb._queue = Q()
    rank0, rank1 = {"step": 3, "objective": 1.5}, {"step": 3, "objective": 9.0}
    cb.after_report(None, [rank0, rank1], None)
    cb.after_report(None, [rank0, rank1], Ckpt())
    assert cb._queue.items == [rank0, {**rank0, lt.CHECKPOINT_PATH_KEY: Ckpt.path}]
    assert lt.CHECKPOINT_PATH_KEY not in rank0  # the worker's dict is not changed


def test_tune_forward_outside_a_tune_trial_says_so():
    with pytest.raises(RuntimeError, match="inside a Tune trial"):
        lt.TuneForward()


def test_lean_trainer_drops_only_the_ray_data_callback_without_datasets():
    import ray.train
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

    def fn():
        return None

    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    trainer = lt.lean_trainer(fn, scaling_config=ray.train.ScalingConfig(num_workers=1),
                              backend_config=lt.LeanTorchConfig())
    lean = trainer._create_default_callbacks()
    full = DataParallelTrainer._create_default_callbacks(trainer)
    assert not any(isinstance(c, DatasetsCallback) for c in lean)
    assert any(isinstance(c, DatasetsCallback) for c in full)
    assert [type(c) for c in full if not isinstance(c, DatasetsCallback)] == \
        [type(c) for c in lean]


@pytest.mark.timeout(240)
def test_module_imports_neither_torch_nor_ray_tune():
    """The Train controller and every worker import this module to unpickle its classes."""
    code = ("import sys, orchestrator.sweep.lean_train; "
            "print(sorted(m for m in ('torch', 'ray.tune') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=230, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                     "RAY_USAGE_STATS_ENABLED": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("webui_url, api_server, keep", [
    ("", None, False),                     # head started without a dashboard: no state API
    ("", "", False),
    ("127.0.0.1:8265", None, True),        # a dashboard serves the state API
    (None, None, True),                    # unknown (no Ray connected): Ray's default
    ("", "http://10.0.0.1:8265", True),    # the state API pointed elsewhere
])
def test_keep_pg_cleaner(webui_url, api_server, keep):
    assert lt.keep_pg_cleaner(webui_url, api_server) is keep


def test_webui_url_is_unknown_without_ray():
    import ray

    assert not ray.is_initialized()
    assert lt._webui_url() is None


@pytest.mark.parametrize("webui_url, api_server, kept", [
    ("", None, False), ("127.0.0.1:8265", None, True), (None, None, True),
    ("", "http://10.0.0.1:8265", True),
])
def test_lean_trainer_starts_the_pg_cleaner_only_where_it_can_work(monkeypatch, webui_url,
                                                                  api_server, kept):
    import ray.train
    from ray.train.v2._internal.callbacks.placement_group_callback import (
        PlacementGroupCleanerCallback,
    )

    monkeypatch.setattr(lt, "_webui_url", lambda: webui_url)
    if api_server is None:
        monkeypatch.delenv(lt._API_SERVER_ENV, raising=False)
    else:
        monkeypatch.setenv(lt._API_SERVER_ENV, api_server)
    trainer = lt.lean_trainer(lambda: None,
                              scaling_config=ray.train.ScalingConfig(num_workers=1),
                              backend_config=lt.LeanTorchConfig())
    cbs = trainer._create_default_callbacks()
    assert any(isinstance(c, PlacementGroupCleanerCallback) for c in cbs) is kept
