"""The column types of a Parquet part, checked: a part geosweep did not write (a text
``step``, an integer ``status``, a list where a split goes) is one line naming the file
(``PartError``), where pyarrow or pandas failed with a traceback; numbers written as text
are read as numbers (``conform``), as a scan under the schema casts them."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

__all__ = ["PartError", "mismatch", "conform", "raise_bad_part"]


class PartError(ValueError):
    """A Parquet part whose columns are not what geosweep writes (a text ``step``, an integer
    ``status``): one line naming the file (the CLI: exit 2)."""


def _family(t: pa.DataType) -> str:
    """What a column holds, as far as reading it goes: numbers, text or other."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_null(t):
        return "null"
    return str(t)


def mismatch(found: pa.Schema, want: pa.Schema) -> tuple[str, pa.DataType] | None:
    """The first column of ``want`` that ``found`` holds as another family (text for a
    number, a number for text), or None."""
    for f in want:
        i = found.get_field_index(f.name)
        if i < 0:
            continue
        got = found.field(i).type
        if _family(got) not in (_family(f.type), "null"):
            return f.name, got
    return None


def raise_bad_part(fs: pafs.FileSystem, folder: str, kind: str, want: pa.Schema) -> None:
    """Raise PartError naming the first part under ``folder`` whose columns are of the wrong
    kind (read footer by footer: only after a scan failed); return if none is."""
    try:
        files = sorted(ds.dataset(folder, format="parquet", filesystem=fs).files)
    except (OSError, pa.ArrowException):
        return
    for path in files:
        try:
            with fs.open_input_file(path) as f:
                found = pq.read_schema(f)
        except (OSError, pa.ArrowException) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
            raise PartError(f"{path}: not a readable Parquet file ({first}); delete the broken "
                            "part (its trial's rows are then missing) or restore it") from None
        bad = mismatch(found, want)
        if bad:
            raise PartError(f"{path}: column {bad[0]!r} is {bad[1]}, a {kind} part holds "
                            f"{want.field(bad[0]).type}; delete the broken part (its trial's "
                            "rows are then missing) or restore it")


def conform(table: pa.Table, want: pa.Schema) -> pa.Table:
    """``table`` with every column of ``want`` that it holds as another family cast to it."""
    for f in want:
        i = table.schema.get_field_index(f.name)
        if i < 0 or _family(table.schema.field(i).type) in (_family(f.type), "null"):
            continue
        col = table.column(i)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        table = table.set_column(i, f.name, col.cast(f.type))
    return table
