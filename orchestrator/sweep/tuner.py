"""[3] The sweep: a Tune ``Tuner`` over the trial driver, with our sinks as callbacks.

Layout of a sweep folder (``<out>/<name>/``): ``spec.yaml``, ``mlflow.db`` + ``mlartifacts/``
(default MLflow store), ``parquet/`` (default dataset root), ``ray/`` (Tune/Train storage,
checkpoints; ``ray/tune`` the first Tune experiment, ``ray/tune-<k>`` + ``ray/tune-<k>.json``
the extensions: orchestrator/sweep/experiments.py), ``optuna.db`` (the Optuna study, for Optuna
searches), ``sweep.json`` (what was run, for ``status``/``resume``).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.sweep.experiments import Extension
from orchestrator.sweep.spec import SweepSpec

__all__ = ["SweepPaths", "SweepResult", "sweep_paths", "run_sweep", "make_progress", "Extension"]


@dataclass
class SweepPaths:
    root: Path
    spec: Path
    mlflow_uri: str
    artifacts: Path
    parquet_root: str
    ray_storage: Path
    manifest: Path


def sweep_paths(spec: SweepSpec, out: str | os.PathLike) -> SweepPaths:
    root = Path(out).expanduser().resolve() / spec.name
    mlflow_uri = spec.tracking.mlflow_uri or f"sqlite:///{root / 'mlflow.db'}"
    parquet_root = spec.tracking.parquet_root or str(root / "parquet")
    return SweepPaths(root, root / "spec.yaml", mlflow_uri, root / "mlartifacts", parquet_root,
                      root / "ray", root / "sweep.json")


@dataclass
class SweepResult:
    paths: SweepPaths
    records: list[dict[str, Any]]
    wall_s: float
    best: dict[str, Any] | None = None
    counts: dict[str, int] = field(default_factory=dict)
    fit_s: float = 0.0  # the Tune phase alone (no Ray start, no MLflow store creation)


def make_progress():
    """The progress-line Tune callback class (built lazily: it subclasses ray.tune.Callback)."""
    import ray.tune

    class ProgressCallback(ray.tune.Callback):
        """One compact progress line every few seconds instead of Tune's tables."""

        def __init__(self, total: int, metric: str, mode: str, every_s: float = 5.0,
                     printer=print, label: str | None = None):
            self.total, self.metric, self.mode = total, metric, mode
            self.label = label or metric
            self.every_s, self.printer = every_s, printer
            self.t0 = time.time()
            self.last = 0.0
            self.best: float | None = None
            self.diverged: set[str] = set()

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if result.get("_status") == "diverged":
                self.diverged.add(trial.trial_id)
                return
            v = result.get(self.metric)
            if v is None or not math.isfinite(v):
                return
            if self.best is None or (v < self.best if self.mode == "min" else v > self.best):
                self.best = v

        def on_step_end(self, iteration, trials, **info):
            now = time.time()
            if now - self.last >= self.every_s:
                self.last = now
                self.printer(self.line(trials))

        def on_experiment_end(self, trials, **info):
            self.printer(self.line(trials))

        def line(self, trials) -> str:
            st = [t.status for t in trials]
            done = sum(s == "TERMINATED" for s in st)
            running = sum(s == "RUNNING" for s in st)
            failed = sum(s == "ERROR" for s in st)
            div = len(self.diverged)
            elapsed = time.time() - self.t0
            total = max(self.total, len(trials))
            eta = "?"
            if done + failed:
                eta = f"{elapsed / (done + failed) * (total - done - failed):.0f}s"
            best = "-" if self.best is None else f"{self.best:.4f}"
            return (f"[geosweep] {done}/{total} done, {running} running, {div} diverged, "
                    f"{failed} failed | best {self.label} {best} | {elapsed:.0f}s elapsed, "
                    f"ETA {eta}")

    return ProgressCallback


