"""The Parquet dataset of a sweep: one writer (the driver), any pyarrow filesystem as root.

Layout (hive-partitioned; ``sweep`` and ``trial`` come from the path, not the file)::

    <root>/curves/sweep=S/trial=T/part-<first step:08d>-<last step:08d>.parquet
    <root>/metrics/sweep=S/trial=T/part-<first step:08d>-<last step:08d>.parquet
    <root>/trials/sweep=S/trial=T.parquet            (one row, has a ``trial`` column)

Schemas (see docs/parquet_schema.md):

- curves: ``step int64, split string, metric string, value double, wall_time double``
- metrics: ``step int64, metric string, module string, layer int64, next_layer int64,
  value double``
- trials: ``TRIAL_SCHEMA`` (fixed columns) followed by the trial's params as dotted columns
  (``optim.lr``, ``model.residual.p``; bool/int64/double/string, lists and dicts as JSON
  strings) and its last reported scalars as slash columns (``val/loss``, ``train/loss``).
  Param columns differ between trials (conditional params): readers unify schemas.

Atomicity: every file is written to ``_<name>.tmp-<uuid>`` in the same folder and then
renamed (``fs.move``). The temp name starts with ``_`` (ignored by pyarrow.dataset) and does
not end in ``.parquet`` (ignored by ``read_parquet('.../*.parquet')`` globs), so readers never
see a half-written file, even after a crash.

Exactly-once steps: a curve/metrics row is keyed by all its columns but ``value`` and
``wall_time``. Writing rows whose keys already exist replaces the old rows (the parts that
overlap the new step range are merged and rewritten). When a trial resumes from a checkpoint
at step ``s``, ``truncate_after(trial, s)`` drops every row with step > s (the lost
segment), so the resumed run's rows appear exactly once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from orchestrator.store.part_types import PartError, conform, mismatch, raise_bad_part
from orchestrator.store.run_names import run_name

__all__ = [
    "ParquetSink",
    "CURVE_SCHEMA",
    "METRIC_SCHEMA",
    "TRIAL_SCHEMA",
    "read_curves",
    "read_metrics",
    "read_trials",
    "read_trial_records",
    "resolve_root",
    "PartError",
]

CURVE_SCHEMA = pa.schema(
    [("step", pa.int64()), ("split", pa.string()), ("metric", pa.string()),
     ("value", pa.float64()), ("wall_time", pa.float64())]
)
METRIC_SCHEMA = pa.schema(
    [("step", pa.int64()), ("metric", pa.string()), ("module", pa.string()),
     ("layer", pa.int64()), ("next_layer", pa.int64()), ("value", pa.float64())]
)
TRIAL_SCHEMA = pa.schema(
    [
        ("trial", pa.string()),
        # the trial's name, the same in MLflow (its run name), status, report and here
        # (store/run_names.py: searched params + seed, ``p=2 lr=3e-3 s0``)
        ("name", pa.string()),
        ("status", pa.string()),  # running | completed | stopped | diverged | failed
        ("arm", pa.string()),
        ("seed", pa.int64()),
        ("last_step", pa.int64()),
        ("objective", pa.float64()),  # last value of the searcher metric (penalty if diverged)
        ("final_train_loss", pa.float64()),
        ("final_val_loss", pa.float64()),
        ("best_val_loss", pa.float64()),
        ("divergence_reason", pa.string()),
        ("divergence_step", pa.int64()),
        ("divergence_detail", pa.string()),
        ("started_at", pa.float64()),  # unix seconds (driver clock)
        ("ended_at", pa.float64()),
        ("wall_s", pa.float64()),  # ended_at - started_at, seen from the driver
        ("train_s", pa.float64()),  # from the worker's _timing
        ("setup_s", pa.float64()),
        ("overhead_s", pa.float64()),  # wall_s - train_s: orchestration cost
        ("timing_json", pa.string()),  # the full _timing dict
        ("node", pa.string()),
        ("retries", pa.int64()),
        ("error", pa.string()),
        # loss-spike episodes of the train loss curve, counted when the trial ended, and the
        # rule they were counted with (analysis/fast_spikes.py): the report reads no curves
        # for them when its rule is the same
        ("spikes", pa.int64()),
        ("spikes_rule", pa.string()),
    ]
)
_KINDS = {"curves": CURVE_SCHEMA, "metrics": METRIC_SCHEMA}
_PART = re.compile(r"^part-(\d{8,})-(\d{8,})\.parquet$")
_SAFE = re.compile(r"^[A-Za-z0-9_.\-]+$")
# A trial record is one row, rewritten while its trial runs: Parquet's per-column statistics,
# dictionary pages and compression buy nothing for one value a column and were ~40% of a
# record's write (37 columns: 1.5 -> 0.95 ms, measured); pyarrow, pandas and DuckDB read the
# file the same either way (tests/orchestrator/store/test_parquet.py).
_RECORD_OPTIONS: dict[str, Any] = {"write_statistics": False, "use_dictionary": False,
                                   "compression": "none"}
_PARTITIONING = {
    "curves": pa.schema([("sweep", pa.string()), ("trial", pa.string())]),
    "metrics": pa.schema([("sweep", pa.string()), ("trial", pa.string())]),
    "trials": pa.schema([("sweep", pa.string())]),
}


def resolve_root(root: str) -> tuple[pafs.FileSystem, str]:
    """A local path (relative is fine) or any pyarrow URI (file://, s3://, gs://, ...)."""
    if "://" not in root:
        root = os.path.abspath(root)
    fs, path = pafs.FileSystem.from_uri(root)
    return fs, path.rstrip("/")


def _check_name(kind: str, value: str) -> str:
    if not _SAFE.match(value):
        raise ValueError(f"{kind}={value!r}: use letters, digits, '_', '-', '.' only")
    return value


class ParquetSink:
    """Writes the curves, metric rows and trial records of one sweep."""

    def __init__(self, root: str, sweep: str) -> None:
        self.root = root
        self.sweep = _check_name("sweep", sweep)
        self.fs, self._base = resolve_root(root)
        # (kind, trial) -> {file name: (first step, last step)}; this process is the only writer
        self._parts: dict[tuple[str, str], dict[str, tuple[int, int]]] = {}
        # trial -> {step: train loss} of the curves this sink wrote, for trials whose curve
        # folder held nothing when it first looked (their whole curve is then in memory)
        self._losses: dict[str, dict[int, float]] = {}
        # folders this sink made (create_dir is a request per write on an object store)
        self._dirs: set[str] = set()
        # trial -> digest of the record row this sink last wrote to its file: an identical
        # record is not written again (a resumed trial re-finalised, a start that changes nothing)
        self._trial_digest: dict[str, bytes] = {}

    # --- public ---------------------------------------------------------------------------
    def write_curve(self, trial_id: str, points: list[dict]) -> None:
        """Append curve points ``{step, split, metric, value, wall_time}``."""
        self._write_rows("curves", trial_id, points)
        losses = self._losses.get(trial_id)
        if losses is not None:
            for p in points:
                if p.get("split") == "train" and p.get("metric") == "loss":
                    v = p.get("value")
                    losses[int(p["step"])] = float("nan") if v is None else float(v)

    def write_metrics(self, trial_id: str, rows: list[dict]) -> None:
        """Append tidy metric rows ``{step, metric, module, layer, next_layer, value}``."""
        self._write_rows("metrics", trial_id, rows)

    def truncate_after(self, trial_id: str, step: int) -> None:
        """Drop every curve/metrics row of the trial with step > ``step`` (a resumed trial)."""
        losses = self._losses.get(trial_id)
        if losses is not None:
            for k in [k for k in losses if k > step]:
                del losses[k]
        for kind in _KINDS:
            parts = self._list_parts(kind, trial_id)
            for name, (first, last) in sorted(parts.items()):
                if last <= step:
                    continue
                if first <= step:
                    table = self._read(kind, trial_id, name)
                    keep = table.filter(pc.less_equal(table["step"], step))
                    self._write_part(kind, trial_id, keep)
                self._delete(kind, trial_id, name)

    def train_losses(self, trial_id: str) -> list[float]:
        """The trial's train loss curve on disk, in step order (missing values as NaN)."""
        return self.train_loss_curve(trial_id)[1]

    def train_loss_curve(self, trial_id: str) -> tuple[list[int], list[float]]:
        """``(steps, losses)`` of the trial's train loss curve on disk, in step order (missing
        values as NaN); kept in memory for a trial whose every curve part this sink wrote (no
        read back)."""
        losses = self._losses.get(trial_id)
        if losses is not None:
            steps = sorted(losses)
            return steps, [losses[s] for s in steps]
        t = self._curve_table(trial_id)
        t = t.filter(pc.and_(pc.equal(t["split"], "train"), pc.equal(t["metric"], "loss")))
        return ([int(s) for s in t["step"].to_pylist()],
                [float("nan") if v is None else float(v) for v in t["value"].to_pylist()])

    def curve_points(self, trial_id: str) -> list[dict]:
        """The trial's curve on disk, in step order, as the points ``write_curve`` takes
        (missing values as NaN): what a resumed driver re-sends to MLflow (sweep/callback.py)."""
        points = self._curve_table(trial_id).to_pylist()
        for p in points:
            p["value"] = float("nan") if p["value"] is None else float(p["value"])
        return points

    def _curve_table(self, trial_id: str) -> pa.Table:
        _check_name("trial", trial_id)
        parts = sorted(self._list_parts("curves", trial_id))
        if not parts:
            return CURVE_SCHEMA.empty_table()
        t = pa.concat_tables([self._read("curves", trial_id, n) for n in parts])
        return t.sort_by([("step", "ascending")])

    def last_step(self, trial_id: str) -> int | None:
        """The highest step of the trial's curve/metrics rows on disk (None: no rows yet)."""
        lasts = [b for kind in _KINDS for _, b in self._list_parts(kind, trial_id).values()]
        return max(lasts) if lasts else None

    def write_trial(self, record: dict[str, Any]) -> bool:
        """Write (or overwrite) the one-row record of a trial; False when the row is the one
        this sink last wrote to the trial's file (nothing is written then).

        ``record`` holds ``TRIAL_SCHEMA`` fields (missing ones are null), ``params`` (flat or
        nested dict -> dotted columns) and ``scalars`` (last reported values -> their keys).
        """
        trial = _check_name("trial", str(record["trial"]))
        if not record.get("name"):  # as the MLflow child is named (store/run_names.py)
            record = {**record, "name": run_name(record.get("params") or {})}
        row = _trial_row(record)
        # repr tells 1 from 1.0 and True, -0.0 from 0.0, and reads NaN as NaN: equal digests,
        # equal files (the types are in the row too)
        digest = hashlib.blake2b(repr(row).encode(), digest_size=16).digest()
        if self._trial_digest.get(trial) == digest:
            return False
        table = pa.table({name: pa.array([value], type=typ) for name, typ, value in row})
        folder = f"{self._base}/trials/sweep={self.sweep}"
        self._atomic_write(table, folder, f"trial={trial}.parquet", _RECORD_OPTIONS)
        self._trial_digest[trial] = digest
        return True

    # --- parts ----------------------------------------------------------------------------
    def _folder(self, kind: str, trial_id: str) -> str:
        return f"{self._base}/{kind}/sweep={self.sweep}/trial={trial_id}"

    def _list_parts(self, kind: str, trial_id: str) -> dict[str, tuple[int, int]]:
        key = (kind, trial_id)
        if key not in self._parts:
            sel = pafs.FileSelector(self._folder(kind, trial_id), allow_not_found=True)
            found = {}
            for info in self.fs.get_file_info(sel):
                m = _PART.match(info.base_name)
                if m and info.type == pafs.FileType.File:
                    found[info.base_name] = (int(m.group(1)), int(m.group(2)))
            self._parts[key] = found
            if kind == "curves" and not found:  # from here on, every part is this sink's
                self._losses[trial_id] = {}
        return self._parts[key]

    def _write_rows(self, kind: str, trial_id: str, rows: list[dict]) -> None:
        _check_name("trial", trial_id)
        if not rows:
            return
        schema = _KINDS[kind]
        # column by column (one list per field): the same table as from_pylist of the rows
        # restricted to the schema, at ~1/8 of its CPU on a trial's per-step curve
        new = pa.table([pa.array([r.get(f.name) for r in rows], type=f.type) for f in schema],
                       schema=schema)
        first, last = pc.min_max(new["step"]).values()
        first, last = first.as_py(), last.as_py()
        overlapped = [n for n, (a, b) in self._list_parts(kind, trial_id).items()
                      if b >= first and a <= last]
        if overlapped:
            old = pa.concat_tables([self._read(kind, trial_id, n) for n in overlapped])
            new = pa.concat_tables([_drop_keys(old, new, kind), new])
        name = self._write_part(kind, trial_id, new)
        for n in overlapped:
            if n != name:
                self._delete(kind, trial_id, n)

    def _write_part(self, kind: str, trial_id: str, table: pa.Table) -> str | None:
        if table.num_rows == 0:
            return None
        table = table.sort_by([("step", "ascending")])
        first, last = table["step"][0].as_py(), table["step"][-1].as_py()
        name = f"part-{first:08d}-{last:08d}.parquet"
        self._atomic_write(table, self._folder(kind, trial_id), name)
        self._list_parts(kind, trial_id)[name] = (first, last)
        return name

    def _read(self, kind: str, trial_id: str, name: str) -> pa.Table:
        # through a file handle: no hive partition columns are added from the path
        with self.fs.open_input_file(f"{self._folder(kind, trial_id)}/{name}") as f:
            return pq.read_table(f).select(_KINDS[kind].names).cast(_KINDS[kind])

    def _delete(self, kind: str, trial_id: str, name: str) -> None:
        self.fs.delete_file(f"{self._folder(kind, trial_id)}/{name}")
        self._list_parts(kind, trial_id).pop(name, None)

    def _atomic_write(self, table: pa.Table, folder: str, name: str,
                      options: dict[str, Any] | None = None) -> None:
        # the folder is made once per sink (create_dir is a request per write on an object
        # store); one removed since (by hand) is made again and the write tried once more
        fresh = folder not in self._dirs
        if fresh:
            self.fs.create_dir(folder, recursive=True)
            self._dirs.add(folder)
        tmp = f"{folder}/_{name}.tmp-{uuid.uuid4().hex[:12]}"
        try:
            pq.write_table(table, tmp, filesystem=self.fs, **(options or {}))
            self.fs.move(tmp, f"{folder}/{name}")
        except FileNotFoundError:
            self._delete_quietly(tmp)
            self._dirs.discard(folder)
            if fresh:
                raise
            self._atomic_write(table, folder, name, options)
        except BaseException:
            self._delete_quietly(tmp)
            raise

    def _delete_quietly(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except OSError:
            pass


# --- row helpers ----------------------------------------------------------------------------
def _drop_keys(old: pa.Table, new: pa.Table, kind: str) -> pa.Table:
    """Rows of ``old`` whose key (all columns but value/wall_time) is not in ``new``."""
    keys = [f.name for f in _KINDS[kind] if f.name not in ("value", "wall_time")]
    seen = set(zip(*(new[k].to_pylist() for k in keys)))
    mask = [k not in seen for k in zip(*(old[k].to_pylist() for k in keys))]
    return old.filter(pa.array(mask, type=pa.bool_()))


def _flatten(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _clean(value: Any, typ: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_string(typ):
        return value if isinstance(value, str) else json.dumps(value, default=str)
    if pa.types.is_integer(typ):
        return int(value)
    return float(value)


def _trial_row(record: dict[str, Any]) -> list[tuple[str, pa.DataType, Any]]:
    """The record's columns as (name, type, value): ``TRIAL_SCHEMA``, then the params (dotted)
    and the slash scalars in name order (a scalar wins over a param of the same name)."""
    row = [(f.name, f.type, _clean(record.get(f.name), f.type)) for f in TRIAL_SCHEMA]
    extra = dict(_flatten(record.get("params") or {}))
    extra.update({k: v for k, v in (record.get("scalars") or {}).items() if "/" in k})
    fixed = set(TRIAL_SCHEMA.names)
    row += [(key, *_extra_value(extra[key])) for key in sorted(extra) if key not in fixed]
    return row


def _extra_value(value: Any) -> tuple[pa.DataType, Any]:
    """One param/scalar: bool, int64, double or string (containers as JSON)."""
    if value is None:
        return pa.null(), None
    if isinstance(value, bool):
        return pa.bool_(), value
    if isinstance(value, int):
        return pa.int64(), value
    if isinstance(value, float):
        return pa.float64(), value
    if isinstance(value, str):
        return pa.string(), value
    try:  # numpy scalars
        return _extra_value(value.item())
    except AttributeError:
        return pa.string(), json.dumps(value, default=str)


# --- readers --------------------------------------------------------------------------------
def _dataset(root: str, kind: str, schema: pa.Schema | None,
             categorical: bool = False) -> ds.Dataset | None:
    """One dataset over all the kind's files (each footer is read once: the unified schema of
    the trials is taken from the same fragments that are then scanned)."""
    fs, base = resolve_root(root)
    folder = f"{base}/{kind}"
    if fs.get_file_info(folder).type != pafs.FileType.Directory:
        return None
    # categorical: sweep/trial as dictionaries (one string per file, not per row) and the
    # string columns read as dictionaries (as written): no per-row Python strings in pandas
    part = ds.partitioning(_PARTITIONING[kind], flavor="hive",
                           dictionaries="infer" if categorical else None)
    fmt: Any = "parquet"
    if categorical and schema is not None:
        strings = [f.name for f in schema if pa.types.is_string(f.type)]
        fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(
            dictionary_columns=strings))
    keys = _PARTITIONING[kind]
    if schema is not None and categorical:
        # the first file's types (dictionary keys need an inferring partitioning, which
        # cannot take an explicit schema); the other files are cast to them while scanning
        return ds.dataset(folder, format=fmt, filesystem=fs, partitioning=part)
    if schema is not None:  # curves/metrics: the files hold these columns (maybe large_string)
        schema = pa.unify_schemas([schema, keys])
        return ds.dataset(folder, format=fmt, filesystem=fs, partitioning=part, schema=schema)
    # trials: param columns differ between files; the same fragments (footers read once)
    # are scanned under their unified schema
    dset = ds.dataset(folder, format=fmt, filesystem=fs, partitioning=part)
    frags = list(dset.get_fragments())
    phys = [f.physical_schema for f in frags]
    if not phys:
        return None
    schema = pa.unify_schemas(phys + [keys], promote_options="permissive")
    return ds.FileSystemDataset(frags, schema, dset.format, filesystem=fs)


# A live sweep's writer replaces files while a reader (status --watch, report, resume checks)
# scans them: a fragment whose footer was read before the rename is then read from the new
# file (thrift "Invalid data"), or a merged part is deleted between listing and reading
# (FileNotFoundError). Each write is atomic, so a fresh listing is consistent again: such a
# scan is retried on a fresh dataset. A file that fails on every try is really broken, and the
# last error is raised (the CLI turns it into one line).
_SCAN_TRIES = 4
_SCAN_BACKOFF_S = 0.1


def _read(root: str, kind: str, sweep: str | None, schema: pa.Schema | None,
          where: ds.Expression | None = None, columns: list[str] | None = None,
          categorical: bool = False) -> pd.DataFrame:
    names = list((schema or TRIAL_SCHEMA).names) + list(_PARTITIONING[kind].names)
    filt = None if sweep is None else ds.field("sweep") == sweep
    if where is not None:
        filt = where if filt is None else filt & where
    for attempt in range(_SCAN_TRIES):
        try:
            dset = _dataset(root, kind, schema, categorical)
            if dset is None:
                return pd.DataFrame(columns=columns or names)
            table = dset.to_table(filter=filt, columns=columns)
            break
        except (OSError, pa.ArrowInvalid):
            if attempt == _SCAN_TRIES - 1:
                _bad_part(root, kind)
                raise
            time.sleep(_SCAN_BACKOFF_S * 2 ** attempt)
        except pa.ArrowException:  # a type no cast reaches (a list where a number goes)
            _bad_part(root, kind)
            raise
    want = schema or TRIAL_SCHEMA
    if mismatch(table.schema, want):  # the first part's types (the categorical read)
        try:  # numbers written as text read as numbers, as a scan under the schema does
            table = conform(table, want)
        except pa.ArrowException:
            _bad_part(root, kind)
            raise
    return table.to_pandas(strings_to_categorical=categorical)


def _bad_part(root: str, kind: str) -> None:
    """PartError naming the first part of ``kind`` of the wrong column types, if there is one."""
    fs, base = resolve_root(root)
    raise_bad_part(fs, f"{base}/{kind}", kind, _KINDS.get(kind, TRIAL_SCHEMA))


def read_curves(root: str, sweep: str | None = None, *, metric: str | None = None,
                trials: list[str] | None = None, columns: list[str] | None = None,
                categorical: bool = False) -> pd.DataFrame:
    """All curve points (columns of CURVE_SCHEMA + sweep, trial). ``metric``: only its rows
    (filtered while scanning); ``trials``: only theirs (the others' files are not opened);
    ``columns``: only those; ``categorical``: string columns (split, metric, sweep, trial)
    as pandas categoricals, far cheaper on long curves."""
    where = None if metric is None else ds.field("metric") == metric
    if trials is not None:
        by_trial = ds.field("trial").isin([str(t) for t in trials])
        where = by_trial if where is None else where & by_trial
    return _read(root, "curves", sweep, CURVE_SCHEMA, where, columns, categorical)


def read_metrics(root: str, sweep: str | None = None) -> pd.DataFrame:
    """All metric rows (columns of METRIC_SCHEMA + sweep, trial)."""
    return _read(root, "metrics", sweep, METRIC_SCHEMA)


def read_trials(root: str, sweep: str | None = None) -> pd.DataFrame:
    """One row per trial: TRIAL_SCHEMA columns, param and scalar columns, sweep. ``name`` is
    filled from the params where a dataset written before the column lacks it."""
    df = _read(root, "trials", sweep, None)
    if len(df) and ("name" not in df.columns or df["name"].isna().any()):
        fixed = set(TRIAL_SCHEMA.names) | {"sweep"}
        params = [c for c in df.columns if c not in fixed and "/" not in c]
        derived = [run_name({k: _param(r[k]) for k in params if _py(r[k]) is not None})
                   for r in df.to_dict("records")]
        have = df["name"] if "name" in df.columns else pd.Series(None, index=df.index)
        df["name"] = have.where(have.notna(), pd.Series(derived, index=df.index))
    return df


def read_trial_records(root: str, sweep: str) -> list[dict[str, Any]]:
    """The trial records of ``sweep`` as ``ParquetSink.write_trial`` took them (a resumed
    driver starts from these): TRIAL_SCHEMA fields, ``params`` (dotted columns) and
    ``scalars`` (slash columns); a param absent from a trial (conditional) is left out."""
    df = read_trials(root, sweep)
    fixed = set(TRIAL_SCHEMA.names) | {"sweep"}
    out = []
    for row in df.to_dict("records"):
        rec: dict[str, Any] = {k: _py(row.get(k)) for k in TRIAL_SCHEMA.names}
        rec["sweep"] = sweep
        rec["params"] = {k: _param(v) for k, v in row.items()
                         if k not in fixed and "/" not in k and _py(v) is not None}
        rec["scalars"] = {k: float(v) for k, v in row.items()
                          if "/" in k and _py(v) is not None}
        if rec.get("timing_json"):
            rec["timing"] = json.loads(rec["timing_json"])
        rec["retries"] = rec.get("retries") or 0
        out.append(rec)
    return out


def _py(v: Any) -> Any:
    """pandas' missing values (NaN, NaT, None) -> None; numpy scalars -> Python."""
    if v is None or (isinstance(v, float) and v != v):
        return None
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
        return None if isinstance(v, float) and v != v else v
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    return v


def _param(v: Any) -> Any:
    """Param columns hold lists/dicts as JSON strings (``_extra_value``): decode those."""
    v = _py(v)
    if isinstance(v, str) and v[:1] in "[{":
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v
