"""The Optuna study in memory, written through to its RDB (orchestrator/sweep/study_mirror.py):
the RDB ends as a study run on the RDB itself would, the sampler draws what it drew on the RDB,
a pickled study comes back from the RDB (the one this driver names), and an existing study
is continued."""

from __future__ import annotations

import json
import pickle
import shutil

import optuna
import pytest

from orchestrator.sweep.study_mirror import MirroredStorage, use_rdb

pytestmark = pytest.mark.timeout(120)
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _run(study: optuna.Study, n: int) -> list[float]:
    """n trials: ask, two params, two reports, a constraint, tell (one FAIL, one PRUNED)."""
    drawn = []
    for i in range(n):
        t = study.ask()
        x = t.suggest_float("x", 1e-4, 1e-1, log=True)
        k = t.suggest_categorical("k", ["a", "b"])
        drawn.append(x)
        t.report(x, 1)
        t.report(2 * x, 2)
        t.set_user_attr("arm", f"{k}{i}")
        if i == 3:
            study.tell(t, state=optuna.trial.TrialState.FAIL)
        elif i == 4:
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
        else:
            t.set_constraint("diverged", float(i % 2))  # optuna_search.py's constraint
            study.tell(t, x + (0.5 if k == "a" else 0.0))
    return drawn


def _sampler() -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=3, n_startup_trials=3, multivariate=True)


def _summary(study: optuna.Study) -> list[tuple]:
    """Every trial as an RDB holds it (attributes as JSON gives them back: lists)."""
    return [(t.number, t.state, t.params, t.values, t.intermediate_values,
             json.loads(json.dumps(t.user_attrs)), json.loads(json.dumps(t.system_attrs)))
            for t in study.get_trials(deepcopy=False)]


def test_rdb_ends_as_the_rdb_study_and_the_sampler_draws_the_same(tmp_path):
    plain = optuna.create_study(study_name="s", sampler=_sampler(),
                                storage=f"sqlite:///{tmp_path / 'plain.db'}")
    mirror = MirroredStorage(f"sqlite:///{tmp_path / 'mirror.db'}", "s")
    mirrored = optuna.create_study(study_name="s", sampler=_sampler(), storage=mirror)
    assert _run(mirrored, 12) == _run(plain, 12)
    mirror.flush()
    on_disk = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'mirror.db'}")
    assert _summary(on_disk) == _summary(plain)
    assert _summary(mirrored) == _summary(plain)


def test_pickle_flushes_and_comes_back_from_the_named_rdb(tmp_path):
    """Tune pickles its searcher with the study: the pickle waits for the RDB and holds no
    trials; unpickled, the study is read from the RDB this driver names for it (a moved or
    copied sweep folder: the copy's, never the original's)."""
    src = tmp_path / "a" / "optuna.db"
    src.parent.mkdir()
    mirror = MirroredStorage(f"sqlite:///{src}", "s")
    study = optuna.create_study(study_name="s", sampler=_sampler(), storage=mirror)
    _run(study, 6)
    blob = pickle.dumps(study)
    # the storage pickles as its RDB's URL and the study's name, none of the trials
    assert len(pickle.dumps(mirror)) < 500 and b"a5" not in pickle.dumps(mirror)
    copy = tmp_path / "b" / "optuna.db"
    copy.parent.mkdir()
    shutil.copy(src, copy)
    before = src.read_bytes()
    use_rdb("s", f"sqlite:///{copy}")
    try:
        back = pickle.loads(blob)
    finally:
        use_rdb("s", f"sqlite:///{src}")
    assert _summary(back) == _summary(study)
    t = back.ask()
    t.suggest_float("x", 1e-4, 1e-1, log=True)
    back.tell(t, 0.5)
    back._storage.flush()
    assert src.read_bytes() == before  # the original is untouched
    moved = optuna.load_study(study_name="s", storage=f"sqlite:///{copy}")
    assert len(moved.trials) == 7 and moved.trials[-1].value == 0.5


def test_an_existing_study_is_continued_with_its_numbers(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    first = optuna.create_study(study_name="s", sampler=_sampler(), storage=url)
    _run(first, 5)
    running = first.ask()  # left RUNNING, as a driver crash leaves one
    running.suggest_float("x", 1e-4, 1e-1, log=True)
    mirror = MirroredStorage(url, "s")
    study = optuna.create_study(study_name="s", sampler=_sampler(), storage=mirror,
                                load_if_exists=True)
    assert _summary(study) == _summary(optuna.load_study(study_name="s", storage=url))
    mine = optuna.trial.Trial(study, study._storage.get_trial_id_from_study_id_trial_number(
        study._study_id, running.number))
    study.tell(mine, state=optuna.trial.TrialState.FAIL)  # a resumed driver's orphan
    _run(study, 2)
    mirror.flush()
    again = optuna.load_study(study_name="s", storage=url)
    assert [t.number for t in again.trials] == list(range(8))
    assert again.trials[5].state == optuna.trial.TrialState.FAIL
    assert _summary(again) == _summary(study)


def test_a_replay_error_surfaces_on_flush(tmp_path):
    mirror = MirroredStorage(f"sqlite:///{tmp_path / 'optuna.db'}", "s")
    study = optuna.create_study(study_name="s", storage=mirror)
    mirror.flush()
    (tmp_path / "optuna.db").unlink()  # the RDB is gone under the writer
    mirror._rdb.engine.dispose()
    (tmp_path / "optuna.db").mkdir()  # and its path is a folder now: every write fails
    t = study.ask()
    t.suggest_float("x", 0.0, 1.0)
    with pytest.raises(Exception):  # noqa: B017 - sqlalchemy's OperationalError, any kind
        mirror.flush()