def run_sweep(spec: SweepSpec, out: str | os.PathLike = "geosweep-runs",
              address: str | None = None, resume: bool = False,
              printer=print, extend: Extension | None = None) -> SweepResult:
    """Run ``spec`` on Ray (local unless ``address``). The output folder must be prepared.

    ``resume``: restore the sweep's last Tune experiment and finish it (finished trials are
    not rerun; MLflow runs and Parquet rows are found again, not duplicated). ``extend``: run
    one more experiment that adds seeds or samples to a finished sweep (orchestrator/
    experiments.py); implies ``resume``.
    """
    from cluster.local import connect
    from orchestrator.store.mlflow import MlflowSink
    from orchestrator.store.parquet import ParquetSink, read_trial_records
    from orchestrator.sweep.callback import SinkCallback
    from orchestrator.sweep.experiments import (
        FIRST,
        build_experiment_search,
        experiment_names,
        load_experiment,
        plan_extension,
        save_experiment,
    )
    from orchestrator.sweep.provenance import provenance
    from orchestrator.sweep.trial import resolve_executor, trial_driver, trial_resources
    from orchestrator.sweep.worker import OBJECTIVE

    t0 = time.time()
    _quiet_logs()
    paths = sweep_paths(spec, out)
    resume = resume or bool(extend)
    # --- which experiment: the first, the last one again (resume), or a new one (extend) -----
    names = experiment_names(paths.ray_storage) if resume else [FIRST]
    previous = read_trial_records(paths.parquet_root, spec.name) if resume else []
    manifest = json.loads(paths.manifest.read_text()) if resume and paths.manifest.exists() \
        else {}
    planned = int(manifest.get("trials", 0))
    if extend:  # checked before Ray starts: a refused extension changes nothing
        spec, exp = plan_extension(spec, previous, extend, planned, len(names) + 1)
    else:
        exp = load_experiment(paths.ray_storage, names[-1], spec)
    connect(address)  # first: a failed Ray start must leave no sweep folder behind
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.spec.write_text(spec.to_yaml())
    if extend:
        planned += exp.count
    elif not resume or not planned:
        planned = exp.count
    if extend or not resume:  # what a later resume restores this experiment with
        save_experiment(paths.ray_storage, exp)

    import ray.tune as tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    # --- sinks: the single writers ----------------------------------------------------------
    mlflow = MlflowSink(paths.mlflow_uri, spec.tracking.experiment or spec.name, spec.name,
                        artifact_location=str(paths.artifacts))
    prov = provenance()
    mlflow.start_parent(spec.to_yaml(), params={"sweep": spec.name}, provenance=prov)
    parquet = ParquetSink(paths.parquet_root, spec.name)
    sink_cb = SinkCallback(mlflow=mlflow, parquet=parquet, sweep=spec.name,
                           metric=OBJECTIVE, background=True)
    sink_cb.preload(previous)
    progress = make_progress()(exp.count, OBJECTIVE, spec.search.mode, printer=printer,
                               label=spec.search.metric)

    # --- search and scheduler -----------------------------------------------------------------
    # Optuna searches keep their study in an RDB in the sweep folder: an interrupted search
    # resumes from it, an extension continues it, and `optuna-dashboard sqlite:///<sweep>/
    # optuna.db` can open it.
    storage = None
    if spec.search.algorithm.startswith("optuna"):
        storage = f"sqlite:///{paths.root / 'optuna.db'}"
    param_space, search_alg, num_samples = build_experiment_search(exp, storage, spec.name)
    if spec.scheduler.type == "asha":
        scheduler = ASHAScheduler(
            time_attr="step", max_t=spec.scheduler.max_t or spec.base_config().train.steps,
            grace_period=spec.scheduler.grace_period,
            reduction_factor=spec.scheduler.reduction_factor)
    else:
        scheduler = FIFOScheduler()

    trainable = tune.with_resources(
        tune.with_parameters(trial_driver, spec_dict=spec.model_dump(mode="json"),
                             storage=str(paths.ray_storage / "train"),
                             finished=frozenset(r["trial"] for r in previous if r.get(
                                 "status") in ("completed", "diverged", "stopped"))),
        trial_resources(spec.resources))
    callbacks = [sink_cb, progress]
    run_config = tune.RunConfig(
        name=exp.name, storage_path=str(paths.ray_storage), verbose=0,
        callbacks=callbacks,
        failure_config=tune.FailureConfig(max_failures=spec.resources.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
    )
    tune_dir = paths.ray_storage / exp.name
    if resume and not extend and tune_dir.exists() and tune.Tuner.can_restore(str(tune_dir)):
        tuner = tune.Tuner.restore(str(tune_dir), trainable=trainable,
                                   resume_unfinished=True, restart_errored=True,
                                   param_space=param_space)
        _use_callbacks(tuner, callbacks)
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=tune.TuneConfig(
                metric=OBJECTIVE, mode=spec.search.mode, search_alg=search_alg,
                scheduler=scheduler, num_samples=num_samples,
                # the searcher enforces max_concurrent; in-trial trials reuse their actor
                # (no new process, no torch import per trial: measured in sweep_efficiency)
                max_concurrent_trials=None,
                reuse_actors=resolve_executor(spec.resources) == "in_trial",
            ),
            run_config=run_config,
        )
    paths.manifest.write_text(json.dumps({
        "name": spec.name, "trials": planned, "mlflow_uri": paths.mlflow_uri,
        "parquet_root": paths.parquet_root, "started": manifest.get("started", t0),
        "address": address, "experiments": names + ([exp.name] if extend else []),
    }, indent=2))
    t_fit = time.time()
    grid = tuner.fit()
    fit_s = time.time() - t_fit
    if resume:
        _close_orphans(sink_cb, mlflow, previous, storage, spec.name)
    records = sink_cb.records()
    from orchestrator.store.weights import keep_weights

    keep_weights(spec, paths.root, records, mlflow.client, printer=printer)
    mlflow.end_parent(status="FINISHED")

    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    best = None
    ok = [r for r in records if r["status"] == "completed" and _finite(r.get("final_val_loss"))]
    if ok:
        key = "final_val_loss"
        best = (min if spec.search.mode == "min" else max)(ok, key=lambda r: r[key])
    del grid
    return SweepResult(paths, records, time.time() - t0, best, counts, fit_s)


