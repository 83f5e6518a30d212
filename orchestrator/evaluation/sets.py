"""The held-out sets ``geosweep eval`` scores a trial on, built once per tokenizer and shape.

Corpus references (``--corpus``) and their keys in metric names ``eval/<key>/<metric>``:

- the trial's own held-out split, always: ``<corpus>-val`` (the last ``data.val_fraction`` of
  the training corpus's token stream, e.g. ``shakespeare-val``), or ``mnist-test`` for MLPs;
- a local ``.txt`` file (one document) or ``.parquet`` file (one document per row of its first
  column named ``text``, ``content`` or ``document``): key = the file's stem (``[A-Za-z0-9_-]``);
- ``wikitext-2`` (WikiText-2 raw, test split) and ``lambada`` (LAMBADA, OpenAI's test split;
  last-word accuracy) through ``datasets``, only when the Hugging Face hub is reachable.

Text is tokenized with the trial's own tokenizer (documents joined by ``<|endoftext|>`` for
GPT-2 BPE, by a newline for char-level) and cut into consecutive non-overlapping windows of
``block_size`` (+1 for the targets), ``batch_size`` windows per batch, at most ``max_batches``
batches from the start: a fixed set, so repeated evaluations give identical numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchestrator.evaluation.corpora import HUB_SETS, EvalSkip, HubSet, corpus_key, text_column
from orchestrator.evaluation.scoring import EvalSet

__all__ = ["windows", "lambada_batches", "EvalSources"]

def _local_documents(ref: str) -> Iterable[str]:
    p = Path(ref).expanduser()
    if p.suffix.lower() == ".txt":
        yield p.read_text(encoding="utf-8")
        return
    import pyarrow.parquet as pq

    col = text_column(p)
    for batch in pq.ParquetFile(p).iter_batches(columns=[col], batch_size=1024):
        yield from (t for t in batch.column(0).to_pylist() if t)


def _hub_rows(spec: HubSet) -> list[str]:
    import datasets

    ds = datasets.load_dataset(spec.path, spec.name, split=spec.split)
    return [str(t) for t in ds["text"]]


# --- token windows -------------------------------------------------------------------------


def windows(ids: np.ndarray, batch_size: int, block: int,
            max_batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive non-overlapping (x, y) windows from the start of ``ids``; x, y (b, block)."""
    n = (len(ids) - 1) // block
    if max_batches > 0:
        n = min(n, max_batches * batch_size)
    if n < 1:
        raise EvalSkip(f"{len(ids)} tokens: shorter than one block of {block} + 1")
    ids_t = torch.from_numpy(np.asarray(ids[: n * block + 1], dtype=np.int64))
    x = ids_t[:-1].view(n, block)
    y = ids_t[1:].view(n, block)
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n, batch_size)]


