"""Real offline data for the workloads: GPT-2 / char tokens of text corpora, and MNIST.

``load_tokens(cfg.data)`` tokenizes a corpus once into a cached memory-mapped ``.npy``;
``TokenBatcher`` / ``eval_batches`` cut (x, y) windows from it; ``load_mnist()`` and
``ArrayBatcher`` do the same for MNIST. Nothing here touches the network unless a hub corpus
is asked for and the hub is reachable.
"""

from workloads.data.batching import (
    ArrayBatcher,
    TokenBatcher,
    eval_array_batches,
    eval_batches,
    rank_seed,
)
from workloads.data.cache import DataError, cache_root
from workloads.data.corpora import (
    HUB_CORPORA,
    hub_offline_reason,
    resolve_corpus,
    shakespeare_files,
)
from workloads.data.mnist import MNIST, MNIST_MD5, load_mnist
from workloads.data.tokenizers import EOT, GPT2_VOCAB, CharTokenizer, gpt2_encoding
from workloads.data.tokens import CACHE_VERSION, TokenData, load_tokens, token_cache_paths

__all__ = [
    "ArrayBatcher",
    "CACHE_VERSION",
    "CharTokenizer",
    "DataError",
    "EOT",
    "GPT2_VOCAB",
    "HUB_CORPORA",
    "MNIST",
    "MNIST_MD5",
    "TokenBatcher",
    "TokenData",
    "cache_root",
    "eval_array_batches",
    "eval_batches",
    "gpt2_encoding",
    "hub_offline_reason",
    "load_mnist",
    "load_tokens",
    "rank_seed",
    "resolve_corpus",
    "shakespeare_files",
    "token_cache_paths",
]
