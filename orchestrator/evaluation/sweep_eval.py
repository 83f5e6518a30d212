"""Held-out evaluation of a sweep's trials (``geosweep eval``).

Scores each selected trial's final checkpoint (orchestrator/store/checkpoints.py) on its own
held-out split, on every ``--corpus`` (a local .txt/.parquet file, ``wikitext-2``,
``lambada``) and, when the Hugging Face hub is reachable and ``--no-hub`` is not given, on
WikiText-2 and LAMBADA (orchestrator/evaluation/sets.py). Metrics
``eval/<corpus>/{loss,ppl,acc,tokens}`` (orchestrator/evaluation/scoring.py) go to the
trial's MLflow child run and to ``<parquet_root>/eval/sweep=S/trial=T.parquet``
(orchestrator/store/eval_table.py); ``geosweep report DIR --metric eval/<corpus>/loss`` then
compares arms on them.

Every input is checked before anything is evaluated or written; a bad one is one line, exit 2.
A trial stopped early by the scheduler (ASHA) is scored on its last checkpoint (its weights
when it stopped; the step is recorded). Diverged and failed trials are listed and skipped: their
last checkpoint predates the failure and is not the model the trial ended with.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.evaluation.corpora import HUB_SETS, EvalInputError, EvalSkip

__all__ = ["run_eval", "DEFAULT_MAX_BATCHES"]

DEFAULT_MAX_BATCHES = 50


def _sweep(root: Path) -> tuple[dict, str, str]:
    """sweep.json, the name and the Parquet root, every place eval writes checked to be
    inside the folder (orchestrator/store/targets.py: a symlinked mlflow.db or parquet/, a
    relative parquet_root that leads out)."""
    from orchestrator.store.manifest import sweep_targets
    from orchestrator.store.targets import FolderError

    try:
        t = sweep_targets(root)
        t.parquet_target("eval", f"sweep={t.name}")
    except FolderError as e:
        raise EvalInputError(str(e)) from None
    return t.manifest, t.name, t.parquet_root


def _hub_corpora(explicit: list[str], no_hub: bool, printer) -> list[str]:
    """Hub sets to score: the explicit ones (must be reachable) + the default ones if online."""
    from workloads.data import hub_offline_reason

    wanted = [c for c in explicit if c in HUB_SETS]
    if not wanted and no_hub:
        return []
    why = hub_offline_reason()
    if why and wanted:
        raise EvalInputError(f"--corpus {wanted[0]}: needs the Hugging Face hub, which is "
                             f"unreachable ({why}); use a local .txt/.parquet file offline")
    if why:
        printer(f"[geosweep] {', '.join(HUB_SETS)}: skipped (offline: {why})")
        return []
    return wanted or ([] if no_hub else list(HUB_SETS))


def _fmt(v: float | None, digits: int = 4) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return str(v)
    return f"{v:.{digits}f}" if abs(v) < 1e5 else f"{v:.3g}"


def _table(results: list[dict[str, Any]]) -> str:
    head = f"{'trial':<14} {'step':>7}  {'corpus':<18} {'loss':>8} {'ppl':>10} {'acc':>7} {'n':>8}"
    lines = [head, "-" * len(head)]
    for r in results:
        m = r["metrics"]
        n = m.get("tokens", m.get("samples"))
        lines.append(f"{r['trial']:<14} {r['step']:>7d}  {r['corpus']:<18} "
                     f"{_fmt(m.get('loss')):>8} {_fmt(m.get('ppl'), 2):>10} "
                     f"{_fmt(m.get('acc'), 3):>7} {int(n) if n is not None else '-':>8}")
    return "\n".join(lines)


def run_eval(sweep_dir: str | Path, trials: list[str] | None = None,
             corpora: list[str] | None = None, max_batches: int = DEFAULT_MAX_BATCHES,
             device: str = "auto", no_hub: bool = False, printer=print) -> list[dict[str, Any]]:
    """Evaluate the sweep's trials; rows ``{trial, corpus, step, metrics, checkpoint}``.

    Raises EvalInputError (one line) for a bad sweep folder, trial id or corpus, before any
    evaluation or write."""
    from orchestrator.evaluation.sets import EvalSources
    from orchestrator.store.eval_table import metric_key
    from orchestrator.store.runs import sweep_runs

    job = _inputs(sweep_dir, trials, corpora, max_batches, device, no_hub, printer)
    # MLflow is optional: the Parquet rows are always written
    job.client, job.runs = sweep_runs(job.root, job.manifest, job.name,
                                      _experiment(job.root), printer)
    sources = EvalSources(max_batches)
    results: list[dict[str, Any]] = []
    selected = job.table if not trials else job.table[job.table["trial"].astype(str).isin(trials)]
    for _, rec in selected.iterrows():
        results += _eval_trial(job, rec, sources, printer)
    if results:
        printer(_table(results))
        key = metric_key(results[0]["corpus"], "loss")
        printer(f"[geosweep] eval rows: {job.proot}/eval/sweep={job.name}/; compare arms with "
                f"`geosweep report {job.root} --metric {key}`")
    else:
        printer("[geosweep] no trial with a final checkpoint was evaluated")
    return results


def _experiment(root: Path) -> str | None:
    """The sweep's ``tracking.experiment`` (None: the sweep name, or no readable spec)."""
    if not (root / "spec.yaml").exists():
        return None
    from orchestrator.spec.sweep_spec import SpecError
    from orchestrator.spec.yaml_reader import load_spec

    try:
        return load_spec(str(root / "spec.yaml")).tracking.experiment
    except SpecError:
        return None