def lambada_batches(texts: Iterable[str], encode: Callable[[str], list[int]], batch_size: int,
                    block: int, max_batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """LAMBADA examples as right-padded batches; y is -1 except on the last word's tokens.

    Each text is split at its last space: context, `` word``; the context is cut from the left
    so context + word fits ``block`` + 1 tokens. Padding (x 0, y -1) sits after the scored
    tokens, which causal attention never lets them see."""
    examples: list[tuple[list[int], list[int]]] = []
    limit = max_batches * batch_size if max_batches > 0 else None
    for text in texts:
        text = text.strip()
        if " " not in text:
            continue
        ctx, word = text.rsplit(" ", 1)
        tgt = list(encode(" " + word))
        if not tgt or len(tgt) > block:
            continue
        seq = (list(encode(ctx)) + tgt)[-(block + 1):]
        if len(seq) < 2:
            continue
        x = seq[:-1]
        y = [-1] * (len(seq) - 1 - len(tgt)) + tgt
        examples.append((x, y))
        if limit is not None and len(examples) >= limit:
            break
    if not examples:
        raise EvalSkip("no usable LAMBADA example")
    out = []
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        t = max(len(x) for x, _ in chunk)
        xb = torch.zeros(len(chunk), t, dtype=torch.long)
        yb = torch.full((len(chunk), t), -1, dtype=torch.long)
        for j, (x, y) in enumerate(chunk):
            xb[j, : len(x)] = torch.tensor(x)
            yb[j, : len(y)] = torch.tensor(y)
        out.append((xb, yb))
    return out


# --- per-trial sets, cached across trials ------------------------------------------------


class EvalSources:
    """Builds a trial's EvalSets; texts, token streams and sets are shared between trials with
    the same data config, tokenizer and shapes."""

    def __init__(self, max_batches: int = 50) -> None:
        self.max_batches = max_batches
        self._docs: dict[str, list[str]] = {}
        self._tokens: dict[str, Any] = {}
        self._sets: dict[tuple, EvalSet] = {}

    # --- inputs ----------------------------------------------------------------------------
    def _token_data(self, cfg: Any):
        from workloads.data import DataError, load_tokens

        key = repr(cfg.data)
        if key not in self._tokens:
            try:
                self._tokens[key] = load_tokens(cfg.data)
            except DataError as e:
                raise EvalSkip(str(e)) from None
        return self._tokens[key]

    def _documents(self, ref: str) -> list[str]:
        if ref not in self._docs:
            if ref in HUB_SETS:
                try:
                    self._docs[ref] = _hub_rows(HUB_SETS[ref])
                except Exception as e:  # noqa: BLE001 - online but the load failed: skip it
                    msg = str(e).splitlines()[0][:200] if str(e) else ""
                    raise EvalSkip(f"{ref}: {type(e).__name__}: {msg}") from None
                if HUB_SETS[ref].kind == "lm":  # wikitext rows are lines: one document
                    self._docs[ref] = ["".join(self._docs[ref])]
            else:
                self._docs[ref] = list(_local_documents(ref))
        return self._docs[ref]

    @staticmethod
    def _tok_id(tokens: Any) -> str:
        return f"{tokens.tokenizer}:{tokens.meta.get('char_vocab') or ''}"

    def _encode(self, docs: list[str], tokens: Any, need: int) -> np.ndarray:
        """Documents -> one id stream of at least ``need`` ids when the text has them."""
        try:
            if tokens.tokenizer == "char":  # one character per token: cut the text first
                text = "\n".join(docs)
                return np.asarray(tokens.encode(text[:need] if need > 0 else text),
                                  dtype=np.int64)
            from workloads.data import EOT

            sep = tokens.encode(EOT)
            parts: list[int] = []
            for d in docs:
                if parts:
                    parts += sep
                parts += tokens.encode(d[: 16 * need] if need > 0 else d)
                if 0 < need <= len(parts):
                    break
            return np.asarray(parts, dtype=np.int64)
        except ValueError as e:  # char vocabulary: a character the trial never saw
            raise EvalSkip(f"not in the trial's tokenizer: {e}") from None

    # --- sets ------------------------------------------------------------------------------
    def own_split(self, cfg: Any) -> EvalSet:
        """The trial's held-out split: ``<corpus>-val`` or ``mnist-test``."""
        t, mb = cfg.train, self.max_batches
        if getattr(cfg.model, "arch", None) == "mlp":
            key = ("mnist-test", cfg.data.cache_dir, t.batch_size, mb)
            if key not in self._sets:
                from workloads.data import DataError, eval_array_batches, load_mnist

                try:
                    m = load_mnist(cache_dir=cfg.data.cache_dir)
                except DataError as e:
                    raise EvalSkip(str(e)) from None
                self._sets[key] = EvalSet("mnist-test", "classify",
                                          eval_array_batches(m.x_test, m.y_test, t.batch_size,
                                                             mb), "MNIST test split")
            return self._sets[key]
        from workloads.data import resolve_corpus

        tokens = self._token_data(cfg)
        name = f"{resolve_corpus(cfg.data.corpus).slug}-val"
        block = cfg.model.block_size
        key = (name, repr(cfg.data), t.batch_size, block, mb)
        if key not in self._sets:
            self._sets[key] = EvalSet(name, "lm", windows(tokens.val, t.batch_size, block, mb),
                                      f"{cfg.data.corpus} held-out split "
                                      f"(last {cfg.data.val_fraction:g})")
        return self._sets[key]

    def corpus(self, ref: str, cfg: Any) -> EvalSet:
        """A ``--corpus`` reference (local file or hub set) for this trial's tokenizer."""
        if getattr(cfg.model, "arch", None) == "mlp":
            raise EvalSkip("not a language model")
        tokens = self._token_data(cfg)
        t, mb, block = cfg.train, self.max_batches, cfg.model.block_size
        kind = HUB_SETS[ref].kind if ref in HUB_SETS else "lm"
        key = (ref, self._tok_id(tokens), t.batch_size, block, mb)
        if key not in self._sets:
            docs = self._documents(ref)
            if kind == "last_word":
                try:
                    batches = lambada_batches(docs, tokens.encode, t.batch_size, block, mb)
                except ValueError as e:
                    raise EvalSkip(f"not in the trial's tokenizer: {e}") from None
            else:
                need = mb * t.batch_size * block + 1 if mb > 0 else 0
                batches = windows(self._encode(docs, tokens, need), t.batch_size, block, mb)
            src = (f"{HUB_SETS[ref].path} ({HUB_SETS[ref].split})" if ref in HUB_SETS
                   else str(Path(ref).expanduser().resolve()))
            self._sets[key] = EvalSet(corpus_key(ref), kind, batches, src)
        return self._sets[key]
