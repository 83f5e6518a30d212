"""The Tune callback that feeds both sinks from the driver (the single writer of results).

It reads the underscore keys of the Tune result payload (docs/contracts.md): ``_curve``,
``_rows``, ``_status``, ``_divergence``, ``_node``, ``_timing``, ``_trial_params``, ``_arm``,
``_seed``. Per result: curve and metric parts to Parquet, batched metrics to MLflow, the
trial's record refreshed (Parquet ``trials`` is overwritten). At the end: the final record
and the MLflow child's end.

Final status:
- ``diverged``: the worker's last ``_status`` was diverged (reason/step from ``_divergence``);
- ``completed``: the worker said completed;
- ``stopped``: Tune completed the trial while the worker still said running (a scheduler such
  as ASHA stopped it early, or a stopper);
- ``failed``: ``on_trial_error``: an infrastructure failure (worker death, exception) after
  Tune's retries.

Restarts. A trial restarts from its last checkpoint at step ``s`` and re-reports steps
``s+1..`` when Tune recovers it (``on_trial_recover``, in-trial executor), when Ray Train
restarts its worker group (TorchTrainer executor: Tune never hears of it) or when a resumed
driver restores it. Whichever it was, the sign is the same: a result whose first curve step is not
above the last step already on disk. The Parquet sink then drops the lost segment
(``truncate_after(first - 1)``) before writing, so every step is on disk exactly once, and the
trial's ``retries`` counts the restart; MLflow keeps the first value per step (see
store/mlflow.py; on CPU a resumed run re-computes identical values).

Writes run on a background thread, so a result can still be queued when Tune saves its
experiment snapshot, which records each trial's latest checkpoint. ``get_state`` (called by
that save, before the snapshot reaches storage) waits for the queue: a checkpoint a resumed
driver restores from never lies past results that are not yet on disk. As a second guard, for
a driver killed between the two writes of one result (Parquet first, then MLflow) with the
trial's checkpoint at that step: on this driver's first MLflow write of a trial, the curve
already on disk goes with it and the at-most-once rule keeps only the points MLflow lacks: its
first result, or its end when it has none (a trial that finished before the crash and that
Tune re-starts after the resume ends at once).

Batching. Parquet gets every result's curve and metric parts when the writer takes it (a
restart is told by them). A running trial's record is written at its start and its end; a
result's refresh of it waits up to ``BATCH_S`` for company, as MLflow's points do: a later
result of the trial, or its end, which replaces it (a 5 s trial's record is then written 2-3
times instead of 4: the refresh of its last result goes with its end). A trial's first
record goes at once whatever wrote it, ``flush`` writes what waits. Tune's snapshot does not
wait for a refresh: a restored trial re-reports from its checkpoint on, and its record with
it (a final status never waits for one: Tune ends a trial, ``on_trial_complete``, before the
snapshot that records its last checkpoint). MLflow gets a trial's writes in batches: its
points (curves and scalars) of up to ``BATCH_S`` in one transaction (straight into the
sqlite tables of the sweep's own store: store/mlflow_metrics.py), its params and tags of up
to ``META_S`` in one ``log_batch``, everything left with its end. ``get_state`` writes every
batched point out first, ``flush`` everything. A trial shorter than ``META_S`` costs
MLflow's client 3 calls (create, one batch, end) instead of one per report plus 4; the UI
and ``geosweep status`` show a running trial's curves at most ``BATCH_S`` late, its params
at most ``META_S``.

A resumed driver ``preload``s the records already in Parquet, so a trial Tune only
re-finalises keeps its status and the sweep's result covers every trial. Works without Ray
running: every hook only needs ``trial.trial_id`` and ``trial.config``.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ray.tune import Callback

from orchestrator.spec.params import P_KEY
from orchestrator.store.parquet import ParquetSink
from orchestrator.store.run_names import TAG, reason, run_name
from orchestrator.sweep.curve_codec import unpack_curve
from orchestrator.sweep.space import flat_from_tune_config

if TYPE_CHECKING:  # MLflow is imported on the store's thread (orchestrator/sweep/mlflow_start.py)
    from orchestrator.store.mlflow import MlflowSink

__all__ = ["SinkCallback", "FINAL_STATUSES"]

log = logging.getLogger(__name__)

FINAL_STATUSES = ("completed", "diverged", "stopped", "failed")
# payload keys no one after this sink reads (the searcher and the scheduler have seen the
# result already; the progress line reads _status and _budget, the searcher's end _status)
_SINK_ONLY = ("_curve", "_rows", "_config", "_timing", "_trial_params", "_arm", "_seed", "_node",
              "_divergence", "_world_size")
_SEED_KEY = "train.seed"
# the longest a running trial's MLflow points and its Parquet record's refresh wait for
# company; Tune's experiment snapshot (every 2 s: cluster/local.py) writes the points out anyway
BATCH_S = 2.0
META_S = 10.0  # a running trial's MLflow params and tags (a resumed driver sends them again)
_SNAPSHOT = object()  # queue items: write out every MLflow point batched (get_state),
_EVERYTHING = object()  # and the params and tags too (flush)


def _scalars(result: dict) -> dict[str, float]:
    """Reported metric values: numeric keys with a '/' (``train/loss``, ``val/loss``)."""
    return {k: float(v) for k, v in result.items()
            if "/" in k and not k.startswith(("_", "config/"))
            and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _config_of(result: dict) -> dict[str, Any]:
    """The whole resolved workload config of a trial's first report (dotted keys), sent as
    JSON text so that Tune keeps no per-key statistics of it (orchestrator/sweep/worker.py);
    a dict is read as well."""
    cfg = result.get("_config")
    if isinstance(cfg, str):
        return json.loads(cfg)
    return dict(cfg or {})


def _error_text(trial: Any) -> str:
    """Last line of Tune's error file for the trial (the exception), if any."""
    path = getattr(trial, "error_file", None)
    try:
        with open(path) as f:
            lines = [line.strip() for line in f if line.strip()]
        return lines[-1][:2000] if lines else "error"
    except (OSError, TypeError):
        return "error"


