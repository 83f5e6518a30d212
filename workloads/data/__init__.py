"""Real offline data for the workloads: GPT-2 / char tokens of text corpora, and MNIST.

``load_tokens(cfg.data)`` tokenizes a corpus once into a cached memory-mapped ``.npy``;
``TokenBatcher`` / ``eval_batches`` cut (x, y) windows from it; ``load_mnist()`` and
``ArrayBatcher`` do the same for MNIST. Nothing here touches the network unless a hub corpus
is asked for and the hub is reachable.

The names below are imported from their modules on first use (PEP 562): the batchers need
torch, and a sweep's driver that only checks a corpus path before Ray starts
(orchestrator/cli/checks.py) should not pay torch's ~2-3 s import for it.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it
_WHERE = {
    "ArrayBatcher": "batching", "TokenBatcher": "batching", "eval_array_batches": "batching",
    "eval_batches": "batching", "rank_seed": "batching",
    "DataError": "cache", "cache_root": "cache",
    "HUB_CORPORA": "corpora", "hub_offline_reason": "corpora", "resolve_corpus": "corpora",
    "shakespeare_files": "corpora",
    "MNIST": "mnist", "MNIST_MD5": "mnist", "load_mnist": "mnist",
    "EOT": "tokenizers", "GPT2_VOCAB": "tokenizers", "CharTokenizer": "tokenizers",
    "gpt2_encoding": "tokenizers",
    "CACHE_VERSION": "tokens", "TokenData": "tokens", "load_tokens": "tokens",
    "token_cache_paths": "tokens",
}

__all__ = sorted(_WHERE, key=str.lower)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
