"""The one redaction of secrets in what geosweep prints, logs or records: every error line and
output line of the CLI (``orchestrator.cli.main`` writes through ``RedactingStream``), the Ray
Jobs texts (cluster/jobs.py), MLflow params, tags and the spec it logs (orchestrator/store).

What is a secret here:

- the userinfo of a URL: ``http://user:pw@host`` -> ``http://user:***@host``; a lone token as
  user (``https://TOKEN@host``) -> ``https://***@host``;
- the value of a query parameter named like a credential (``?token=``, ``access_token``,
  ``password``, ``secret``, ``api_key``, ``sig``, ``X-Amz-Signature``, ...);
- the credentials of an ``Authorization: Bearer|Basic|token ...`` header;
- the value of every environment variable whose name says it holds one (``*TOKEN*``,
  ``*PASSWORD*``, ``*SECRET*``, ``*_KEY``, ``*CREDENTIALS*``) and Ray's auth token file
  (``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``), wherever they appear.

Pure text in, text out; it imports nothing of geosweep (cluster/ imports nothing of
orchestrator/, orchestrator/ imports this).
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["redact", "redact_url", "ray_auth_token", "known_secrets", "RedactingStream",
           "MASK"]

MASK = "***"
# scheme://[user[:password]@]host: the userinfo is everything up to the last '@' before the
# host's first '/', '?' or '#' (a password may hold '@' and ':' but not '/')
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<info>[^\s/?#@'\"<>]*"
                       r"(?:@[^\s/?#@'\"<>]*)*)@")
_QUERY = re.compile(r"(?P<key>[?&;](?:[A-Za-z0-9_\-]*?)(?:token|password|passwd|pwd|secret|"
                    r"api[_-]?key|apikey|access[_-]?key|signature|sig|credential)s?=)"
                    r"(?P<value>[^&#\s'\"]+)", re.IGNORECASE)
_AUTH_HEADER = re.compile(r"(?P<key>\b(?:authorization|proxy-authorization)['\"]?\s*[:=]\s*['\"]?"
                          r"(?:bearer|basic|token|digest)?\s*)(?P<value>[^\s'\",}]+)",
                          re.IGNORECASE)
# names of variables that hold a credential (GITHUB_TOKEN, MLFLOW_TRACKING_PASSWORD,
# AWS_SECRET_ACCESS_KEY, HF_TOKEN); not TOKENIZERS_PARALLELISM, nor where one is kept
# (RAY_AUTH_TOKEN_PATH: a path is no secret, and masking it would blank paths in messages)
_SECRET_NAME = re.compile(r"(^|_)(TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIALS?|API_?KEY|KEY)S?($|_)",
                          re.IGNORECASE)
_NOT_SECRET = re.compile(r"_(PATH|FILE|DIR|MODE|TYPE|ID|NAME|URL|URI|HOST|PORT)$", re.IGNORECASE)
_MIN_SECRET = 6  # shorter values ("1", "true") are no secret worth masking everywhere


def _mask_info(m: re.Match) -> str:
    info = m["info"]
    user, sep, _password = info.partition(":")
    if sep:  # user:password -> user:***
        return f"{m['scheme']}{user}:{MASK}@"
    return f"{m['scheme']}{MASK}@"  # a lone user part is a token more often than a name


def redact_url(url: str) -> str:
    """``url`` without the secrets it carries (userinfo, credential query parameters)."""
    return redact(url, secrets=())


def redact(text: Any, secrets: tuple[str, ...] | None = None) -> str:
    """``text`` (str() of it) with every secret replaced by ``***``. ``secrets``: the known
    secret values to mask (default: ``known_secrets()``, from the environment)."""
    s = text if isinstance(text, str) else str(text)
    if not s:
        return s
    for value in known_secrets() if secrets is None else secrets:
        if value in s:
            s = s.replace(value, MASK)
    if "://" in s and "@" in s:
        s = _USERINFO.sub(_mask_info, s)
    if "=" in s:
        s = _QUERY.sub(lambda m: m["key"] + MASK, s)
    if ":" in s or "=" in s:
        s = _AUTH_HEADER.sub(lambda m: m["key"] + MASK, s)
    return s


# --- the secrets this process knows --------------------------------------------------------

def _token_files() -> list[Path]:
    out = []
    for c in (os.environ.get("RAY_AUTH_TOKEN_PATH", ""), "~/.ray/auth_token"):
        if c:
            out.append(Path(c).expanduser())
    return out


def ray_auth_token() -> str | None:
    """Ray's auth token, looked up the way Ray looks it up (``RAY_AUTH_TOKEN``, the file named
    by ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``); None when there is none."""
    tok = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if tok:
        return tok
    for p in _token_files():
        try:
            if p.is_file():
                tok = p.read_text().strip()
                if tok:
                    return tok
        except (OSError, UnicodeDecodeError):
            continue
    return None


_CACHE: dict[str, Any] = {"key": None, "secrets": ()}


def _cache_key() -> tuple:
    env = tuple(sorted((k, v) for k, v in os.environ.items()
                       if _SECRET_NAME.search(k) and not _NOT_SECRET.search(k)))
    stats = []
    for p in _token_files():
        try:
            st = p.stat()
            stats.append((str(p), st.st_mtime_ns, st.st_size))
        except OSError:
            stats.append((str(p), None, None))
    return env, tuple(stats)


def known_secrets() -> tuple[str, ...]:
    """Secret values of this process: the environment's credential variables and Ray's token,
    longest first (a token that contains another is masked whole). Re-read when the
    environment or the token file changes (``ray start`` writes the file mid-run)."""
    key = _cache_key()
    if key != _CACHE["key"]:
        values = {v.strip() for k, v in key[0] if len(v.strip()) >= _MIN_SECRET}
        tok = ray_auth_token()
        if tok and len(tok) >= _MIN_SECRET:
            values.add(tok)
        _CACHE.update(key=key, secrets=tuple(sorted(values, key=len, reverse=True)))
    return _CACHE["secrets"]


# --- a stream that redacts what is written through it ---------------------------------------

class RedactingStream(io.TextIOBase):
    """A text stream writing ``redact()`` of every line to ``inner``. Whole lines are redacted
    (a secret is never split between two writes); a partial line waits for its newline or a
    ``flush()``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._pending = ""

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        text = self._pending + s
        head, sep, tail = text.rpartition("\n")
        if sep:
            self.inner.write(redact(head + sep))
        self._pending = tail
        return len(s)

    def flush(self) -> None:
        if self._pending:
            self.inner.write(redact(self._pending))
            self._pending = ""
        self.inner.flush()

    def isatty(self) -> bool:
        try:
            return bool(self.inner.isatty())
        except (AttributeError, ValueError):  # no such method, or closed
            return False

    @property
    def closed(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.inner, "closed", False))

    def fileno(self) -> int:
        return self.inner.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.inner, "encoding", "utf-8")

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.inner, "errors", None)

    def __getattr__(self, name: str) -> Any:  # buffer, mode, name, reconfigure...
        return getattr(self.inner, name)
