"""MLflow writer of one sweep: a parent run per sweep, a child run per trial.

One writer per sweep, living in the driver process (Ray Train V2 rejects Tune's MLflow logger
and nested runs from workers are buggy, see docs/platform.md). Only ``MlflowClient`` is used, so
nothing depends on MLflow's global active-run state.

Resumable and idempotent: the parent is found again by its tag ``geosweep.sweep`` (+ role
``parent``), a child by ``geosweep.trial_id``, so a resumed driver never duplicates a run.
Metric points are written at most once per (trial, key, step): a point whose step is not
above the last step already logged for that key is skipped (MLflow cannot delete metric
points, so a resumed trial's re-run steps keep the first value; on CPU they are equal).

Keys: curve points ``{split, metric}`` -> ``<split>/<metric>``, scalars by their name, both
through ``mlflow_names.mlflow_key`` (the loss curves are ``Loss/train``, ``Loss/val``: the first
charts in MLflow's UI; docs/metrics.md §N); params are flattened with dotted keys,
stringified, truncated to 6000 characters. Infinite values are not logged to MLflow (it would
store them as 1.797e308); Parquet keeps them.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from operator import itemgetter
from typing import Any

from mlflow.entities import Metric, Param, RunTag

from cluster.redact import known_secrets, redact
from orchestrator.store.mlflow_metrics import SqliteMetrics
from orchestrator.store.mlflow_names import mlflow_key
from orchestrator.store.mlflow_store import open_client
from orchestrator.store.run_names import END_STATUS, EXPERIMENT_KIND, TAG
from orchestrator.store.sqlite_durability import forget as forget_sqlite
from orchestrator.store.sqlite_durability import register as register_sqlite
from orchestrator.store.sqlite_durability import release as release_sqlite

__all__ = ["MlflowSink", "default_tracking", "flatten_params", "TAG"]

_MAX_METRICS = 1000  # MLflow's per-log_batch limits
_MAX_PARAMS_TAGS = 100
_MAX_PARAM_LEN = 6000
_MAX_TAG_LEN = 5000
_STEP = itemgetter(2)  # a point's step in (key, value, step, timestamp)
_BAD_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")
NOTE_TAG = "mlflow.note.content"  # MLflow's run description (markdown)
_END_STATUS = END_STATUS  # geosweep status -> MLflow run status (store/run_names.py)


def default_tracking(sweep_dir: str) -> tuple[str, str]:
    """(tracking URI, artifact location) of the local store inside a sweep folder."""
    d = os.path.abspath(sweep_dir)
    return f"sqlite:///{d}/mlflow.db", f"{d}/mlartifacts"


def _key(k: str) -> str:
    return _BAD_KEY.sub("_", str(k))[:250]


def _text(v: Any) -> str:
    """Plain values as Python prints them (``inf``, ``0.001``); containers as JSON."""
    if isinstance(v, str):
        return v
    if v is None or isinstance(v, (bool, int, float)):
        return str(v)
    return json.dumps(v, default=str)


def flatten_params(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested/dotted params -> ``{dotted key: str value}``, MLflow-safe keys and lengths."""
    out: dict[str, str] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten_params(v, key + "."))
        else:
            out[_key(key)] = _text(v)[:_MAX_PARAM_LEN]
    return out


def _scalar_items(scalars: dict[str, float], step: int) -> list[tuple]:
    return [(_key(mlflow_key(k)), float(v), int(step), None) for k, v in scalars.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not _infinite(v)]


def _infinite(v: float) -> bool:
    """MLflow stores +-inf as +-1.797e308 (the largest double), which reads as a value and
    flattens every chart it is on: such points are not logged (Parquet keeps them: inf)."""
    return math.isinf(v)


