"""The trials a resumed sweep starts go to its own folder, also when the folder was moved.

Ray 2.60 re-homes the *restored* trials of a moved experiment (``TuneController.
_restore_trials``), not the ones its search algorithm creates later: ``BasicVariantGenerator``'s
iterators and ``SearchGenerator``'s experiment keep the ``StorageContext`` pickled when the
sweep first ran, so a grid arm or an Optuna trial started by the resume of a copied folder
wrote its trial folder and checkpoints into the original folder (a write outside the folder
given: tests/orchestrator/cli/test_interrupt_move.py saw it). Before ``Tuner.restore``,
``rehome_search_state`` points every storage context in the search algorithm's saved state
at this folder's Tune storage. These files are Tune's own pickles, which the restore loads
anyway (a sweep folder is trusted code for ``resume``: docs/reliability.md).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

__all__ = ["rehome_search_state", "STATE_FILES"]

# the search algorithms' saved states (Ray's CKPT_FILE_TMPL of each)
STATE_FILES = ("basic-variant-state-*.json", "search_gen_state-*.json")


def _rehome(obj: Any, storage_fs_path: str, name: str, seen: set[int], depth: int = 0) -> int:
    """Point every StorageContext reachable from ``obj`` at ``storage_fs_path``/``name``;
    returns how many were changed."""
    from ray.train._internal.storage import StorageContext

    if id(obj) in seen or depth > 8:
        return 0
    seen.add(id(obj))
    if isinstance(obj, StorageContext):
        if (obj.storage_fs_path, obj.experiment_dir_name) == (storage_fs_path, name):
            return 0
        obj.storage_fs_path, obj.experiment_dir_name = storage_fs_path, name
        return 1
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = list(vars(obj).values())
    else:
        return 0
    return sum(_rehome(v, storage_fs_path, name, seen, depth + 1) for v in items)


def rehome_search_state(tune_dir: str | os.PathLike, storage_path: str | os.PathLike,
                        name: str) -> int:
    """Rewrite the search algorithm's saved states in ``tune_dir`` so that the trials it
    creates live under ``storage_path``/``name``; returns how many contexts moved (0: the
    folder did not move, nothing is written)."""
    import ray.cloudpickle as cloudpickle

    storage_fs_path = Path(storage_path).absolute().as_posix()
    moved = 0
    for pattern in STATE_FILES:
        for f in sorted(Path(tune_dir).glob(pattern)):
            # Tune's own searcher state (cloudpickle is its format): Tuner.restore, called
            # right after this, unpickles the same file, so reading it here opens nothing a
            # resume did not already trust: resume only folders you made
            # (docs/reliability.md, "Foreign code in a model folder or checkpoint")
            state = cloudpickle.loads(f.read_bytes())
            n = _rehome(state, storage_fs_path, name, set())
            if not n:
                continue
            tmp = f.with_name(f".{uuid.uuid4().hex[:12]}-{f.name}")
            tmp.write_bytes(cloudpickle.dumps(state))
            os.replace(tmp, f)
            moved += n
    return moved
