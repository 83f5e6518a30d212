"""[3] The sweep: a Tune ``Tuner`` over the trial driver, with our sinks as callbacks.

The sweep folder's layout is orchestrator/store/layout.py; which Tune experiment runs (the
first, the last one again on resume, or a new one that extends a finished sweep) is
orchestrator/sweep/experiments.py; ``run_sweep`` puts them together.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.spec.sweep_spec import SweepSpec
from orchestrator.store.layout import SweepPaths, sweep_paths
from orchestrator.sweep.experiments import Extension
from orchestrator.sweep.interrupt import fit_watching_sigint
from orchestrator.sweep.mlflow_start import StoreThread, import_driver_modules, mlflow_sink
from orchestrator.sweep.progress import make_progress
from orchestrator.sweep.writer import flush_all

__all__ = ["SweepPaths", "SweepResult", "sweep_paths", "run_sweep", "make_progress", "Extension"]


# the error of a trial an earlier driver started but its crash lost (``_close_orphans``)
ORPHAN_REASON = ("lost in a driver crash before Tune's experiment snapshot held it; the "
                 "searcher re-proposed its slot")


@dataclass
class SweepResult:
    paths: SweepPaths
    records: list[dict[str, Any]]
    wall_s: float
    best: dict[str, Any] | None = None
    counts: dict[str, int] = field(default_factory=dict)
    fit_s: float = 0.0  # the Tune phase alone (no Ray start, no MLflow store creation)
    interrupted: bool = False  # Ctrl-C: the parent run is KILLED; `geosweep resume` continues

    @property
    def lost(self) -> int:
        """Failed records that are crash orphans (``ORPHAN_REASON``): their slots ran again,
        so they are bookkeeping of the earlier crash, not trials that failed."""
        return sum(1 for r in self.records if r.get("status") == "failed"
                   and str(r.get("error") or "") == ORPHAN_REASON)


def run_sweep(spec: SweepSpec, out: str | os.PathLike = "geosweep-runs",
              address: str | None = None, resume: bool = False,
              printer=print, extend: Extension | None = None) -> SweepResult:
    """Run ``spec`` on Ray (local unless ``address``). The output folder must be prepared.

    ``resume``: restore the sweep's last Tune experiment and finish it (finished trials are
    not rerun; MLflow runs and Parquet rows are found again, not duplicated). ``extend``: run
    one more experiment that adds seeds or samples to a finished sweep (orchestrator/sweep/
    experiments.py); implies ``resume``.
    """
    # One sweep's phases in order (plan, lock, MLflow store beside Ray's start and the first
    # trials, Tune, records, parent run); each phase is a helper below, and what is left is
    # their order and the error paths that must close the parent run: longer than ~60 lines.
    from cluster.local import connect
    from orchestrator.store.lock import lock_sweep, unlock_sweep
    from orchestrator.store.manifest import write_manifest
    from orchestrator.sweep.experiments import save_experiment

    # imported where used, after the trials: the summary pulls in MLflow (built on a thread
    # meanwhile) and the kept weights torch, ~2-3 s each before the first trial otherwise

    t0 = time.time()
    _quiet_logs()
    paths = sweep_paths(spec, out)
    resume = resume or bool(extend)
    # checked before Ray starts: a refused extension changes nothing
    plan = _Plan.make(spec, paths, resume, extend)
    spec, exp = plan.spec, plan.exp
    _check_gpu_plan(spec, address)
    if plan.storage is not None:  # the study commits per result: WAL until the sweep ends
        from orchestrator.store.sqlite_durability import register

        register(plan.optuna_db)
    # The default MLflow store is built on a thread (orchestrator/sweep/mlflow_start.py): its
    # imports overlap Ray's start, the store itself Tune's start and the first trials (the
    # result sink's writer waits for it). A store outside the sweep folder (a server) is
    # written only once Ray is up.
    existed = paths.root.exists()
    # one writer per sweep folder (orchestrator/store/lock.py); the CLI took it already
    lock_sweep(paths.root)
    overlap = spec.tracking.mlflow_uri is None
    store = None
    if overlap:
        paths.root.mkdir(parents=True, exist_ok=True)
        from cluster.local import prepare

        if not address:
            prepare()  # the environment Ray must see when imported (a warm Ray's token)
        import ray  # noqa: F401 - imported here, not concurrently with the thread's imports
    try:
        if overlap:  # the driver's imports first, then the thread's (mlflow_start.py)
            plan.rdb = import_driver_modules(plan.storage)
            store = StoreThread(mlflow_sink, spec, paths)
        connect(address)
    except BaseException:
        _release_stores(store.wait(quiet=True) if store is not None else None, plan)
        if not existed:  # a failed Ray start leaves no sweep folder behind
            unlock_sweep(paths.root)
            shutil.rmtree(paths.root, ignore_errors=True)
        raise
    mlflow = None
    try:
        paths.root.mkdir(parents=True, exist_ok=True)
        paths.spec.write_text(spec.to_yaml())
        if extend or not resume:  # what a later resume restores this experiment with
            save_experiment(paths.ray_storage, exp)
        mlflow = None if store is not None else mlflow_sink(spec, paths)
        sink_cb = _sink_callback(spec, paths, mlflow, store, plan.previous)
        progress = make_progress()(exp.count, _objective(), spec.search.mode, printer=printer,
                                   label=spec.search.metric)
        tuner = _tuner(spec, paths, plan, [sink_cb, progress], resume and not extend)
    except BaseException:  # a store half-migrated by a dying thread would not open again
        _release_stores(store.wait(quiet=True) if store is not None else mlflow, plan)
        raise
    write_manifest(paths.root, {
        "name": spec.name, "trials": plan.planned, "mlflow_uri": paths.mlflow_uri,
        "parquet_root": paths.parquet_root, "started": plan.manifest.get("started", t0),
        "address": address, "experiments": plan.names + ([exp.name] if extend else []),
    })
    t_fit = time.time()
    try:
        _, interrupted = fit_watching_sigint(tuner)
        fit_s = time.time() - t_fit
        flush_all()  # the Optuna study's queued writes (orchestrator/sweep/study_mirror.py)
        mlflow = store.wait() if store is not None else mlflow
        printer("[geosweep] trials ended; writing MLflow/Parquet records and the kept weights...")
        if resume and not interrupted:
            _close_orphans(sink_cb, mlflow, plan.previous, plan.storage, spec.name)
        records = sink_cb.records()
        counts: dict[str, int] = {}
        for r in records:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        if not interrupted:
            from orchestrator.store.summary import log_sweep_summary
            from orchestrator.store.weights import keep_weights

            keep_weights(spec, paths.root, records, mlflow.client, printer=printer)
            log_sweep_summary(mlflow, records, spec.search.metric, spec.search.mode)
    except BaseException as e:  # a sweep that raises (or a second Ctrl-C) is not FINISHED
        if store is not None:  # None: the store failed (its error is what is raised)
            mlflow = store.wait(quiet=True)
        _settle(sink_cb)
        if mlflow is not None:
            mlflow.end_parent(status="KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED",
                              error=f"{type(e).__name__}: {e}"[:2000])
        _release_stores(mlflow, plan)
        raise
    # a sweep whose every trial failed did not finish; Ctrl-C is KILLED (resume continues it)
    printer("[geosweep] closing the MLflow parent run...")
    all_failed = bool(records) and counts.get("failed", 0) == len(records)
    mlflow.end_parent(status="KILLED" if interrupted else "FAILED" if all_failed
                      else "FINISHED")
    _release_stores(mlflow, plan)
    return SweepResult(paths, records, time.time() - t0, _best(records, spec.search.mode),
                       counts, fit_s, interrupted)


@dataclass
class _Plan:
    """Which experiment runs and what the sweep held before it (resume / extend)."""

    spec: SweepSpec  # the whole sweep's spec (an extension adds seeds or samples)
    exp: Any  # the Tune experiment to run (orchestrator/sweep/experiments.py)
    names: list[str]  # experiments of the sweep before this run
    previous: list[dict[str, Any]]  # trial records already in Parquet
    manifest: dict[str, Any]  # sweep.json as found
    planned: int  # trials planned, this experiment included
    storage: str | None  # the Optuna study's RDB URL (Optuna searches only)
    rdb: Any = None  # that RDB's storage once opened (else Tune's searcher opens the URL)

    @property
    def optuna_db(self) -> str:
        """The study's sqlite file (Optuna searches only)."""
        return self.storage[len("sqlite:///"):]

    @classmethod
    def make(cls, spec: SweepSpec, paths: SweepPaths, resume: bool,
             extend: Extension | None) -> _Plan:
        from orchestrator.store.manifest import read_manifest
        from orchestrator.store.parquet import read_trial_records
        from orchestrator.sweep.experiments import (
            FIRST,
            experiment_names,
            load_experiment,
            plan_extension,
        )

        names = experiment_names(paths.ray_storage) if resume else [FIRST]
        previous = read_trial_records(paths.parquet_root, spec.name) if resume else []
        manifest = read_manifest(paths.root) if resume and paths.manifest.exists() else {}
        planned = int(manifest.get("trials", 0))
        if extend:
            spec, exp = plan_extension(spec, previous, extend, planned, len(names) + 1)
            planned += exp.count
        else:
            exp = load_experiment(paths.ray_storage, names[-1], spec)
            planned = exp.count if not resume or not planned else planned
        # Optuna searches keep their study in an RDB in the sweep folder: an interrupted search
        # resumes from it, an extension continues it, and `optuna-dashboard sqlite:///<sweep>/
        # optuna.db` can open it.
        storage = None
        if spec.search.algorithm.startswith("optuna"):
            storage = f"sqlite:///{paths.root / 'optuna.db'}"
        return cls(spec, exp, names, previous, manifest, planned, storage)