class SinkCallback(Callback):
    """Tune callback writing every trial to Parquet and MLflow; keeps the trial records."""

    def __init__(
        self,
        parquet: ParquetSink | None = None,
        mlflow: MlflowSink | None = None,
        metric: str = "val/loss",
        sweep: str | None = None,
        clock: Callable[[], float] = time.time,
        background: bool = False,
        mlflow_later: Callable[[], MlflowSink] | None = None,
        batch_s: float = BATCH_S,
    ) -> None:
        self.parquet, self.mlflow, self.metric, self.clock = parquet, mlflow, metric, clock
        # mlflow_later: the MLflow sink still being built (its store's schema migrations run
        # while Tune starts the first trials); the first event that writes waits for it. If
        # it fails, the events go on to Parquet alone and the next hook raises its error.
        self._mlflow_later = mlflow_later
        self._mlflow_error: BaseException | None = None
        # background=True: hooks only enqueue; one writer thread does the I/O, so a slow
        # MLflow/Parquet write never stalls Tune's event loop (and with it every trial).
        self.background = background
        self.batch_s = batch_s  # background only: how long a running trial's writes batch
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._now: float | None = None
        self.sweep = sweep or (parquet.sweep if parquet else mlflow.sweep if mlflow else None)
        self._records: dict[str, dict[str, Any]] = {}
        self._resumed: set[str] = set()
        self._seen: set[str] = set()
        self._tagged: dict[str, dict[str, Any]] = {}  # MLflow tags already set per trial
        self._caught_up: set[str] = set()  # trials whose on-disk curve this driver sent MLflow
        # trial id -> its MLflow writes not made yet (results, params, tags; writer thread)
        self._mlflow_buf: dict[str, dict[str, Any]] = {}
        self._written: set[str] = set()  # trials whose record this driver wrote (writer thread)
        # trial id -> since when (monotonic) a refresh of its record waits to be written
        self._due: dict[str, float] = {}
        # queued writer events per trial that end by writing its record (all but restore):
        # while a later one is queued, an earlier one skips its write (it would be replaced)
        self._pending: dict[str, int] = {}
        self._lock = threading.Lock()

    # --- public ---------------------------------------------------------------------------
    def records(self) -> list[dict[str, Any]]:
        """The latest record of every trial seen (TRIAL_SCHEMA fields + params + scalars)."""
        self.flush()
        return [copy.deepcopy(self._records[k]) for k in sorted(self._records)]

    def preload(self, records: list[dict[str, Any]]) -> None:
        """Records of trials an earlier driver of this sweep already wrote (resume/extend)."""
        for rec in records:
            rec = copy.deepcopy(rec)
            rec.setdefault("params", {})
            rec.setdefault("scalars", {})
            self._records[str(rec["trial"])] = rec

    def seen(self) -> set[str]:
        """Trials a Tune hook of this driver touched (preloaded ones excluded)."""
        self.flush()
        return set(self._seen)

    def abandon(self, trial_id: str, error: str) -> None:
        """End a preloaded trial that this driver's Tune never ran as ``failed``: a driver crash
        lost it before Tune's experiment snapshot held it, and the searcher re-proposed its slot
        (its rows stay, marked by ``error``)."""
        trial = SimpleNamespace(trial_id=trial_id, config={})
        self._defer(self._do_abandon, trial, error) or self._do_abandon(trial, error)

    def _do_abandon(self, trial: Any, error: str) -> None:
        rec = self._record(trial)
        rec["error"] = error
        if self.mlflow is not None:  # find the child again so that it can be ended
            self.mlflow.start_child(trial.trial_id, rec["params"], self._tags(rec),
                                    name=run_name(rec["params"]))
        self._finish(trial, "failed")

    def flush(self) -> None:
        """Wait until every queued write is done; re-raise the first writer error."""
        self._wait_writes()
        self._check_mlflow()
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"result sink failed: {err!r}") from err

    def on_experiment_end(self, trials: list, **info) -> None:
        self.flush()

    def get_state(self) -> None:
        """Tune's experiment snapshot (``TuneController.save_to_dir``) calls this after it has
        captured the trials' checkpoints and before the snapshot is synced to storage: wait
        until every queued write is on disk, so a checkpoint a resumed driver restores from
        never lies past results still in the writer's queue (a ``kill -9`` would lose them,
        and the restored trial never re-reports them). Errors are left to the next hook."""
        self._wait_writes(everything=False)

    def _wait_writes(self, everything: bool = True) -> None:
        """Wait for every event queued so far; then for the MLflow points batched (and with
        ``everything``, the params and tags too)."""
        if self._queue is not None:
            self._queue.put(_EVERYTHING if everything else _SNAPSHOT)
            self._queue.join()

    # --- background writer ----------------------------------------------------------------
    def __getstate__(self) -> dict:  # Tune pickles callbacks: threads and queues stay behind
        state = dict(self.__dict__)
        state.update(_queue=None, _thread=None, _error=None, _pending={}, _lock=None,
                     _mlflow_later=None, _mlflow_error=None, _caught_up=set(), _mlflow_buf={},
                     _written=set(), _due={})
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _check_mlflow(self) -> None:
        """A sink whose MLflow store could not be built fails the sweep (Tune stops at once)."""
        if self._mlflow_error is not None:
            err = self._mlflow_error
            raise RuntimeError(f"the MLflow store could not be built: {err!r}") from err

    def _resolve_mlflow(self) -> None:
        """Before an event's writes (on the writer thread): the MLflow sink, once built."""
        if self._mlflow_later is None:
            return
        later, self._mlflow_later = self._mlflow_later, None
        try:
            self.mlflow = later()
        except BaseException as e:  # noqa: BLE001 - raised by the next hook / flush
            log.error("geosweep result sink: the MLflow store: %r", e)
            self._mlflow_error = e

    def _defer(self, fn: Callable[..., None], trial: Any, *args: Any) -> bool:
        """Run ``fn(snapshot, *args)`` on the writer thread; False when not in background."""
        self._check_mlflow()
        if not self.background:
            return False
        if self._queue is None:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._drain, name="geosweep-sink",
                                            daemon=True)
            self._thread.start()
        snap = SimpleNamespace(trial_id=trial.trial_id, config=dict(trial.config or {}),
                               error_file=getattr(trial, "error_file", None))
        writes = fn is not self._do_trial_restore
        if writes:
            with self._lock:
                self._pending[trial.trial_id] = self._pending.get(trial.trial_id, 0) + 1
        self._queue.put((fn, snap, args, self.clock(), writes))
        return True

    def _drain(self) -> None:
        while True:
            try:  # idle with writes waiting: write them out once they are due
                item = self._queue.get(timeout=self._idle_s())
            except queue.Empty:
                self._guarded(self._mlflow_flush, True)
                self._guarded(self._records_flush, True)
                continue
            if item is _SNAPSHOT or item is _EVERYTHING:
                self._guarded(self._mlflow_flush, False, item is _EVERYTHING)
                if item is _EVERYTHING:
                    self._guarded(self._records_flush, False)
                self._queue.task_done()
                continue
            fn, snap, args, now, writes = item
            try:
                self._now = now  # timestamps are those of the Tune event, not of the write
                self._guarded(fn, snap, *args)
                self._guarded(self._mlflow_flush, True)
                self._guarded(self._records_flush, True)
            finally:
                self._now = None
                if writes:
                    with self._lock:
                        self._pending[snap.trial_id] -= 1
                self._queue.task_done()

    def _idle_s(self) -> float | None:
        """How long the idle writer waits for an event: until the first record refresh is due,
        at most ``batch_s`` while MLflow batches wait, for ever when nothing waits."""
        waits = [self.batch_s] if self._mlflow_buf else []
        if self._due:
            waits.append(max(0.0, min(self._due.values()) + self.batch_s - time.monotonic()))
        return min(waits) if waits else None

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - reported by flush()
            log.error("geosweep result sink: %r", e)
            self._error = self._error or e

    # --- MLflow batches -------------------------------------------------------------------
    def _mlflow_add(self, tid: str, result: tuple[list[dict], list[tuple]] | None = None,
                    params: dict | None = None, tags: dict | None = None) -> None:
        """Queue MLflow writes of a trial (written at once when not in background)."""
        now = time.monotonic()
        buf = self._mlflow_buf.setdefault(tid, {"results": [], "params": {}, "tags": {},
                                                "since": None, "meta_since": None})
        if result is not None:
            buf["results"].append(result)
            buf["since"] = buf["since"] or now
        if params or tags:
            buf["params"].update(params or {})
            buf["tags"].update(tags or {})
            buf["meta_since"] = buf["meta_since"] or now
        if not self.background:
            self._mlflow_flush(False, True, tid)

    def _mlflow_take(self, tid: str) -> dict[str, Any]:
        return self._mlflow_buf.pop(tid, None) or {"results": [], "params": {}, "tags": {}}

    def _mlflow_flush(self, due_only: bool, meta: bool = False, tid: str | None = None) -> None:
        """Write out what is batched, one ``log_results`` per trial (of ``tid`` only, when
        given): every trial's points (``due_only``: those waiting ``batch_s``), and with them
        its params and tags when ``meta`` or once they waited ``META_S``. Points are what a
        restored checkpoint can be past (Tune's snapshot writes them out); params and tags a
        resumed driver sends again, so they wait for company longer."""
        now = time.monotonic()
        for t in [tid] if tid is not None else list(self._mlflow_buf):
            buf = self._mlflow_buf.get(t)
            if buf is None:
                continue
            points = buf["since"] is not None and not (due_only
                                                       and now - buf["since"] < self.batch_s)
            with_meta = buf["meta_since"] is not None and (
                meta or now - buf["meta_since"] >= META_S)
            if not (points or with_meta):
                continue
            results = buf["results"] if points else []
            params = buf["params"] if with_meta else {}
            tags = buf["tags"] if with_meta else {}
            if points:
                buf.update(results=[], since=None)
            if with_meta:
                buf.update(params={}, tags={}, meta_since=None)
            if buf["since"] is None and buf["meta_since"] is None:
                self._mlflow_buf.pop(t)
            self.mlflow.log_results(t, results, params=params, tags=tags)

    def _time(self) -> float:
        return self._now if self._now is not None else self.clock()

    # --- Tune hooks -----------------------------------------------------------------------
    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info) -> None:
        self._defer(self._do_trial_start, trial) or self._do_trial_start(trial)

    def _do_trial_start(self, trial: Any) -> None:
        rec = self._record(trial)
        if rec["status"] not in ("completed", "diverged"):  # else: a finished trial re-started
            rec["status"] = "running"                       # by a resume; it keeps its outcome
        if self.mlflow is not None:  # named by its arm: searched params + seed
            # the run now (its name, identity tags); params and tags with its first batch
            self.mlflow.start_child(trial.trial_id, {}, {}, name=run_name(rec["params"]))
            self._mlflow_add(trial.trial_id, params=rec["params"], tags=self._tags(rec))
        self._write(rec)

    def on_trial_restore(self, iteration: int, trials: list, trial: Any, **info) -> None:
        self._defer(self._do_trial_restore, trial) or self._do_trial_restore(trial)

    def _do_trial_restore(self, trial: Any) -> None:
        self._resumed.add(trial.trial_id)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info) -> None:
        self._defer(self._do_trial_recover, trial) or self._do_trial_recover(trial)

    def _do_trial_recover(self, trial: Any) -> None:
        rec = self._record(trial)
        rec["retries"] = (rec.get("retries") or 0) + 1
        rec["error"] = _error_text(trial)
        self._resumed.add(trial.trial_id)
        self._write(rec)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info) -> None:
        mine = dict(result)  # the writer's copy: Tune goes on with the result meanwhile
        self._strip(result)  # Tune's copy (callbacks may change it: Tune's own note)
        self._defer(self._do_trial_result, trial, mine) or self._do_trial_result(trial, mine)

    def _strip(self, result: dict) -> None:
        """Leave in Tune's copy of a result what Tune's parts and the progress line read: the
        objective (``self.metric``), ``step`` and the status keys. The payload keys and the
        reported ``a/b`` scalars go: Tune keeps the result as the trial's last result, seven
        statistics of every numeric key (nested dicts flattened) per trial, and encodes both
        into every experiment snapshot; the sink has its own copy of them."""
        for key in _SINK_ONLY:
            result.pop(key, None)
        for key in [k for k in result if "/" in k and k != self.metric]:
            del result[key]

    def on_trial_save(self, iteration: int, trials: list, trial: Any, **info) -> None:
        """A result that carried a checkpoint reaches Tune a second time: the trial's ``save``
        returns it whole, and Tune keeps it beside the checkpoint (the trial's checkpoint
        manager), re-encoded into every experiment snapshot while the checkpoint is kept.
        It is stripped as the result was (``_strip``): with the per-step curve it was most of
        a trial's snapshot (2.4 ms per trial and snapshot for a 550-step gpt-debug trial
        against 1.6 without the curve, measured), and the sink has had the result already."""
        kept = getattr(trial, "latest_checkpoint_result", None)
        metrics = getattr(kept, "metrics", None)
        if not isinstance(metrics, dict):
            return
        size = len(metrics)
        self._strip(metrics)
        if len(metrics) == size:
            return
        for invalidate in (getattr(trial, "invalidate_json_state", None),
                           getattr(getattr(trial, "run_metadata", None), "invalidate_cache",
                                   None)):
            if invalidate is not None:
                invalidate()

    def _do_trial_result(self, trial: Any, result: dict) -> None:
        tid = trial.trial_id
        rec = self._record(trial)
        curve, rows = unpack_curve(result.get("_curve")), result.get("_rows") or []
        self._update(rec, result, curve)
        # The curve has the train loss of every step since the last report, so its first step
        # tells a restart; a repeated report of the same step (rows only) is not one.
        if self.parquet is not None and curve:
            first = min(int(p["step"]) for p in curve)
            last = self.parquet.last_step(tid)
            if last is not None and first <= last:  # a restart: drop the lost segment
                self.parquet.truncate_after(tid, first - 1)
                if tid not in self._resumed:  # Tune did not see it (a Train worker restart)
                    rec["retries"] = (rec.get("retries") or 0) + 1
            self._resumed.discard(tid)
        backlog = self._mlflow_backlog(tid)  # read before this report's points are on disk
        if self.parquet is not None:
            self.parquet.write_curve(tid, curve)
            self.parquet.write_metrics(tid, rows)
        if self.mlflow is not None:
            step = int(result.get("step", rec.get("last_step") or 0))
            # rows live in Parquet only: their summaries are reported scalars (``cont/*``), so
            # MLflow and Parquet ``trials/`` share one vocabulary (docs/metrics.md §N). The
            # points, the whole resolved config (first report of a trial only) and the tags
            # that changed: into the trial's next batch (one transaction).
            tags = self._new_tags(tid, self._tags(rec))
            self._mlflow_add(tid, (backlog + curve, [(_scalars(result), step)]),
                             params=_config_of(result), tags=tags)
            self._tagged[tid].update(tags)
        self._write(rec, refresh=True)

    def _mlflow_backlog(self, tid: str) -> list[dict]:
        """On this driver's first MLflow write of a trial: its curve already in Parquet (a
        crash between a result's Parquet and MLflow writes lost those points in MLflow only;
        see the module docstring). Later writes, or no MLflow: nothing."""
        if self.mlflow is None or self.parquet is None or tid in self._caught_up:
            return []
        self._caught_up.add(tid)
        return self.parquet.curve_points(tid)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info) -> None:
        self._defer(self._do_trial_complete, trial) or self._do_trial_complete(trial)

    def _do_trial_complete(self, trial: Any) -> None:
        rec = self._record(trial)
        status = rec["status"] if rec["status"] in ("completed", "diverged") else "stopped"
        self._finish(trial, status)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info) -> None:
        self._defer(self._do_trial_error, trial) or self._do_trial_error(trial)

    def _do_trial_error(self, trial: Any) -> None:
        self._record(trial)["error"] = _error_text(trial)
        self._finish(trial, "failed")

    # --- records --------------------------------------------------------------------------
    def _record(self, trial: Any) -> dict[str, Any]:
        self._resolve_mlflow()  # every event that writes reads its record first
        tid = trial.trial_id
        self._seen.add(tid)
        if tid not in self._records:
            params = flat_from_tune_config(dict(getattr(trial, "config", None) or {}))
            self._records[tid] = {
                "trial": tid, "sweep": self.sweep, "status": "running", "params": params,
                "scalars": {}, "seed": params.get(_SEED_KEY), "retries": 0,
                "started_at": self._time(),
            }
        return self._records[tid]

    def _update(self, rec: dict, result: dict, curve: list[dict]) -> None:
        if result.get("_trial_params"):
            rec["params"] = dict(result["_trial_params"])
        for src, dst in (("_arm", "arm"), ("_seed", "seed"), ("_node", "node")):
            if result.get(src) is not None:
                rec[dst] = result[src]
        if result.get("_timing"):
            rec["timing"] = dict(result["_timing"])
            rec["timing_json"] = json.dumps(rec["timing"])
        if result.get("_status"):
            rec["status"] = result["_status"]
        div = result.get("_divergence")
        if div:
            rec["divergence_reason"] = div.get("reason")
            rec["divergence_step"] = div.get("step")
            rec["divergence_detail"] = div.get("detail")
        if "step" in result:
            rec["last_step"] = int(result["step"])
        scalars = _scalars(result)
        rec["scalars"].update(scalars)
        if self.metric in result:
            rec["objective"] = float(result[self.metric])
        rec["final_train_loss"] = rec["scalars"].get("train/loss")
        rec["final_val_loss"] = rec["scalars"].get("val/loss")
        vals = [p["value"] for p in curve if p.get("split") == "val" and p.get("metric") == "loss"]
        vals += [scalars["val/loss"]] if "val/loss" in scalars else []
        vals += [rec["best_val_loss"]] if rec.get("best_val_loss") is not None else []
        finite = [float(v) for v in vals if math.isfinite(v)]
        rec["best_val_loss"] = min(finite) if finite else None

    def _finish(self, trial: Any, status: str) -> None:
        rec = self._record(trial)
        # a trial finished before a driver crash and re-finalised after the resume keeps its times
        again = rec.get("ended_at") is not None and rec["status"] == status
        rec["status"] = status
        if not again:
            rec["ended_at"] = self._time()
        rec["wall_s"] = rec["ended_at"] - rec["started_at"]
        timing = rec.get("timing") or {}
        rec["train_s"] = timing.get("train_s")
        rec["setup_s"] = timing.get("setup_s")
        rec["overhead_s"] = rec["wall_s"] - rec["train_s"] if rec["train_s"] is not None else None
        if self.parquet is not None:
            # counted once here (its curve is complete on disk, this thread wrote it), so a
            # report of 1,000 trials reads no curves for its spike column
            from orchestrator.analysis.fast_spikes import recorded_spikes

            steps, losses = self.parquet.train_loss_curve(trial.trial_id)
            rec["spikes"], rec["spikes_rule"] = recorded_spikes(losses, steps)
        self._write(rec)
        if self.mlflow is not None:
            # a trial this driver never wrote to MLflow (resumed, it ended without a result:
            # the crash fell after its last points reached Parquet and before this end, which
            # carries its last batch): its curve on disk goes with the end, and the
            # at-most-once rule keeps only the points MLflow lacks
            backlog = self._mlflow_backlog(trial.trial_id)
            buf = self._mlflow_take(trial.trial_id)  # its last results go with its end
            if backlog:
                buf["results"].insert(0, (backlog, []))
            tags = {**buf["tags"], **self._tags(rec)}
            tags.update({f"{TAG}best_val_loss": rec.get("best_val_loss"),
                         f"{TAG}wall_s": rec["wall_s"], f"{TAG}overhead_s": rec["overhead_s"],
                         f"{TAG}error": rec.get("error") if status == "failed" else None,
                         f"{TAG}reason": reason(rec, status)})
            self.mlflow.end_child(trial.trial_id, status, tags, results=buf["results"],
                                  params=buf["params"])

    def _write(self, rec: dict, refresh: bool = False) -> None:
        """The trial's Parquet record; ``refresh``: a running trial's update, which in
        background waits up to ``batch_s`` for a later one or the trial's end (written by
        ``_records_flush``), unless the trial has no record from this driver yet."""
        if self.parquet is None:
            return
        tid = rec["trial"]
        with self._lock:
            later = self._pending.get(tid, 0) > 1
        if later:
            return  # a queued event of this trial writes (or refreshes) the newer record soon
        if refresh and self.background and tid in self._written:
            self._due.setdefault(tid, time.monotonic())
            return
        self._due.pop(tid, None)
        self.parquet.write_trial(rec)
        self._written.add(tid)

    def _records_flush(self, due_only: bool) -> None:
        """Write the refreshed records that wait (``due_only``: those waiting ``batch_s``)."""
        now = time.monotonic()
        for tid, since in list(self._due.items()):
            if due_only and now - since < self.batch_s:
                continue
            del self._due[tid]
            self.parquet.write_trial(self._records[tid])

    # --- MLflow tags ----------------------------------------------------------------------
    def _tags(self, rec: dict) -> dict[str, Any]:
        tags = {f"{TAG}status": rec["status"], f"{TAG}arm": rec.get("arm"),
                f"{TAG}seed": rec.get("seed"), f"{TAG}p": rec["params"].get(P_KEY),
                f"{TAG}node": rec.get("node"), f"{TAG}retries": rec.get("retries")}
        if rec.get("divergence_reason"):
            tags[f"{TAG}divergence.reason"] = rec["divergence_reason"]
            tags[f"{TAG}divergence.step"] = rec.get("divergence_step")
            tags[f"{TAG}divergence.detail"] = rec.get("divergence_detail")
        return {k: v for k, v in tags.items() if v is not None}

    def _new_tags(self, tid: str, tags: dict[str, Any]) -> dict[str, Any]:
        """Only the tags that changed since the last result (the caller logs them, then adds
        them to ``_tagged``)."""
        done = self._tagged.setdefault(tid, {})
        return {k: v for k, v in tags.items() if done.get(k) != v}
