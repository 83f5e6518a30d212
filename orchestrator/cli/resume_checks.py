"""What a resumed sweep (``resume DIR``, ``run SPEC --resume``) checks in its folder before Ray
starts: where it will write (orchestrator/store/targets.py: sweep.json's places, symlinks
anywhere under ``ray/``, ``parquet/``, ``mlartifacts/``), the checkpoints its unfinished
trials will load (one line naming the file in the folder, not a worker's traceback about a
temporary copy of it), and where its MLflow store keeps artifacts
(orchestrator/store/artifact_home.py). Each failure is one ``UsageError`` line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.cli.errors import UsageError

__all__ = ["folder_targets", "spec_with_folder_tracking", "check_resume_checkpoints",
           "home_artifacts"]

_FINISHED = ("completed", "diverged", "stopped")  # as the tuner's restored trials


def folder_targets(root: Path) -> Any:
    """The folder's write targets, every symlink under what a resume writes checked."""
    from orchestrator.store.manifest import sweep_targets
    from orchestrator.store.targets import FolderError

    try:
        return sweep_targets(root, deep=True)
    except FolderError as e:
        raise UsageError(str(e)) from None


def spec_with_folder_tracking(spec: Any, targets: Any) -> Any:
    """``spec`` writing where the folder's sweep.json says (resolved against the folder),
    not where its spec.yaml's relative paths would lead from the current directory."""
    root = targets.root
    upd: dict[str, Any] = {"mlflow_uri": None, "parquet_root": None}
    if targets.store_uri != f"sqlite:///{root / 'mlflow.db'}":
        upd["mlflow_uri"] = targets.store_uri
    if targets.parquet_root != str(root / "parquet"):
        upd["parquet_root"] = targets.parquet_root
    return spec.model_copy(update={"tracking": spec.tracking.model_copy(update=upd)})


def check_resume_checkpoints(targets: Any) -> int:
    """Every checkpoint a resumed trial may load (the trials not finished) loads safely (the
    allow-list of workloads/checkpoint.py, memory-mapped: no tensor is read); returns how
    many were checked. Nothing is imported when no unfinished trial has a checkpoint."""
    from orchestrator.store.checkpoints import checkpoints_by_trial
    from orchestrator.store.parquet import read_trial_records

    found = checkpoints_by_trial(targets.root)
    if not found:
        return 0
    done = {str(r["trial"]) for r in read_trial_records(targets.parquet_root, targets.name)
            if r.get("status") in _FINISHED}
    todo = [f for tid, files in sorted(found.items()) if tid not in done for f in files]
    if not todo:
        return 0
    from workloads.checkpoint import CheckpointLoadError, safe_load

    for f in todo:
        try:
            safe_load(f, mmap=True)
        except CheckpointLoadError as e:
            raise UsageError(f"{e}; resume loads it for its unfinished trial") from None
    return len(todo)


def home_artifacts(targets: Any, spec: Any, printer=print) -> None:
    """A store inside the folder keeps the sweep's artifacts inside it: a moved folder's
    locations are pointed back in (said in one line), any other outside one is refused."""
    from orchestrator.store.artifact_home import relocate, store_in_folder
    from orchestrator.store.targets import FolderError

    db = store_in_folder(targets.store_uri, targets.root)
    if db is None or not db.is_file():
        return
    try:
        line = relocate(targets.root, db, targets.name, spec.tracking.experiment)
    except FolderError as e:
        raise UsageError(str(e)) from None
    if line:
        printer(line)
