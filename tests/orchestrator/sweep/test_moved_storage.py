"""orchestrator/sweep/moved_storage.py: after a sweep folder moved, the trials its search
algorithm creates on resume live in the new folder (Ray 2.60 re-homes only the restored ones).
Both of Tune's search algorithms geosweep uses, saved and restored as Tune does it, no Ray
started."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from ray import tune
from ray.tune.experiment import Experiment
from ray.tune.search import BasicVariantGenerator, Searcher, SearchGenerator

from orchestrator.sweep.moved_storage import rehome_search_state


def _trainable(config):  # never run: only trials are created
    return None


class _Counting(Searcher):
    """A searcher that proposes x = 0, 1, 2, ..."""

    def __init__(self):
        super().__init__(metric="m", mode="min")
        self.n = 0

    def suggest(self, trial_id):
        self.n += 1
        return {"x": self.n}

    def on_trial_complete(self, trial_id, result=None, error=False):
        pass

    def save(self, checkpoint_path):
        Path(checkpoint_path).write_text(str(self.n))

    def restore(self, checkpoint_path):
        self.n = int(Path(checkpoint_path).read_text())


def _algs():
    grid = BasicVariantGenerator()
    search = SearchGenerator(_Counting())
    return {"grid": (grid, {"x": tune.grid_search([1, 2, 3])}),
            "search": (search, {})}


@pytest.mark.parametrize("kind", ["grid", "search"])
def test_new_trials_of_a_moved_folder_live_in_it(tmp_path: Path, kind):
    alg, space = _algs()[kind]
    old, new = tmp_path / "old" / "ray", tmp_path / "new" / "ray"
    alg.add_configurations([Experiment("tune", run=_trainable, config=space,
                                       storage_path=str(old), num_samples=3)])
    first = alg.next_trial()
    assert first.storage.storage_fs_path == old.as_posix()
    (new / "tune").mkdir(parents=True, exist_ok=True)
    alg.save_to_dir(str(new / "tune"), "s1")  # what the copied folder holds
    assert rehome_search_state(new / "tune", new, "tune") >= 1
    restored, _ = _algs()[kind]
    restored.restore_from_dir(str(new / "tune"))
    later = restored.next_trial()
    assert later is not None and later.storage.storage_fs_path == new.as_posix()
    assert later.storage.experiment_dir_name == "tune"
    assert later.trial_id != first.trial_id


def test_a_folder_that_did_not_move_is_not_rewritten(tmp_path: Path):
    alg, space = _algs()["grid"]
    ray = tmp_path / "ray"
    alg.add_configurations([Experiment("tune", run=_trainable, config=space,
                                       storage_path=str(ray))])
    (ray / "tune").mkdir(parents=True, exist_ok=True)
    alg.save_to_dir(str(ray / "tune"), "s1")
    f = next((ray / "tune").glob("basic-variant-state-*.json"))
    before = hashlib.sha1(f.read_bytes()).hexdigest()
    assert rehome_search_state(ray / "tune", ray, "tune") == 0
    assert hashlib.sha1(f.read_bytes()).hexdigest() == before
