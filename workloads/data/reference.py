"""The context-free reference loss of a token corpus: what a model that has learned only the
training split's token frequencies scores on the validation split.

``context_free_loss`` = -(1/N_val) sum_t log q(x_t), q = the training split's unigram
frequencies with add-one smoothing over the vocabulary (a token never seen in training would
otherwise cost infinitely much). A language model whose val loss is at or above it has learned
nothing that uses context: with AdamW and gradient clipping, a too-large learning rate rarely
ends in a non-finite loss; it ends here, at the frequency plateau, and stays. The stability
frontier of `geosweep report` (orchestrator/analysis/frontier.py) counts such a trial as
unstable (docs/science.md §2).

Pure function of the cached token ids: a few milliseconds for a char corpus, one bincount per
split for BPE.
"""

from __future__ import annotations

import math

import numpy as np

from workloads.config import DataConfig

__all__ = ["context_free_loss", "unigram_cross_entropy"]


def unigram_cross_entropy(train: np.ndarray, val: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats per token) of ``val`` under add-one-smoothed ``train`` frequencies."""
    if len(val) == 0:
        raise ValueError("the validation split is empty")
    n = max(int(vocab_size), int(train.max(initial=0)) + 1, int(val.max(initial=0)) + 1)
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=n).astype(np.float64)
    logq = np.log(counts + 1.0) - math.log(counts.sum() + n)
    vc = np.bincount(np.asarray(val, dtype=np.int64), minlength=n).astype(np.float64)
    return float(-(vc * logq).sum() / vc.sum())


def context_free_loss(data_cfg: DataConfig) -> float:
    """``unigram_cross_entropy`` of the corpus ``data_cfg`` names, from its token cache (built
    on first use like any training run's)."""
    from workloads.data.tokens import load_tokens

    d = load_tokens(data_cfg)
    return unigram_cross_entropy(d.train, d.val, d.vocab_size)