class MlflowSink:
    """Parent/child runs of one sweep in one experiment."""

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        sweep: str,
        artifact_location: str | None = None,
    ) -> None:
        self._sqlite: str | None = None
        if tracking_uri.startswith("sqlite:///"):
            db = tracking_uri[len("sqlite:///") :]
            if artifact_location is None:  # next to the database, not ./mlruns of the cwd
                artifact_location = os.path.join(os.path.dirname(os.path.abspath(db)),
                                                 "mlartifacts")
            # the sweep's writer commits per result: WAL, no fsync per commit, until close()
            # (store/sqlite_durability.py says what that trades)
            self._sqlite = db
            register_sqlite(db)
        # classified first (store/mlflow_store.py): a foreign or other-schema sqlite file is
        # refused, never migrated; a new one is a copy of the migrated empty template
        try:
            self.client = open_client(tracking_uri, create=True)
        except BaseException:
            if self._sqlite is not None:  # refused (a foreign file): left exactly as it was
                forget_sqlite(self._sqlite)
            raise
        # metric points straight into the sqlite tables, as MLflow writes them, without its
        # ORM (store/mlflow_metrics.py); None: MLflow's log_batch for them too
        self._points = SqliteMetrics.open(self._sqlite) if self._sqlite is not None else None
        self.sweep = sweep
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            self.experiment_id = self.client.create_experiment(
                experiment, artifact_location=artifact_location, tags=EXPERIMENT_KIND
            )
        else:
            self.experiment_id = exp.experiment_id
            if any(exp.tags.get(k) != v for k, v in EXPERIMENT_KIND.items()):
                for k, v in EXPERIMENT_KIND.items():  # stores made before the tag existed
                    self.client.set_experiment_tag(self.experiment_id, k, v)
        self.parent_id: str | None = None
        self._children: dict[str, str] = {}  # trial id -> run id
        self._start_ms: dict[str, int] = {}  # trial id -> child start time (ms)
        self._last_step: dict[tuple[str, str], int] = {}  # (trial, key) -> last logged step
        # run id -> param keys it holds (this process is the runs' only writer): a param is
        # logged once, without reading the run back before every batch
        self._param_keys: dict[str, set[str]] = {}
        self._stored: dict[str, str] = {}  # trial id -> run id in the store (start_parent)

    def __getstate__(self) -> dict:  # a pickled sink logs its points through MLflow's client
        return {**self.__dict__, "_points": None}

    # --- runs -----------------------------------------------------------------------------
    def _find(self, tags: dict[str, str]) -> str | None:
        filt = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        runs = self.client.search_runs([self.experiment_id], filter_string=filt, max_results=2)
        return runs[0].info.run_id if runs else None

    def start_parent(self, spec_yaml: str, params: dict, provenance: dict) -> str:
        """Create (or find again) the sweep's parent run; log params, provenance and spec."""
        ident = {f"{TAG}sweep": self.sweep, f"{TAG}role": "parent"}
        run_id = self._find(ident)
        if run_id is None:
            run_id = self.client.create_run(self.experiment_id, tags=ident,
                                            run_name=self.sweep).info.run_id
            self._param_keys[run_id] = set()
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.parent_id = run_id
        self._stored = self._stored_children()
        tags = {f"{TAG}{k}": v for k, v in provenance.items() if not isinstance(v, dict)}
        for k, v in provenance.items():
            if isinstance(v, dict):
                tags.update({f"{TAG}{k}.{kk}": vv for kk, vv in v.items()})
        self._log_batch(run_id, params=params, tags=tags)
        # what the store's readers see holds no secret (cluster/redact.py): a password in
        # tracking.mlflow_uri stays in the sweep folder's own spec.yaml only
        self.client.log_text(run_id, redact(spec_yaml), "spec.yaml")
        self.client.log_text(run_id, redact(json.dumps(provenance, indent=2, default=str)),
                             "provenance.json")
        return run_id

    def _stored_children(self) -> dict[str, str]:
        """trial id -> run id of this sweep's child runs in the store now (one search; a new
        sweep has none): ``start_child`` looks a trial up here, not with a search per trial
        (this process is the sweep's only writer: the sweep folder's lock)."""
        filt = f"tags.`{TAG}sweep` = '{self.sweep}' and tags.`{TAG}role` = 'child'"
        runs = self.client.search_runs([self.experiment_id], filter_string=filt,
                                       max_results=50000)
        out: dict[str, str] = {}
        for r in runs:  # MLflow's order, newest first: a trial's run is the one _find gives
            tid = r.data.tags.get(f"{TAG}trial_id")
            if tid is not None:
                out.setdefault(tid, r.info.run_id)
        return out

    def start_child(self, trial_id: str, params: dict, tags: dict | None = None,
                    name: str | None = None) -> str:
        """The trial's child run, created once: a resumed trial gets its old run back.
        ``name``: the run's name in the UI (store/run_names.py; default the trial id)."""
        if self.parent_id is None:
            raise RuntimeError("start_parent must be called before start_child")
        if trial_id in self._children:
            run_id = self._children[trial_id]
        else:
            ident = {f"{TAG}sweep": self.sweep, f"{TAG}trial_id": trial_id}
            run_id = self._stored.get(trial_id)
            if run_id is None:  # created RUNNING, with no params yet
                run_tags = {**ident, f"{TAG}role": "child", "mlflow.parentRunId": self.parent_id}
                if self._points is not None:
                    run_id, start = self._points.create_run(self.experiment_id,
                                                            name or trial_id, run_tags)
                else:
                    run = self.client.create_run(self.experiment_id, run_name=name or trial_id,
                                                 tags=run_tags)
                    run_id, start = run.info.run_id, run.info.start_time
                self._start_ms[trial_id] = start
                self._param_keys[run_id] = set()
                self._children[trial_id] = run_id
                self._log_batch(run_id, params=params, tags=tags or {})  # one transaction
                return run_id
            self._reload_child(trial_id, run_id)
            self._children[trial_id] = run_id
        self.client.update_run(run_id, status="RUNNING")
        self._log_batch(run_id, params=params, tags=tags or {})
        return run_id

    def _reload_child(self, trial_id: str, run_id: str) -> None:
        """Recover start time and last logged step per key of an existing child."""
        run = self.client.get_run(run_id)
        self._start_ms[trial_id] = run.info.start_time
        for key in run.data.metrics:
            hist = self.client.get_metric_history(run_id, key)
            self._last_step[(trial_id, key)] = max(m.step for m in hist)

    def running_children(self) -> list[str]:
        """Trial ids of this sweep's child runs still RUNNING (after a sweep: a crash's orphans)."""
        filt = (f"tags.`{TAG}sweep` = '{self.sweep}' and tags.`{TAG}role` = 'child' and "
                "attributes.status = 'RUNNING'")
        runs = self.client.search_runs([self.experiment_id], filter_string=filt,
                                       max_results=50000)
        return sorted({r.data.tags.get(f"{TAG}trial_id") for r in runs} - {None})

    def end_child(self, trial_id: str, status: str, tags: dict | None = None,
                  results: list[tuple[list[dict], list[tuple[dict[str, float], int]]]] = (),
                  params: dict | None = None) -> None:
        """Tag the final status (completed | diverged | stopped | failed); end the run.
        ``results`` / ``params``: the trial's last writes (``log_results``), in the same
        ``log_batch`` as the tags."""
        if status not in _END_STATUS:
            raise ValueError(f"status={status!r}: use one of {sorted(_END_STATUS)}")
        tags = {f"{TAG}status": status, **(tags or {})}
        if tags.get(f"{TAG}reason"):  # the first thing the run's page shows
            tags[NOTE_TAG] = f"**{status}**: {tags[f'{TAG}reason']}"
        self._log_metrics(trial_id, *self._result_groups(trial_id, results),
                          params=params or {}, tags=tags,
                          end=(_END_STATUS[status], int(time.time() * 1000)))

    def end_parent(self, status: str = "FINISHED", error: str | None = None) -> None:
        """Terminate the parent run (FINISHED | FAILED | KILLED); ``error``: why it failed."""
        if self.parent_id is not None:
            if error:
                self._log_tags(self.parent_id, {f"{TAG}status": "failed",
                                                f"{TAG}reason": error})
            self.client.set_terminated(self.parent_id, status=status)

    def close(self) -> None:
        """The sweep's writes are done: an sqlite store is a plain rollback-journal file again
        (its WAL checkpointed into it). The sink may still be used; it then writes with
        sqlite's defaults."""
        if self._points is not None:
            self._points.close()
            self._points = None
        if self._sqlite is not None:
            release_sqlite(self._sqlite)
            self._sqlite = None

    def find_child(self, trial_id: str) -> str | None:
        """The run id of this sweep's child of ``trial_id`` in the store, or None."""
        return self._find({f"{TAG}sweep": self.sweep, f"{TAG}trial_id": trial_id})

    def run_id(self, trial_id: str | None = None) -> str:
        """The MLflow run id of a trial's child (the parent's when ``trial_id`` is None)."""
        return self._run(trial_id)

    def _run(self, trial_id: str | None) -> str:
        run_id = self.parent_id if trial_id is None else self._children.get(trial_id)
        if run_id is None:
            raise KeyError(f"trial_id={trial_id!r}: no run started for it")
        return run_id

    # --- data -----------------------------------------------------------------------------
    def log_curve(self, trial_id: str, points: list[dict]) -> int:
        """Batched curve points ``{step, split, metric, value, wall_time}``; returns # logged.

        Timestamps are the child's start time + ``wall_time``, so MLflow's relative-time axis
        shows training time.
        """
        return self._log_metrics(trial_id, self._curve_items(trial_id, points))

    def log_scalars(self, trial_id: str | None, scalars: dict[str, float], step: int) -> int:
        """Scalars at one step (the parent's when ``trial_id`` is None); returns # logged."""
        return self._log_metrics(trial_id, _scalar_items(scalars, step))

    def log_result(self, trial_id: str, points: list[dict],
                   scalars_at: list[tuple[dict[str, float], int]],
                   params: dict | None = None, tags: dict | None = None) -> int:
        """``log_curve(points)`` then ``log_scalars`` of each ``(scalars, step)``, in that order
        and with the same at-most-once rule, and ``log_params(params)`` / ``set_tags(tags)``,
        as ONE ``log_batch`` (one sqlite transaction instead of one per call: most of the
        writer's time per result was these commits). Returns the number of points logged."""
        return self.log_results(trial_id, [(points, scalars_at)], params, tags)

    def log_results(self, trial_id: str,
                    results: list[tuple[list[dict], list[tuple[dict[str, float], int]]]],
                    params: dict | None = None, tags: dict | None = None) -> int:
        """Several results of one trial, each ``(points, scalars_at)`` as ``log_result`` logs
        it and in their order, as ONE ``log_batch``: the sweep's writer batches a trial's
        results (orchestrator/sweep/callback.py). Returns the number of points logged."""
        return self._log_metrics(trial_id, *self._result_groups(trial_id, results),
                                 params=params or {}, tags=tags or {})

    def _result_groups(self, trial_id: str, results: Any) -> list[list[tuple]]:
        groups = []
        for points, scalars_at in results:
            groups.append(self._curve_items(trial_id, points))
            groups += [_scalar_items(sc, step) for sc, step in scalars_at]
        return groups

    def _curve_items(self, trial_id: str, points: list[dict]) -> list[tuple]:
        t0 = self._start_ms.get(trial_id, int(time.time() * 1000))
        metrics = []
        keys: dict[tuple[str, str], str] = {}  # a curve has a handful of (split, metric)
        isinf, isfinite, append = math.isinf, math.isfinite, metrics.append
        for p in points:
            sm = (p["split"], p["metric"])
            key = keys.get(sm)
            if key is None:
                key = keys[sm] = _key(mlflow_key(f"{sm[0]}/{sm[1]}"))
            value = float(p["value"])
            if isinf(value):  # not logged (``_infinite``)
                continue
            wall = p.get("wall_time")
            ts = t0 + int(1000 * wall) if wall is not None and isfinite(wall) else None
            append((key, value, int(p["step"]), ts))
        return metrics

    def set_tags(self, trial_id: str | None, tags: dict[str, Any]) -> None:
        """Tags on a child (or on the parent when ``trial_id`` is None)."""
        self._log_tags(self._run(trial_id), tags)

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        """A local file or folder as an artifact of the parent run."""
        self.client.log_artifact(self._run(None), path, artifact_path)

    def _log_metrics(self, trial_id: str | None, *groups: list[tuple],
                     params: dict | None = None, tags: dict | None = None,
                     end: tuple[str, int] | None = None) -> int:
        """Each group sorted by step, groups in order; every kept point in one batch (with
        ``params`` and ``tags``, when given, and the run's ``end``: see ``_log_batch``)."""
        run_id = self._run(trial_id)
        now = int(time.time() * 1000)
        # plain (key, value, timestamp, step) tuples: a sweep logs thousands of points a
        # trial, and an MLflow ``Metric`` a point cost the writer more than sqlite's insert
        batch: list[tuple[str, float, int, int]] = []
        last_step = self._last_step
        for items in groups:
            for key, value, step, ts in sorted(items, key=_STEP):
                last = last_step.get((trial_id, key))
                if last is not None and step <= last:
                    continue  # at most once per step (resume, repeated final report)
                last_step[(trial_id, key)] = step
                batch.append((key, value, now if ts is None else ts, step))
        self._log_batch(run_id, batch, params or {}, tags or {}, end)
        return len(batch)

    def log_params(self, trial_id: str | None, params: dict) -> None:
        """Params of a child (or the parent when ``trial_id`` is None); keys already set stay."""
        self._log_params(self._run(trial_id), params)

    def _log_params(self, run_id: str, params: dict) -> None:
        self._log_batch(run_id, params=params)

    def _log_tags(self, run_id: str, tags: dict) -> None:
        self._log_batch(run_id, tags=tags)

    def _log_batch(self, run_id: str, metrics: list[tuple] = (), params: dict | None = None,
                   tags: dict | None = None, end: tuple[str, int] | None = None) -> None:
        """Metrics ((key, value, timestamp, step) tuples), new params and tags of one run,
        then with ``end`` = (MLflow status, end time in ms) the run terminated: on the
        sweep's own sqlite store one transaction (store/mlflow_metrics.py), elsewhere as few
        ``log_batch`` calls as MLflow's per-call limits allow and ``set_terminated``; nothing
        to log: no call."""
        have = self._param_keys.get(run_id)
        if have is None and params:  # a run found again: the params it already holds
            have = self._param_keys[run_id] = set(self.client.get_run(run_id).data.params)
        # params are immutable in MLflow: on a resumed run log only the new ones
        flat = {k: v for k, v in flatten_params(params or {}).items() if k not in (have or ())}
        secrets = known_secrets()  # read once per batch, not once per value
        ps = [Param(k, redact(v, secrets)) for k, v in flat.items()]
        ts = [RunTag(_key(k), redact(_text(v), secrets)[:_MAX_TAG_LEN])
              for k, v in (tags or {}).items() if v is not None]
        ms = list(metrics)
        if self._points is not None and (ms or ps or ts or end):
            self._points.write(run_id, ms, ps, ts, end)
            ms, ps, ts, end = [], [], [], None
        ms = [Metric(*m) for m in ms]  # MLflow's client: its entities
        while ms or ps or ts:
            self.client.log_batch(run_id, metrics=ms[:_MAX_METRICS],
                                  params=ps[:_MAX_PARAMS_TAGS], tags=ts[:_MAX_PARAMS_TAGS])
            ms, ps, ts = ms[_MAX_METRICS:], ps[_MAX_PARAMS_TAGS:], ts[_MAX_PARAMS_TAGS:]
        if end is not None:
            self.client.set_terminated(run_id, status=end[0], end_time=end[1])
        if flat:
            self._param_keys.setdefault(run_id, set()).update(flat)
