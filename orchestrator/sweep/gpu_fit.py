"""Will a trial fit in its share of a GPU? An estimate from the config alone, checked before
anything starts, and the device facts a GPU trial checks in its own process.

``resources.gpus_per_worker`` below 1 packs several trials onto one GPU (0.25: four). Ray
only counts the shares; it does not look at memory. A trial that needs more than its share
would run out of memory itself, or, worse, push the other trials on its GPU out of theirs.
So the driver refuses a plan whose estimate exceeds the share (one line, with the estimate),
and every GPU trial caps its own allocator at its share (``torch.cuda.
set_per_process_memory_fraction``): a trial that outgrows its share fails alone.

The estimate (``trial_gpu_bytes``) is deliberately simple and on the generous side:
fp32 weights, gradients and optimizer state (workloads/model_size.py), the bf16 copies that
autocast keeps of the weights, the activations a GPT keeps for its backward (per layer 50
bytes per token per channel under bf16 autocast, 72 in fp32: measured with saved-tensor
hooks at d=768, T=256, as 39 / 68 for Pre-LN and 49 / 70 for SpheretNorm, against
Korthikanti et al. 2022's 34 in 16 bits), the logits with their fp32 softmax and gradient,
and a fixed 1 GiB for the process's CUDA context and allocator slack.
benchmarks/gpu_check.py prints it next to the measured peak.

Pure functions on plain values: no torch, no Ray (``device_bytes`` is injected).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from typing import Any

from workloads.config import MLPConfig, WorkloadConfig
from workloads.model_size import approx_params, min_train_bytes

__all__ = ["GpuFitError", "trial_gpu_bytes", "check_gpu_fit", "plan_configs",
           "local_gpu_bytes", "visible_devices_match", "GPU_MEMORY_ENV"]

GPU_MEMORY_ENV = "GEOSWEEP_GPU_MEMORY_GB"  # plan for this GPU size (a driver without a GPU)
_GiB = 2**30
_CONTEXT_BYTES = _GiB  # CUDA context, cuBLAS workspace, allocator rounding


class GpuFitError(ValueError):
    """A plan whose trials cannot fit in their GPU share; the message is one line."""


def trial_gpu_bytes(cfg: WorkloadConfig) -> int:
    """Estimated peak GPU bytes of one training process of ``cfg`` (one rank)."""
    t, m = cfg.train, cfg.model
    bf16 = t.dtype == "bf16"
    state = min_train_bytes(cfg) + (2 * approx_params(m) if bf16 else 0)
    if isinstance(m, MLPConfig):
        # a handful of (B, width) tensors per block (input, pre-activation, norm, output)
        acts = 4 * t.batch_size * m.width * max(m.depth, 1) * 4
        return state + acts + _CONTEXT_BYTES
    tokens = t.batch_size * m.block_size
    per_layer = (50 if bf16 else 72) * tokens * m.n_embd
    # logits (2 or 4 bytes), their fp32 softmax and its gradient in the cross-entropy
    vocab = m.vocab_size or (256 if cfg.data.tokenizer == "char" else 50304)  # 0: the tokenizer's
    logits = tokens * vocab * ((2 if bf16 else 4) + 4 + 4)
    return state + m.n_layer * per_layer + logits + _CONTEXT_BYTES


def _gib(n: float) -> str:
    return f"{n / _GiB:.1f} GiB"


def check_gpu_fit(configs: Iterable[tuple[str, WorkloadConfig]], share: float,
                  device_bytes: int, where: str = "GPU") -> None:
    """Raise ``GpuFitError`` when one of ``configs`` (label, config) is estimated to need
    more than ``share`` of a GPU of ``device_bytes`` (``where``: the GPU's name)."""
    if share <= 0:
        return
    have = min(share, 1.0) * device_bytes
    for label, cfg in configs:
        need = trial_gpu_bytes(cfg)
        if need <= have:
            continue
        hint = ("raise resources.gpus_per_worker (fewer trials per GPU) or lower "
                "train.batch_size" if share < 1 else "lower train.batch_size or the model size")
        raise GpuFitError(
            f"resources.gpus_per_worker={share:g}: {label} needs ~{_gib(need)} of GPU memory "
            f"(estimate: weights, gradients, optimizer state, activations at "
            f"B={cfg.train.batch_size}) but its share of a {_gib(device_bytes)} {where} is "
            f"{_gib(have)}; {hint}")


def plan_configs(base: WorkloadConfig, space: dict[str, Any], apply: Any,
                 prefixes: tuple[str, ...] = ("model.", "train.")
                 ) -> list[tuple[str, WorkloadConfig]]:
    """The base workload and the base with each discrete value of the space's keys under
    ``prefixes``, one key at a time (the grid itself is never built). ``apply(cfg, flat)``: the
    override function (workloads.config.apply_overrides)."""
    out = [(f"workload {base.preset or 'base'}", base)]
    for key, p in space.items():
        if not key.startswith(prefixes) or not p.discrete:
            continue
        for v in p.candidates():
            try:
                out.append((f"space.{key}={v}", apply(base, {key: v})))
            except Exception:  # noqa: BLE001 - an invalid value is the spec's own error
                continue
    return out


def local_gpu_bytes(env: Any = None, probe: bool = True) -> int | None:
    """The GPU memory to plan with: ``GEOSWEEP_GPU_MEMORY_GB`` when set, else (``probe``) this
    machine's smallest GPU as nvidia-smi reports it, else None (no GPU seen here: the trials
    check on their own GPU)."""
    env = os.environ if env is None else env
    if env.get(GPU_MEMORY_ENV):
        try:
            return int(float(env[GPU_MEMORY_ENV]) * _GiB)
        except ValueError:
            raise GpuFitError(f"{GPU_MEMORY_ENV}={env[GPU_MEMORY_ENV]!r}: not a number of "
                              "GiB") from None
    smi = shutil.which("nvidia-smi") if probe else None
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        mib = [float(x) for x in out.split() if x.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return int(min(mib) * 2**20) if mib else None


def visible_devices_match(env_value: str | None, ray_ids: Iterable[Any]) -> bool:
    """Whether CUDA_VISIBLE_DEVICES (as the trial's process sees it) lists exactly the GPUs
    Ray gave the trial, in any order."""
    ids = sorted(str(i) for i in ray_ids)
    seen = sorted(d.strip() for d in (env_value or "").split(",") if d.strip())
    return seen == ids
