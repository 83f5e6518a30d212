"""The Optuna study in memory, written through to its RDB (orchestrator/sweep/study_mirror.py):
the RDB ends as a study run on the RDB itself would, the sampler draws what it drew on the RDB,
a pickled study comes back from the RDB (the one this driver names), and an existing study
is continued."""

from __future__ import annotations

import json
import math
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


def _whole(t: optuna.trial.FrozenTrial) -> tuple:
    """Every field of a trial, datetimes included (to the microsecond the RDB keeps)."""
    steps = {k: "nan" if math.isnan(v) else v for k, v in t.intermediate_values.items()}
    return (t.number, t.state, t.values, t.params, t.distributions, steps,
            json.loads(json.dumps(t.user_attrs)), json.loads(json.dumps(t.system_attrs)),
            t.datetime_start, t.datetime_complete)


def _commits(engine) -> list[int]:
    """A counter of the transactions committed on ``engine`` from now on."""
    from sqlalchemy import event

    n = [0]
    event.listen(engine, "commit", lambda conn: n.__setitem__(0, n[0] + 1))
    return n


def test_a_trial_is_written_whole_in_one_transaction_when_it_finishes(tmp_path):
    """ask, params, reports and tell of a trial cost the RDB one transaction, at the tell; the
    RDB's trial is memory's field for field (datetimes, a NaN report, an infinite value)."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    mirror = MirroredStorage(url, "s")
    study = optuna.create_study(study_name="s", sampler=_sampler(), storage=mirror)
    mirror.flush()
    commits = _commits(mirror._rdb.engine)
    t = study.ask()
    t.suggest_float("x", 1e-4, 1e-1, log=True)
    t.suggest_categorical("k", ["a", "b"])
    t.report(float("nan"), 1)
    t.report(float("inf"), 2)
    t.set_user_attr("arm", {"a": [1, 2]})
    t.set_constraint("diverged", 0.0)
    mirror._writer.flush()  # nothing was handed to the writer before the tell
    assert commits[0] == 0
    study.tell(t, float("inf"))
    mirror._writer.flush()
    assert commits[0] == 1
    on_disk = optuna.load_study(study_name="s", storage=url)
    assert [_whole(x) for x in on_disk.trials] == [_whole(x) for x in study.trials]
    assert math.isnan(on_disk.trials[0].intermediate_values[1])


def test_a_running_trial_reaches_the_rdb_at_flush_and_then_only_what_changed(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    mirror = MirroredStorage(url, "s")
    study = optuna.create_study(study_name="s", sampler=_sampler(), storage=mirror)
    first = study.ask()
    first.suggest_float("x", 1e-4, 1e-1, log=True)
    first.report(0.5, 1)
    second = study.ask()  # created after the first: number 1 in memory and in the RDB
    second.suggest_float("x", 1e-4, 1e-1, log=True)
    study.tell(second, 0.25)  # finishes first: written with the running first, in order
    mirror.flush()
    on_disk = optuna.load_study(study_name="s", storage=url)
    assert [_whole(x) for x in on_disk.trials] == [_whole(x) for x in study.trials]
    assert on_disk.trials[0].state == optuna.trial.TrialState.RUNNING
    first.report(0.4, 2)
    mirror.set_trial_intermediate_value(first._trial_id, 1, 0.3)  # a step's value replaced
    study.tell(first, 0.3)
    mirror.flush()
    on_disk = optuna.load_study(study_name="s", storage=url)
    assert [_whole(x) for x in on_disk.trials] == [_whole(x) for x in study.trials]
    assert on_disk.trials[0].intermediate_values == {1: 0.3, 2: 0.4}


def test_the_sweeps_end_writes_the_trials_held_back(tmp_path):
    from orchestrator.sweep.writer import flush_all

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    mirror = MirroredStorage(url, "s")
    study = optuna.create_study(study_name="s", storage=mirror)
    t = study.ask()
    t.suggest_float("x", 0.0, 1.0)
    t.report(0.1, 3)
    flush_all()
    assert optuna.load_study(study_name="s", storage=url).trials[0].intermediate_values == {
        3: 0.1}