def _settle(sink_cb: Any) -> None:
    """A failing sweep: the writers' queued writes done before the stores are closed (their
    errors are not the sweep's: it fails with its own)."""
    import contextlib

    with contextlib.suppress(Exception):
        sink_cb.flush()
    with contextlib.suppress(Exception):
        flush_all()


def _release_stores(mlflow: Any, plan: _Plan) -> None:
    """The sweep's sqlite stores back to plain rollback-journal files (store/
    sqlite_durability.py): nothing of this driver writes them any more."""
    if mlflow is not None:
        mlflow.close()
    if plan.storage is not None:
        from orchestrator.store.sqlite_durability import release

        release(plan.optuna_db)


def _check_gpu_plan(spec: SweepSpec, address: str | None) -> None:
    """Before Ray starts: refuse a plan whose trials would not fit in their GPU share, on
    this machine's GPU (or the size in GEOSWEEP_GPU_MEMORY_GB; on a cluster only then). Each
    GPU trial checks again on its own GPU before it trains (orchestrator/sweep/worker.py)."""
    share = spec.resources.gpus_per_worker
    if not share:
        return
    from orchestrator.spec.sweep_spec import SpecError
    from orchestrator.sweep.gpu_fit import GpuFitError, check_gpu_fit, local_gpu_bytes, plan_configs
    from workloads.config import apply_overrides

    try:
        have = local_gpu_bytes(probe=not address)  # a cluster's GPUs are not this machine's
        if have is not None:
            check_gpu_fit(plan_configs(spec.base_config(), spec.space, apply_overrides),
                          share, have)
    except GpuFitError as e:
        raise SpecError(str(e)) from None