def _close_orphans(sink_cb: Any, mlflow: Any, previous: list[dict[str, Any]],
                   storage: str | None, study_name: str) -> None:
    """After a resumed run: trials an earlier driver started but Tune's experiment snapshot
    never held (the driver died within the snapshot period, 2 s) were not restored; the
    searcher proposed their slots again. Their records, MLflow child runs (one may exist
    without a Parquet record when the crash fell between the two writes) and Optuna trials
    would stay "running" forever: end them as failed, keeping their rows."""
    why = "lost in a driver crash before Tune's experiment snapshot held it; the searcher " \
          "re-proposed its slot"
    seen = sink_cb.seen()
    for r in previous:
        if r.get("status") == "running" and r["trial"] not in seen:
            sink_cb.abandon(r["trial"], why)
    sink_cb.flush()
    for tid in mlflow.running_children():
        sink_cb.abandon(tid, why)
    sink_cb.flush()
    if storage is None:
        return
    import optuna

    study = optuna.load_study(study_name=study_name, storage=storage)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)


def _use_callbacks(tuner: Any, callbacks: list) -> None:
    """A restored Tuner runs with the callbacks pickled in its ``tuner.pkl``: copies of the
    first driver's sinks, with that driver's stale state. Swap in this driver's own. Ray
    2.60 has no public way to do it (``Tuner.restore`` takes no run_config)."""
    internal = getattr(tuner, "_local_tuner", None)
    if internal is None:
        raise RuntimeError("geosweep resume needs a local Tuner (not Ray Client)")
    internal.get_run_config().callbacks = callbacks


def _quiet_logs() -> None:
    """Ray/MLflow chatter a sweep user does not need; our progress line says what matters."""
    import logging

    # Tune's ResultGrid looks for result.json files we do not write (results go to Parquet).
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    logging.getLogger("ray.tune.utils.util").setLevel(logging.ERROR)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # The local Ray binds 127.0.0.1 and keeps token auth on; the notice is not news per sweep.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
