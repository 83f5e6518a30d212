"""Tokenize a corpus once, keep the ids as a memory-mapped ``.npy``, split train/val.

The cache file is keyed by (corpus identity incl. file sizes and mtimes or the hub name,
tokenizer, ``max_tokens``, ``CACHE_VERSION``); ``val_fraction`` is applied at load time, so one
file serves every split. Layout under the cache root::

    tokens/<slug>-<tokenizer>-<key>.json   tokenizer name, vocab size, char vocabulary, ...
    tokens/<slug>-<tokenizer>-<key>.npy    (n_tokens,) uint16 (uint32 for vocabularies > 65536)

The ``.json`` is renamed into place first and the ``.npy`` last, so an existing ``.npy`` means
a complete entry.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workloads.config import DataConfig
from workloads.data.cache import DataError, atomic_write_json, cache_root, digest
from workloads.data.corpora import Corpus, check_hub_reachable, resolve_corpus
from workloads.data.tokenizers import EOT, CharTokenizer, gpt2_encoding

__all__ = ["CACHE_VERSION", "TOKENIZERS", "TokenData", "load_tokens", "token_cache_paths"]

CACHE_VERSION = 1  # bump when the token stream for the same inputs would change
TOKENIZERS = ("gpt2", "char")
_DOCS_PER_BATCH = 256
_COPY_BLOCK = 1 << 24


@dataclass
class TokenData:
    train: np.ndarray  # (n_train,) read-only memmap of token ids
    val: np.ndarray  # (n_val,) the last val_fraction of the stream
    vocab_size: int  # 50257 for gpt2 (models may pad it), len(vocab) for char
    tokenizer: str
    encode: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]
    path: Path
    meta: dict[str, Any] = field(default_factory=dict)


def token_cache_paths(data_cfg: DataConfig) -> tuple[Path, Path]:
    """(ids .npy, meta .json) for this config; validates corpus and tokenizer."""
    if data_cfg.tokenizer not in TOKENIZERS:
        raise DataError(
            f"data.tokenizer: {data_cfg.tokenizer!r} is not one of {', '.join(TOKENIZERS)}"
        )
    if data_cfg.max_tokens < 0:
        raise DataError(f"data.max_tokens: must be >= 0, got {data_cfg.max_tokens!r}")
    corpus = resolve_corpus(data_cfg.corpus)
    key = digest({"corpus": corpus.identity, "tokenizer": data_cfg.tokenizer,
                  "max_tokens": data_cfg.max_tokens, "version": CACHE_VERSION})
    root = cache_root(data_cfg.cache_dir) / "tokens"
    root.mkdir(parents=True, exist_ok=True)
    stem = f"{corpus.slug}-{data_cfg.tokenizer}-{key}"
    return root / f"{stem}.npy", root / f"{stem}.json"


def load_tokens(data_cfg: DataConfig) -> TokenData:
    """Token ids of ``data.corpus`` (tokenized on first use, then memory-mapped)."""
    npy, meta_path = token_cache_paths(data_cfg)
    if not npy.exists():
        _build(resolve_corpus(data_cfg.corpus), data_cfg, npy, meta_path)
    meta = json.loads(meta_path.read_text())
    ids = np.load(npy, mmap_mode="r")
    n_val = int(len(ids) * data_cfg.val_fraction)
    n_train = len(ids) - n_val
    if meta["tokenizer"] == "gpt2":
        enc = gpt2_encoding()

        def encode(text: str) -> list[int]:
            return enc.encode(text, allowed_special={EOT})

        decode: Callable[[Sequence[int]], str] = enc.decode
    else:
        char = CharTokenizer(meta["char_vocab"])
        encode, decode = char.encode, char.decode
    return TokenData(ids[:n_train], ids[n_train:], int(meta["vocab_size"]), meta["tokenizer"],
                     encode, decode, npy, meta)


# --- building a cache entry ---------------------------------------------------------------


def _encode_batch(docs: list[str], tokenizer: Any) -> list[np.ndarray]:
    """The only place that runs a tokenizer (tests patch it to prove cache hits)."""
    if isinstance(tokenizer, CharTokenizer):
        return [tokenizer.encode_array(d) for d in docs]
    return [np.asarray(ids, dtype=np.int64)
            for ids in tokenizer.encode_ordinary_batch(docs, num_threads=2)]


def _batched(docs: Iterable[str], n: int) -> Iterator[list[str]]:
    """Batches of 1, 2, 4, ... n documents: a short ``max_tokens`` prefix encodes little."""
    batch: list[str] = []
    size = 1
    for d in docs:
        batch.append(d)
        if len(batch) == size:
            yield batch
            batch, size = [], min(2 * size, n)
    if batch:
        yield batch


def _token_chunks(docs: Iterable[str], tokenizer: Any, sep: int) -> Iterator[np.ndarray]:
    """doc_0, sep, doc_1, sep, ... as int64 chunks (``sep``: <|endoftext|> or newline)."""
    first = True
    for batch in _batched(docs, _DOCS_PER_BATCH):
        for ids in _encode_batch(batch, tokenizer):
            if not first:
                yield np.array([sep], dtype=np.int64)
            first = False
            yield ids


def _build(corpus: Corpus, data_cfg: DataConfig, npy: Path, meta_path: Path) -> None:
    name = data_cfg.tokenizer
    if corpus.kind == "hub":
        if name == "char":
            raise DataError(
                f"data.tokenizer: char needs a local corpus, not the hub corpus {data_cfg.corpus!r}"
            )
        check_hub_reachable(data_cfg.corpus)
    char_vocab = None
    if name == "char":
        text = "\n".join(corpus.documents())
        tok: Any = CharTokenizer.from_text(text)
        char_vocab, vocab_size = tok.vocab, tok.vocab_size
        docs: Iterable[str] = [text]
        sep = 0  # never used: one document
    else:
        tok = gpt2_encoding()
        vocab_size, sep = tok.n_vocab, tok.eot_token
        # stream a hub corpus when only a prefix is wanted, instead of downloading all of it
        docs = corpus.documents(streaming=data_cfg.max_tokens > 0)
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.uint32
    meta = {"tokenizer": name, "vocab_size": vocab_size, "char_vocab": char_vocab,
            "dtype": np.dtype(dtype).name, "corpus": data_cfg.corpus, "identity": corpus.identity,
            "max_tokens": data_cfg.max_tokens, "version": CACHE_VERSION}
    tmp_npy = npy.with_name(f".{npy.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        meta["n_tokens"] = _write_stream(_token_chunks(docs, tok, sep), tmp_npy, dtype,
                                         data_cfg.max_tokens, data_cfg.corpus)
        atomic_write_json(meta_path, meta)
        os.replace(tmp_npy, npy)
    finally:
        tmp_npy.unlink(missing_ok=True)


def _write_stream(chunks: Iterable[np.ndarray], out: Path, dtype: Any, max_tokens: int,
                  corpus: str) -> int:
    """Write the first ``max_tokens`` ids (all if 0) as a ``.npy`` at ``out``; return the count.

    Ids go to a raw side file first (the count is unknown while streaming), then into the
    ``.npy`` in blocks, so a hub corpus never has to fit in memory.
    """
    raw = out.with_suffix(".raw")
    n = 0
    try:
        with open(raw, "wb") as f:
            for c in chunks:
                if max_tokens:
                    c = c[: max_tokens - n]
                f.write(c.astype(dtype).tobytes())
                n += len(c)
                if max_tokens and n >= max_tokens:
                    break
        if n == 0:
            raise DataError(f"data.corpus: {corpus!r} yields no tokens")
        src = np.memmap(raw, dtype=dtype, mode="r", shape=(n,))
        dst = np.lib.format.open_memmap(out, mode="w+", dtype=dtype, shape=(n,))
        for i in range(0, n, _COPY_BLOCK):
            dst[i : i + _COPY_BLOCK] = src[i : i + _COPY_BLOCK]
        dst.flush()
        del src, dst
    finally:
        raw.unlink(missing_ok=True)
    return n