def _objective() -> str:
    from orchestrator.sweep.worker import OBJECTIVE

    return OBJECTIVE


def _sink_callback(spec: SweepSpec, paths: SweepPaths, mlflow: Any, store: Any,
                   previous: list[dict[str, Any]]) -> Any:
    """The single writers (MLflow parent + Parquet dataset) behind one Tune callback; with
    ``store`` (a ``StoreThread``) its writer waits for the MLflow sink at its first write."""
    from orchestrator.store.parquet import ParquetSink
    from orchestrator.sweep.callback import SinkCallback

    parquet = ParquetSink(paths.parquet_root, spec.name)
    sink_cb = SinkCallback(mlflow=mlflow, parquet=parquet, sweep=spec.name,
                           metric=_objective(), background=True,
                           mlflow_later=store.wait if store is not None else None)
    sink_cb.preload(previous)
    return sink_cb


def _tuner(spec: SweepSpec, paths: SweepPaths, plan: _Plan, callbacks: list,
           restore: bool) -> Any:
    """A new Tuner over the trial driver, or the last experiment's restored (``restore``)."""
    import ray.tune as tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from orchestrator.sweep.experiments import build_experiment_search
    from orchestrator.sweep.trial import prewarm, trial_driver, trial_resources

    exp = plan.exp
    storage = plan.rdb or plan.storage
    param_space, search_alg, num_samples = build_experiment_search(exp, storage, spec.name)
    finished = frozenset(r["trial"] for r in plan.previous
                         if r.get("status") in ("completed", "diverged", "stopped"))
    trainable = tune.with_resources(
        tune.with_parameters(trial_driver, plan=spec.trial_plan(),
                             storage=str(paths.ray_storage / "train"), finished=finished,
                             weights=spec.tracking.keep_weights != "none"),
        trial_resources(spec.resources))
    prewarm(spec.resources)
    tune_dir = paths.ray_storage / exp.name
    if restore and tune_dir.exists() and tune.Tuner.can_restore(str(tune_dir)):
        from orchestrator.sweep.moved_modules import alias_moved_modules

        alias_moved_modules()  # a sweep pickled before orchestrator/spec/ existed
        from orchestrator.sweep.moved_storage import rehome_search_state

        # a moved or copied folder: the trials the searcher starts now go to this folder too
        rehome_search_state(tune_dir, paths.ray_storage, exp.name)
        tuner = tune.Tuner.restore(str(tune_dir), trainable=trainable,
                                   resume_unfinished=True, restart_errored=True,
                                   param_space=param_space)
        _use_callbacks(tuner, callbacks)
        return tuner
    if spec.scheduler.type == "asha":
        scheduler = ASHAScheduler(
            time_attr="step", max_t=spec.scheduler.max_t or spec.base_config().train.steps,
            grace_period=spec.scheduler.grace_period,
            reduction_factor=spec.scheduler.reduction_factor)
    else:
        scheduler = FIFOScheduler()
    run_config = tune.RunConfig(
        name=exp.name, storage_path=str(paths.ray_storage), verbose=0, callbacks=callbacks,
        failure_config=tune.FailureConfig(max_failures=spec.resources.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
    )
    tune_config = tune.TuneConfig(
        metric=_objective(), mode=spec.search.mode, search_alg=search_alg,
        scheduler=scheduler, num_samples=num_samples,
        # the searcher enforces max_concurrent; every trial reuses its actor (no new
        # process and no imports per trial: measured in sweep_efficiency and, for the
        # TorchTrainer's driver, benchmarks/train_executor.py)
        max_concurrent_trials=None,
        reuse_actors=True,
    )
    return tune.Tuner(trainable, param_space=param_space, tune_config=tune_config,
                      run_config=run_config)


def _best(records: list[dict[str, Any]], mode: str) -> dict[str, Any] | None:
    ok = [r for r in records if r["status"] == "completed" and _finite(r.get("final_val_loss"))]
    if not ok:
        return None
    return (min if mode == "min" else max)(ok, key=lambda r: r["final_val_loss"])


def _close_orphans(sink_cb: Any, mlflow: Any, previous: list[dict[str, Any]],
                   storage: str | None, study_name: str) -> None:
    """After a resumed run: trials an earlier driver started but Tune's experiment snapshot
    never held (the driver died within the snapshot period, 2 s) were not restored; the
    searcher proposed their slots again. Their records, MLflow child runs (one may exist
    without a Parquet record when the crash fell between the two writes) and Optuna trials
    would stay "running" forever: end them as failed, keeping their rows."""
    why = ORPHAN_REASON
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
    # The local Ray keeps token auth on (what listens where: docs/cluster.md); the notice is
    # not news per sweep.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
