"""Where ``geosweep eval`` results go: the sweep's Parquet dataset and each trial's MLflow run.

Parquet: ``<parquet_root>/eval/sweep=S/trial=T.parquet``, one row per (corpus, metric)::

    trial string, corpus string, metric string, value double, step int64, n_tokens int64,
    checkpoint string, evaluated_at double (unix seconds)

Written to a temporary name and renamed (never half-written). Evaluating a trial again
replaces its rows for the corpora evaluated now and keeps the others: no duplicates.

MLflow: metrics ``eval/<corpus>/<metric>`` on the trial's child run at ``step`` = the
checkpoint's training step; a point already logged with the same step and value is skipped.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

__all__ = ["EVAL_SCHEMA", "metric_key", "eval_rows", "write_eval", "read_eval", "eval_wide",
           "attach_metric", "log_eval_mlflow"]

EVAL_SCHEMA = pa.schema([
    ("trial", pa.string()), ("corpus", pa.string()), ("metric", pa.string()),
    ("value", pa.float64()), ("step", pa.int64()), ("n_tokens", pa.int64()),
    ("checkpoint", pa.string()), ("evaluated_at", pa.float64()),
])
_SAFE = re.compile(r"^[A-Za-z0-9_.\-]+$")  # as the Parquet sink's partition values
_COUNTS = ("tokens", "samples")  # the metric holding n_tokens for the rows of a corpus


def metric_key(corpus: str, metric: str) -> str:
    return f"eval/{corpus}/{metric}"


def eval_rows(trial: str, corpus: str, metrics: dict[str, float], step: int,
              checkpoint: str, evaluated_at: float | None = None) -> list[dict[str, Any]]:
    """Tidy rows of one (trial, corpus) evaluation."""
    n = next((int(metrics[k]) for k in _COUNTS if k in metrics), None)
    at = time.time() if evaluated_at is None else evaluated_at
    return [{"trial": trial, "corpus": corpus, "metric": m, "value": float(v), "step": int(step),
             "n_tokens": n, "checkpoint": str(checkpoint), "evaluated_at": at}
            for m, v in metrics.items()]


def _folder(root: str, sweep: str) -> tuple[pafs.FileSystem, str]:
    from orchestrator.store.parquet import resolve_root

    fs, base = resolve_root(root)
    return fs, f"{base}/eval/sweep={sweep}"


def write_eval(root: str, sweep: str, trial: str, rows: list[dict[str, Any]]) -> str:
    """Merge ``rows`` into the trial's eval file (same corpus + metric replaced); its path."""
    for what, v in (("sweep", sweep), ("trial", trial)):
        if not _SAFE.match(v):
            raise ValueError(f"{what}={v!r}: use letters, digits, '_', '-', '.' only")
    fs, folder = _folder(root, sweep)
    path = f"{folder}/trial={trial}.parquet"
    new = pa.Table.from_pylist([{f.name: r.get(f.name) for f in EVAL_SCHEMA} for r in rows],
                               schema=EVAL_SCHEMA)
    if fs.get_file_info(path).type == pafs.FileType.File:
        with fs.open_input_file(path) as f:
            old = pq.read_table(f).select(EVAL_SCHEMA.names).cast(EVAL_SCHEMA)
        fresh = set(zip(new["corpus"].to_pylist(), new["metric"].to_pylist()))
        keep = [k not in fresh for k in zip(old["corpus"].to_pylist(), old["metric"].to_pylist())]
        new = pa.concat_tables([old.filter(pa.array(keep, type=pa.bool_())), new])
    new = new.sort_by([("corpus", "ascending"), ("metric", "ascending")])
    fs.create_dir(folder, recursive=True)
    tmp = f"{folder}/_trial={trial}.parquet.tmp-{uuid.uuid4().hex[:12]}"
    try:
        pq.write_table(new, tmp, filesystem=fs)
        fs.move(tmp, path)
    except BaseException:
        try:
            fs.delete_file(tmp)
        except OSError:
            pass
        raise
    return path


def read_eval(root: str, sweep: str | None = None) -> pd.DataFrame:
    """All eval rows (EVAL_SCHEMA columns + sweep); empty frame when none were written."""
    from orchestrator.store.parquet import resolve_root

    fs, base = resolve_root(root)
    folder = f"{base}/eval"
    cols = EVAL_SCHEMA.names + ["sweep"]
    if fs.get_file_info(folder).type != pafs.FileType.Directory:
        return pd.DataFrame(columns=cols)
    part = ds.partitioning(pa.schema([("sweep", pa.string())]), flavor="hive")
    schema = pa.unify_schemas([EVAL_SCHEMA, pa.schema([("sweep", pa.string())])])
    dset = ds.dataset(folder, format="parquet", filesystem=fs, partitioning=part, schema=schema)
    filt = None if sweep is None else ds.field("sweep") == sweep
    return dset.to_table(filter=filt).to_pandas()


def eval_wide(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per trial, one column per ``eval/<corpus>/<metric>``."""
    if rows.empty:
        return pd.DataFrame({"trial": pd.Series(dtype=str)})
    keys = "eval/" + rows["corpus"].astype(str) + "/" + rows["metric"].astype(str)
    wide = rows.assign(key=keys).pivot_table(index="trial", columns="key", values="value",
                                             aggfunc="last")
    wide.columns.name = None
    return wide.reset_index()


_NOT_METRICS = frozenset({"trial", "arm", "status", "seed", "sweep", "params",
                          "divergence_reason", "divergence_step"})


def attach_metric(trials: pd.DataFrame, parquet_root: str, sweep: str,
                  metric: str) -> pd.DataFrame:
    """``trials`` with a numeric column ``metric``: an existing column (``final_val_loss``,
    ``best_val_loss``, ``val/loss``, ...) or an eval metric read from the eval Parquet.
    Raises ValueError (one line, naming the valid choices) for an unknown metric."""
    if metric in trials.columns:
        # a label or identity column is no metric: coercing it would blank it (status, arm)
        # and a report "comparing" seeds or trial ids would be nonsense written over the last
        values = pd.to_numeric(trials[metric], errors="coerce")
        if metric in _NOT_METRICS or (values.isna().all() and trials[metric].notna().any()):
            raise ValueError(f"--metric: {metric!r} is not a numeric per-trial value; use "
                             "final_val_loss, best_val_loss or eval/<corpus>/<metric>")
        out = trials.copy()
        out[metric] = values
        return out
    wide = eval_wide(read_eval(parquet_root, sweep))
    if metric not in wide.columns:
        have = sorted(c for c in wide.columns if c != "trial")
        hint = (", ".join(have) if have else "none yet: run `geosweep eval DIR` first")
        raise ValueError(f"--metric: {metric!r} is neither a trial column nor an eval metric "
                         f"(eval metrics: {hint})")
    out = trials.drop(columns=[c for c in wide.columns if c != "trial" and c in trials.columns])
    out = out.merge(wide[["trial", metric]].astype({"trial": str}), on="trial", how="left")
    out[metric] = pd.to_numeric(out[metric], errors="coerce")
    return out


def log_eval_mlflow(client: Any, run_id: str, metrics: dict[str, float], step: int) -> int:
    """Log ``{key: value}`` at ``step``; skip points already there (same step and value)."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    batch = []
    for key, value in metrics.items():
        hist = client.get_metric_history(run_id, key)
        if any(m.step == step and _same(m.value, value) for m in hist):
            continue
        batch.append(Metric(key, float(value), now, int(step)))
    if batch:
        client.log_batch(run_id, metrics=batch)
    return len(batch)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))
