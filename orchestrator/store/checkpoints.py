"""Where a trial's training checkpoints live inside a sweep folder, and which one is final.

The worker reports its own checkpoint folder (``workloads/checkpoint.py``: ``step-<08d>/state.pt``
entries) to Ray, which persists it as a ``checkpoint_*`` folder of the trial:

- executor ``in_trial``: ``<sweep>/ray/tune/<trial dir>/checkpoint_<n>/step-<08d>/state.pt``
  where the Tune trial dir name contains the trial id (``trial_driver_<id>_...``); sweeps
  extended with more seeds/samples have more experiments ``ray/tune-<k>/`` of the same layout;
- executor ``train``: ``<sweep>/ray/train/train-<trial id>/checkpoint_*/step-<08d>/state.pt``.

Tune keeps the last 2 checkpoints of a trial; the final one is the entry with the highest step.
A diverged trial has none at its last step (the loop skips the checkpoint on divergence).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["trial_checkpoints", "final_checkpoint", "checkpoint_step", "checkpoints_by_trial"]

_STEP = re.compile(r"^step-(\d{8})$")
_EXPERIMENT = re.compile(r"^tune(-\d+)?$")  # the first Tune experiment and its extensions
# a Tune trial id (``a1b2c_00000``) in its trial dir's name, and a Train run's folder
_TUNE_DIR = re.compile(r"(?:^|_)([0-9a-z]{5}_\d{5})_\d+(?:_|$)")
_TRAIN_DIR = re.compile(r"^train-(.+)$")


def checkpoint_step(path: str | os.PathLike) -> int:
    """The training step of a ``step-<08d>`` checkpoint folder (or its ``state.pt``)."""
    p = Path(path)
    if p.name == "state.pt":
        p = p.parent
    m = _STEP.match(p.name)
    if not m:
        raise ValueError(f"{path}: not a geosweep checkpoint folder (step-<8 digits>)")
    return int(m.group(1))


def _trial_roots(sweep_dir: Path, trial_id: str) -> list[Path]:
    """The Ray folders that may hold the trial's ``checkpoint_*`` folders (both executors)."""
    roots = []
    ray = sweep_dir / "ray"
    # Tune names trial dirs ``<trainable>_<trial id>_<index>_<params>_<date>``; the id is a
    # whole underscore-separated token (ids look like ``a1b2c_00000``).
    pat = re.compile(rf"(^|_){re.escape(trial_id)}(_|$)")
    for tune in sorted(ray.glob("tune*")) if ray.is_dir() else ():
        if tune.is_dir() and _EXPERIMENT.match(tune.name):
            roots += [d for d in tune.iterdir() if d.is_dir() and pat.search(d.name)]
    train = sweep_dir / "ray" / "train" / f"train-{trial_id}"
    if train.is_dir():
        roots.append(train)
    return roots


def trial_checkpoints(sweep_dir: str | os.PathLike, trial_id: str) -> list[Path]:
    """Every complete ``step-<08d>`` checkpoint of the trial, oldest step first."""
    found: dict[int, Path] = {}
    for root in _trial_roots(Path(sweep_dir), trial_id):
        for ray_ckpt in sorted(root.glob("checkpoint_*")):
            for entry in ray_ckpt.iterdir() if ray_ckpt.is_dir() else ():
                if _STEP.match(entry.name) and (entry / "state.pt").is_file():
                    found.setdefault(checkpoint_step(entry), entry)
    return [found[s] for s in sorted(found)]


def final_checkpoint(sweep_dir: str | os.PathLike, trial_id: str) -> Path | None:
    """The trial's checkpoint with the highest step, or None when it saved none."""
    found = trial_checkpoints(sweep_dir, trial_id)
    return found[-1] if found else None


def checkpoints_by_trial(sweep_dir: str | os.PathLike) -> dict[str, list[Path]]:
    """``{trial id: [state.pt, ...]}`` of every training checkpoint in the sweep folder (both
    executors, every experiment), for the checks a resume makes before Ray starts."""
    ray = Path(sweep_dir) / "ray"
    out: dict[str, list[Path]] = {}
    if not ray.is_dir():
        return out
    dirs: list[tuple[str, Path]] = []
    for tune in sorted(ray.glob("tune*")):
        if tune.is_dir() and _EXPERIMENT.match(tune.name):
            dirs += [(m.group(1), d) for d in sorted(tune.iterdir())
                     if d.is_dir() and (m := _TUNE_DIR.search(d.name))]
    train = ray / "train"
    if train.is_dir():
        dirs += [(m.group(1), d) for d in sorted(train.iterdir())
                 if d.is_dir() and (m := _TRAIN_DIR.match(d.name))]
    for tid, d in dirs:
        for f in sorted(d.glob("checkpoint_*/step-*/state.pt")):
            if _STEP.match(f.parent.name):
                out.setdefault(tid, []).append(f)
    return out
