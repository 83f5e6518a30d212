"""Corpus references of ``geosweep eval --corpus`` and their checks (no torch: the CLI imports it).

A reference is ``wikitext-2`` or ``lambada`` (``HUB_SETS``, through ``datasets``) or a local
``.txt`` / ``.parquet`` file; ``corpus_key`` names it in metric keys ``eval/<key>/<metric>``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HUB_SETS", "TEXT_COLUMNS", "HubSet", "EvalInputError", "EvalSkip", "corpus_key",
           "text_column", "check_corpus"]

TEXT_COLUMNS = ("text", "content", "document")


@dataclass(frozen=True)
class HubSet:
    path: str
    name: str | None
    split: str
    kind: str  # lm | last_word


HUB_SETS: dict[str, HubSet] = {
    "wikitext-2": HubSet("Salesforce/wikitext", "wikitext-2-raw-v1", "test", "lm"),
    "lambada": HubSet("EleutherAI/lambada_openai", "default", "test", "last_word"),
}


class EvalInputError(ValueError):
    """A bad ``--corpus`` (missing file, unreadable Parquet, no text column): one line."""


class EvalSkip(Exception):
    """A set that does not apply to one trial (why, in one line); the others still run."""


# --- corpus references -------------------------------------------------------------------


def corpus_key(ref: str) -> str:
    """The name of a corpus in metric keys: hub name, or a local file's stem."""
    if ref in HUB_SETS:
        return ref
    return re.sub(r"[^A-Za-z0-9_-]+", "_", Path(ref).stem)[:60] or "corpus"


def text_column(path: str | os.PathLike) -> str:
    """The text column of a Parquet corpus (the first of TEXT_COLUMNS it has)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.ParquetFile(path).schema_arrow
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise EvalInputError(f"--corpus: {path} is not a readable Parquet file "
                             f"({type(e).__name__})") from None
    names = schema.names
    for c in TEXT_COLUMNS:
        if c in names:
            t = schema.field(c).type
            if pa.types.is_dictionary(t):
                t = t.value_type
            if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
                raise EvalInputError(f"--corpus: {path}: column {c!r} holds {t}, not text "
                                     "(a string column is needed)")
            return c
    raise EvalInputError(f"--corpus: {path} has no text column (one of "
                         f"{', '.join(TEXT_COLUMNS)}; columns: {', '.join(names) or 'none'})")


def check_corpus(ref: str) -> None:
    """Raise EvalInputError unless ``ref`` is a hub set name or a usable local file."""
    if ref in HUB_SETS:
        return
    p = Path(ref).expanduser()
    suffix = p.suffix.lower()
    if suffix not in (".txt", ".parquet"):
        raise EvalInputError(f"--corpus: {ref!r} is not one of {', '.join(HUB_SETS)} or a "
                             "local .txt/.parquet file")
    if not p.is_file():
        raise EvalInputError(f"--corpus: file not found: {ref}")
    if suffix == ".parquet":
        text_column(p)
    else:
        _check_utf8(p, ref)


def _check_utf8(p: Path, ref: str) -> None:
    """The whole file decodes (it is read whole later; a bad byte after the first block was
    a traceback mid-evaluation). Streamed: memory stays one block."""
    import codecs

    dec = codecs.getincrementaldecoder("utf-8")()
    at = 0
    with open(p, "rb") as f:
        while True:
            block = f.read(1 << 20)
            try:
                dec.decode(block, final=not block)
            except UnicodeDecodeError as e:
                raise EvalInputError(f"--corpus: {ref} is not UTF-8 text (byte {at + e.start}: "
                                     f"{block[e.start:e.start + 1]!r}); convert it with iconv"
                                     ) from None
            if not block:
                return
            at += len(block)
