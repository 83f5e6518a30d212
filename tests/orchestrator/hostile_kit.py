"""Setups of tests/orchestrator/cli/test_hostile.py's cases: broken sweep folders, model
folders and checkpoints, a locked folder, a Ray-free sweep with trained checkpoints (copied
from one build per session), corpora with traps. Each takes the case's tmp folder."""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tiny_spec import TINY

SPEC = TINY
CHILDREN: list = []  # processes a setup started (the test reaps them)


@dataclass
class Case:
    id: str
    argv: list[str]  # {tmp}, {spec}, {sweep}, {model}, {fake}, {http} are filled in
    code: int
    line: str  # a regex the single stderr line must match (code 0: a regex on stdout)
    setup: Callable[[Path], None] | None = None
    spec: str | None = None  # written to {spec}
    env: dict | None = None  # environment variables for the case
    makes: tuple[str, ...] = ()  # code 0: globs (under tmp) that must exist afterwards
    no_cuda: bool = False  # skipped on a machine with CUDA


def sweep_folder(tmp: Path, name: str = "tiny", manifest: object = None,
                 raw: bytes | None = None, spec: str | None = SPEC) -> Path:
    """A sweep folder as `run` leaves it, without Ray: spec.yaml, sweep.json, parquet/."""
    root = tmp / "runs" / name
    (root / "parquet").mkdir(parents=True)
    if spec is not None:
        (root / "spec.yaml").write_text(spec)
    if raw is not None:
        (root / "sweep.json").write_bytes(raw)
    else:
        m = {"name": "tiny", "trials": 2, "mlflow_uri": None, "parquet_root": "./parquet"}
        (root / "sweep.json").write_text(json.dumps(m if manifest is None else manifest))
    return root


def evil_ckpt(t: Path, raw: bytes | None = None) -> None:
    step = t / "o" / "checkpoints" / "step-00000002"
    step.mkdir(parents=True)
    if raw is None:
        import torch

        torch.save({"model": {}, "x": Evil()}, step / "state.pt")
    else:
        (step / "state.pt").write_bytes(raw)


def parquet_part(t: Path, raw: bytes) -> None:
    root = sweep_folder(t)
    d = root / "parquet" / "trials" / "sweep=tiny" / "trial=t1"
    d.mkdir(parents=True)
    (d / "part-0.parquet").write_bytes(raw)


def model(t: Path, name: str, data: bytes) -> None:
    (t / "model").mkdir()
    (t / "model" / name).write_bytes(data)


class Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED_BY_PICKLE",))


def evil_state(t: Path) -> None:
    import torch

    (t / "model").mkdir()
    torch.save({"model": {}, "x": Evil()}, t / "model" / "state.pt")


def nan_model(t: Path, config: bytes | None = None) -> None:
    import torch
    from safetensors.torch import save_file

    (t / "model").mkdir()
    L, d = 3, 8
    tensors = {}
    for i in range(L):
        for r in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            w = torch.randn(d, d)
            if i == 1:
                w[0, 0] = math.nan
            tensors[f"transformer.h.{i}.{r}.weight"] = w
    save_file(tensors, str(t / "model" / "model.safetensors"))
    if config is not None:
        (t / "model" / "config.json").write_bytes(config)


def locked(t: Path) -> None:
    """The sweep folder locked by another process (a child that sleeps holding the flock)."""
    root = sweep_folder(t)
    code = ("import fcntl, json, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | "
            "os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, json.dumps({'pid': "
            "os.getpid(), 'host': 'elsewhere', 'started': time.time()}).encode()); "
            "print('ok', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(root / ".lock")],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ok"
    CHILDREN.append(p)
    time.sleep(0.01)


_CHILDREN: list = []


# --- a Ray-free sweep with trained checkpoints (tests/orchestrator/fake_sweep.py) ------------

_FAKE: dict[str, Path] = {}


def fake_sweep(t: Path) -> Path:
    """``t/runs/fake``: a copy of one fake sweep built per session (3 trials, 2 with
    checkpoints), its sweep.json made relative as `run` writes it."""
    if "base" not in _FAKE:
        from fake_sweep import make_sweep

        base = Path(tempfile.mkdtemp(prefix="geosweep-hostile-"))
        atexit.register(shutil.rmtree, base, True)
        _FAKE["base"] = make_sweep(base).root
    root = t / "runs" / "fake"
    shutil.copytree(_FAKE["base"], root)
    (root / "sweep.json").write_text(json.dumps({
        "name": "fake", "trials": 3, "mlflow_uri": "sqlite:///./mlflow.db",
        "parquet_root": "./parquet"}))
    return root


def fake_with(t: Path, edit) -> Path:
    root = fake_sweep(t)
    edit(root)
    return root


def truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def state_files(root: Path) -> list[Path]:
    return sorted(root.glob("ray/tune/*/checkpoint_*/step-*/state.pt"))


def evil_state_file(path: Path) -> None:
    import torch

    torch.save({"model": {}, "x": Evil()}, path)


def symlink_out(root: Path, name: str, t: Path) -> None:
    """``root/name`` replaced by a symlink to a folder outside the sweep."""
    target = t / "outside"
    target.mkdir(exist_ok=True)
    p = root / name
    if p.is_dir():
        shutil.rmtree(p)
    p.symlink_to(target, target_is_directory=True)


def corpus(t: Path, name: str) -> None:
    """The trap corpora of `eval --corpus` cases."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = t / name
    if name == "late_bad.txt":  # valid for the first 64 kB, then a byte that is not UTF-8
        p.write_bytes(b"To be, or not to be. " * 4000 + b"\xff\xfe" + b" the end" * 10)
    elif name == "latin1.txt":
        p.write_bytes("caf\xe9 au lait ".encode("latin-1") * 50)
    elif name.endswith(".parquet"):
        values = {"int": [1, 2, 3], "bin": [b"ab", b"cd", b"ef"], "list": [["a"], ["b"], []]}
        pq.write_table(pa.table({"text": values[name.split("_")[0]]}), p)


def fifo(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
