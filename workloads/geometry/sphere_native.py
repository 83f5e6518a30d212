"""The p = 1 SpheretNorm step as a compiled CPU kernel (``sphere_p1.cpp``), opt-in.

At small widths the eager step is all per-op overhead: ~40 element-wise ops and reductions
per sublayer (forward and backward), each a few microseconds on a (256, 64) tensor, where a
LayerNorm is one fused kernel each way (issue 16 §4). ``sphere_p1.cpp`` computes the same
formulas as ``sphere_fused._SphereStepP1`` (docs/science.md §2.3-2.4) in one kernel each way
(a row stays in cache while it is read), one C++ autograd node. torch.compile is no substitute
on CPU: a compiled call cost ~50 us even for ``x + 1`` (torch 2.13), and the compiled step was
no faster than the eager one.

Opt-in, because the first use builds the kernel (a C++ compiler and ~30-60 s; torch caches the
build per machine): set ``GEOSWEEP_SPHERE_NATIVE=1`` or call ``enable()``. When the build or
load fails, or the inputs are not CPU floating tensors of one dtype, the eager step runs
instead: the kernel changes speed only, never values beyond rounding.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["enable", "load", "active", "build_seconds", "usable", "sphere_step_p1_native"]

_SRC = Path(__file__).with_name("sphere_p1.cpp")
_ENV = "GEOSWEEP_SPHERE_NATIVE"
_state: dict = {"wanted": False, "ops": None, "failed": False, "build_s": None}


def _from_env() -> bool:
    v = os.environ.get(_ENV, "").strip()
    if v not in ("", "0", "1"):
        warnings.warn(f"{_ENV}={v!r} is not 0 or 1; the kernel stays off", RuntimeWarning,
                      stacklevel=2)
    return v == "1"


_state["wanted"] = _from_env()


def enable(on: bool = True) -> bool:
    """Use the kernel from now on (building it if need be); True when it is loaded."""
    _state["wanted"] = on
    return active()


def _load():
    from torch.utils import cpp_extension  # heavy import; only when the kernel is wanted

    t = time.perf_counter()
    cpp_extension.load(name="geosweep_sphere_p1", sources=[str(_SRC)], extra_cflags=["-O3"],
                       is_python_module=False, verbose=False)
    _state["build_s"] = time.perf_counter() - t
    return torch.ops.geosweep_sphere.p1_step.default  # the overload: less to resolve per call


def active() -> bool:
    """True when the kernel is wanted (enabled) and loaded; the first call builds or loads it."""
    return _state["wanted"] and load()


def load() -> bool:
    """Build or load the kernel (once); True when loaded. Does not make it the default."""
    if _state["failed"]:
        return False
    if _state["ops"] is None:
        try:
            _state["ops"] = _load()
        except Exception as e:  # no compiler, no headers, ...: the eager step is exact anyway
            _state["failed"] = True
            warnings.warn(f"SpheretNorm native p=1 kernel unavailable, using the eager step: "
                          f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)
            return False
    return True


def build_seconds() -> float | None:
    """Seconds the first ``load()`` spent building or loading the kernel (None: not yet)."""
    return _state["build_s"]


def usable(h: Tensor, u: Tensor) -> bool:
    """Inputs the kernel takes: CPU, one floating dtype (bf16/fp16 are raised to fp32)."""
    return (h.is_cpu and u.is_cpu and h.dim() >= 1 and h.dtype == u.dtype
            and h.dtype in _DTYPES and h.shape == u.shape)


_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def sphere_step_p1_native(h: Tensor, u: Tensor, a: Tensor) -> tuple[Tensor, Tensor]:
    """(h_new in h's dtype, beta^2 (..., 1)) for p = 1; a is a 0-d tensor.

    Call only when ``load()`` (or ``active()``) and ``usable(h, u)``. One autograd node, in C++
    (``sphere_p1.cpp``); bf16/fp16 inputs are raised to fp32 around it, as in the eager step.
    """
    if h.dtype in (torch.float32, torch.float64):
        return _state["ops"](h, u, a if a.dtype == h.dtype else a.to(h.dtype))
    out, b = _state["ops"](h.float(), u.float(), a.float())
    return out.to(h.dtype), b