@dataclass
class _Job:
    root: Path
    manifest: dict
    name: str
    proot: str
    table: Any  # the sweep's trial records (pandas)
    refs: list[str]  # corpora to score besides each trial's own held-out split
    dev: Any  # torch device
    client: Any = None
    runs: dict[str, str] = field(default_factory=dict)


def _inputs(sweep_dir: str | Path, trials: list[str] | None, corpora: list[str] | None,
            max_batches: int, device: str, no_hub: bool, printer) -> _Job:
    """Every input checked before anything is evaluated or written (EvalInputError)."""
    from orchestrator.evaluation.corpora import check_corpus
    from orchestrator.store.parquet import read_trials
    from workloads.train import resolve_device

    root = Path(sweep_dir).expanduser().resolve()
    manifest, name, proot = _sweep(root)
    table = read_trials(proot, sweep=name)
    if table.empty:
        raise EvalInputError(f"{root}: no trial records for sweep {name!r} in {proot}")
    known = [str(t) for t in table["trial"]]
    for t in trials or []:
        if t not in known:
            raise EvalInputError(f"--trial: unknown trial {t!r}; trials are: {', '.join(known)}")
    if max_batches < 1:
        raise EvalInputError(f"--max-batches: must be >= 1, got {max_batches}")
    refs = list(dict.fromkeys(corpora or []))
    for ref in refs:
        check_corpus(ref)
    hub = _hub_corpora(refs, no_hub, printer)
    refs = [r for r in refs if r not in HUB_SETS] + hub
    try:
        dev = resolve_device(device)
    except RuntimeError as e:
        raise EvalInputError(f"--device: {e}") from None
    return _Job(root, manifest, name, proot, table, refs, dev)


def _eval_trial(job: _Job, rec: Any, sources: Any, printer) -> list[dict[str, Any]]:
    """Score one trial's final checkpoint on every set; write its rows (Parquet, MLflow)."""
    import pandas as pd

    from orchestrator.evaluation.scoring import evaluate
    from orchestrator.store.checkpoints import final_checkpoint
    from orchestrator.store.eval_table import eval_rows, log_eval_mlflow, metric_key, write_eval
    from orchestrator.store.weights import model_from_checkpoint

    tid, status = str(rec["trial"]), str(rec.get("status"))
    ckpt = final_checkpoint(job.root, tid) if status in ("completed", "stopped") else None
    if ckpt is None:
        detail = status
        if status == "diverged" and pd.notna(rec.get("divergence_step")):
            detail = f"diverged at step {int(rec['divergence_step'])}"
        printer(f"[geosweep] trial {tid}: {detail}, no final checkpoint: skipped")
        return []
    model, cfg, step = model_from_checkpoint(ckpt)
    model.to(job.dev)
    sets = []
    for ref in [None] + job.refs:  # None: the trial's own held-out split
        try:
            sets.append(sources.own_split(cfg) if ref is None else sources.corpus(ref, cfg))
        except EvalSkip as e:
            printer(f"[geosweep] trial {tid}: {ref or 'held-out split'} skipped ({e})")
    rows, logged, results = [], {}, []
    at = time.time()
    for es in sets:
        metrics = evaluate(model, es, job.dev)
        rows += eval_rows(tid, es.key, metrics, step, str(ckpt), at)
        logged.update({metric_key(es.key, k): v for k, v in metrics.items()})
        results.append({"trial": tid, "corpus": es.key, "step": step, "metrics": metrics,
                        "checkpoint": str(ckpt), "source": es.source})
    if not rows:
        return results
    write_eval(job.proot, job.name, tid, rows)
    if job.client is not None and tid in job.runs:
        try:
            with _quiet_mlflow_db():
                log_eval_mlflow(job.client, job.runs[tid], logged, step)
        except Exception as e:  # noqa: BLE001 - the Parquet rows are written already
            printer(f"[geosweep] trial {tid}: not logged to MLflow ({type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''})")
    elif job.client is not None:
        printer(f"[geosweep] trial {tid}: no MLflow child run found: Parquet only")
    return results


@contextlib.contextmanager
def _quiet_mlflow_db():
    """MLflow logs a failed SQL write (a full disk) with its whole traceback before raising;
    the caller prints the one line that matters."""
    log = logging.getLogger("mlflow.store.db.utils")
    old = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(old)
