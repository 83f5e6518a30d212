"""A folder of outputs replaced whole, never half (``geosweep report``'s ``report/``).

``staged_folder(final)`` yields a fresh folder beside ``final`` (``.<name>.tmp-<id>``) to
write every output into; when the block ends normally the new folder takes ``final``'s
place (the old one is renamed aside, then deleted), and when it raises (a bug, a full disk,
Ctrl-C) the new folder is deleted and ``final`` is left as it was. A reader sees the old
outputs or the new ones, never a mix; a crash between the two renames leaves the old outputs
as ``.<name>.old-<id>`` and the new ones complete.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["staged_folder", "write_text_atomic"]


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists() or p.is_symlink():
        p.unlink()


@contextmanager
def staged_folder(final: str | os.PathLike) -> Iterator[Path]:
    """A new folder for ``final``'s outputs, swapped in whole when the block succeeds."""
    final = Path(final)
    tag = uuid.uuid4().hex[:12]
    tmp = final.with_name(f".{final.name}.tmp-{tag}")
    tmp.mkdir()
    try:
        yield tmp
    except OSError as e:  # named by the place the user knows, not the temporary folder
        _remove(tmp)
        name = str(e.filename or "")
        if name.startswith(str(tmp)):
            raise OSError(e.errno, e.strerror, str(final) + name[len(str(tmp)):]) from None
        raise
    except BaseException:
        _remove(tmp)
        raise
    for attempt in range(5):  # another report swapping at the same moment: try again
        old = final.with_name(f".{final.name}.old-{tag}-{attempt}")
        try:
            os.replace(final, old)
        except FileNotFoundError:
            old = None  # nothing there yet
        try:
            os.replace(tmp, final)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or attempt == 4:
                _remove(tmp)
                raise
            continue
        finally:
            if old is not None:
                _remove(old)
        return


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """``path`` written under a temporary name and renamed: never half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
