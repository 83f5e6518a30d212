"""The SpheretNorm step as a compiled CPU kernel (``sphere_step.cpp``), the default once built.

At small widths the eager step is all per-op overhead: ~40 element-wise ops and reductions
per sublayer (forward and backward), each a few microseconds on a (256, 64) tensor, where a
LayerNorm is one fused kernel each way (issue 16 §4). ``sphere_step.cpp`` computes the same
formulas as ``sphere_fused._SphereStep`` (docs/science.md §2.3-2.4), for every p (everything p
changes is a per-row scalar), in one kernel each way (a row stays in cache while it is read),
one C++ autograd node; ``scale_norm.h`` does the same for SpheretNorm's ScaleNorm entry.
torch.compile is no substitute on CPU: a compiled call cost ~50 us even for ``x + 1`` (torch
2.13), and the compiled step was no faster than the eager one.

Building needs a C++ compiler and ~30-60 s, so it never happens by surprise during training:
``python -m workloads.geometry.sphere_native --build`` (run by ``.ci/install``) builds it into
a folder named by a hash of the source, torch, Python and the flags (``build_dir()``), and
writes a READY file last. ``GEOSWEEP_SPHERE_NATIVE`` chooses:

- unset (the default): the kernel when READY is there (loading it takes milliseconds), else
  the eager step;
- ``0``: the eager step always;
- ``1``: the kernel, built on first use if need be.

When a build or load fails, or the inputs are not CPU floating tensors of one dtype, the eager
step runs instead: the kernel changes speed only, never values beyond rounding.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["enable", "load", "active", "build_seconds", "usable", "sphere_step_native",
           "scale_norm", "scale_norm_eager", "build_dir", "is_built", "mode"]

# The first is compiled (it includes the others); all of them make the build's key.
_SRCS = [Path(__file__).with_name(f) for f in ("sphere_step.cpp", "scale_norm.h")]
_NAME = "geosweep_sphere_step"
_CFLAGS = ["-O3"]
_ENV = "GEOSWEEP_SPHERE_NATIVE"
_MODES = {"": "auto", "0": "off", "1": "on"}
# checked: auto mode looked for a finished build (once per process, so that one process never
# switches paths half-way through a run when another one finishes a build).
_state: dict = {"mode": "auto", "ops": None, "sn": None, "failed": False, "build_s": None,
                "checked": False}


def _from_env() -> str:
    v = os.environ.get(_ENV, "").strip()
    if v not in _MODES:
        warnings.warn(f"{_ENV}={v!r} is not 0 or 1; the kernel is used only if already built",
                      RuntimeWarning, stacklevel=2)
        return "auto"
    return _MODES[v]


_state["mode"] = _from_env()


def mode() -> str:
    """'auto' (the kernel if already built), 'on' (build if need be) or 'off'."""
    return _state["mode"]


def enable(on: bool = True) -> bool:
    """Use the kernel from now on, building it if need be (on), or never (off); True if loaded."""
    _state["mode"] = "on" if on else "off"
    return active()


def _key() -> str:
    # Everything the binary depends on: a different checkout with the same source shares the
    # build; a torch or Python upgrade, or an edited source, gets a folder of its own.
    h = hashlib.sha256(b"".join(f.read_bytes() for f in _SRCS))
    for part in (torch.__version__, str(torch.version.cuda), sys.version.split()[0],
                 sys.platform, " ".join(_CFLAGS)):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:16]


def build_dir() -> Path:
    """Where the kernel is built: $TORCH_EXTENSIONS_DIR (or torch's per-user cache) / name-key.

    Ray workers on the same machine inherit the driver's environment, so they find the same
    folder; on a machine without it they run the eager step."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:  # torch's own default (torch._appdirs.user_cache_dir on Linux)
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        root = os.path.join(cache, "torch_extensions")
    return Path(root) / f"{_NAME}-{_key()}"


def _library(d: Path) -> Path:
    return d / f"{_NAME}.so"


def is_built() -> bool:
    """True when a finished build for this source, torch and Python is on disk."""
    d = build_dir()
    return (d / "READY").is_file() and _library(d).is_file()


def _bind():
    # The overloads, not the packets: less to resolve per call.
    ops = torch.ops.geosweep_sphere
    _state["sn"] = ops.scale_norm.default
    return ops.step.default


def _load_built():
    torch.ops.load_library(str(_library(build_dir())))
    return _bind()


_STALE_LOCK_S = 900  # a build takes ~30-60 s; a lock this old was left by a killed build


def _drop_stale_lock(lock: Path) -> None:
    # torch waits, without a timeout, for the lock file of a build in progress to go; a build
    # that was killed leaves it behind, and every later build would wait forever.
    try:
        if time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            lock.unlink()
            warnings.warn(f"removed a stale build lock {lock}", RuntimeWarning, stacklevel=3)
    except FileNotFoundError:
        pass


def _ninja_on_path() -> None:
    # torch runs `ninja` from PATH; the pip package installs it next to this interpreter, which
    # is not on PATH when .venv/bin/python is run without activating the venv.
    here = Path(sys.executable).parent
    if shutil.which("ninja") is None and (here / "ninja").is_file():
        os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"


def _build():
    from torch.utils import cpp_extension  # heavy import; only when a build is asked for

    d = build_dir()
    d.mkdir(parents=True, exist_ok=True)
    _drop_stale_lock(d / "lock")
    _ninja_on_path()
    t = time.perf_counter()
    # torch holds a lock file in d while it builds: a second process waits, then loads.
    cpp_extension.load(name=_NAME, sources=[str(_SRCS[0])], extra_cflags=_CFLAGS,
                       build_directory=str(d), is_python_module=False, verbose=False)
    _state["build_s"] = time.perf_counter() - t
    tmp = d / f"READY.{os.getpid()}"
    tmp.write_text(_key() + "\n")
    os.replace(tmp, d / "READY")  # written last and atomically: auto mode never sees half a build
    return _bind()


def _try(loader, what: str) -> bool:
    try:
        _state["ops"] = loader()
    except Exception as e:  # no compiler, no headers, a broken file: the eager step is exact
        _state["failed"] = True
        warnings.warn(f"SpheretNorm native kernel {what} failed, using the eager step: "
                      f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=3)
        return False
    return True


def load() -> bool:
    """Load the kernel, building it first if it is not built (once); True when loaded."""
    if _state["ops"] is not None:
        return True
    if _state["failed"]:
        return False
    if is_built():
        t = time.perf_counter()
        if _try(_load_built, "load"):
            _state["build_s"] = time.perf_counter() - t
            return True
        return False
    return _try(_build, "build")


def _load_if_built() -> bool:
    if _state["ops"] is not None:
        return True
    if _state["checked"] or _state["failed"]:
        return False
    _state["checked"] = True
    return is_built() and load()


def active() -> bool:
    """True when the step should take the kernel: 'on' builds it if need be, 'auto' only
    loads a finished build, 'off' never."""
    m = _state["mode"]
    if m == "auto":
        return _load_if_built()
    return m == "on" and load()


def build_seconds() -> float | None:
    """Seconds the first ``load()`` spent building or loading the kernel (None: not yet)."""
    return _state["build_s"]


def usable(h: Tensor, u: Tensor) -> bool:
    """Inputs the kernel takes: CPU, one floating dtype (bf16/fp16 are raised to fp32)."""
    return (h.is_cpu and u.is_cpu and h.dim() >= 1 and h.dtype == u.dtype
            and h.dtype in _DTYPES and h.shape == u.shape)


_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def sphere_step_native(h: Tensor, u: Tensor, a: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """(h_new in h's dtype, beta^2 (..., 1)); a is a 0-d tensor, p > 0 or inf.

    Call only when ``load()`` (or ``active()``) and ``usable(h, u)``. One autograd node, in C++
    (``sphere_step.cpp``); bf16/fp16 inputs are raised to fp32 around it, as in the eager step.
    """
    if h.dtype in (torch.float32, torch.float64):
        return _state["ops"](h, u, a if a.dtype == h.dtype else a.to(h.dtype), p)
    out, b = _state["ops"](h.float(), u.float(), a.float(), p)
    return out.to(h.dtype), b


_SN_DTYPES = (torch.float32, torch.float64)


def scale_norm(x: Tensor, g: Tensor, eps: float) -> Tensor:
    """ScaleNorm g x / (||x|| + eps) over the last dim (g: one element): SpheretNorm's entry.

    The kernel (``scale_norm.cpp``, one node) when the step's kernel is active and x is a CPU
    fp32/fp64 tensor of g's dtype, else these same four eager ops (and under torch.compile,
    which traces them)."""
    if (not torch.compiler.is_compiling() and x.is_cpu and x.dtype in _SN_DTYPES
            and g.dtype == x.dtype and g.is_cpu and g.numel() == 1 and active()):
        return _state["sn"](x, g, eps)
    return scale_norm_eager(x, g, eps)


def scale_norm_eager(x: Tensor, g: Tensor, eps: float) -> Tensor:
    """``scale_norm`` as four eager ops, never the kernel (fallback, tests, A/B timing)."""
    return x * (g / (x.norm(dim=-1, keepdim=True) + eps))


def _main(argv: list[str] | None = None) -> int:
    """``--build``: build (or find) the kernel, one line either way; exit 1 if it cannot be
    built (the eager step then runs: slower, same values). ``--status``: where, and whether."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m workloads.geometry.sphere_native")
    ap.add_argument("--build", action="store_true", help="build the kernel unless built")
    ap.add_argument("--status", action="store_true", help="print where it is and if it is built")
    args = ap.parse_args(argv)
    where = build_dir()
    if args.build:
        was = is_built()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ok = load()
        if not ok:  # one line on stdout; the compiler's own output went to stderr
            why = str(caught[-1].message).split(": ", 1)[-1] if caught else "unknown error"
            why = why.splitlines()[0] if why else why
            print(f"[geosweep] SpheretNorm kernel not built ({why[:160]}); SpheretNorm "
                  f"will use the eager step (same values, slower)")
            return 1
        how = "already built" if was else f"built in {build_seconds():.1f} s"
        print(f"[geosweep] SpheretNorm kernel {how}: {where}")
        return 0
    print(f"[geosweep] SpheretNorm kernel {'built' if is_built() else 'not built'}: {where}; "
          f"{_ENV} mode {mode()}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
