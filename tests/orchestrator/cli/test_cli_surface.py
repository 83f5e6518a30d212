"""The CLI without surprises (issue 14 §3): values, --set on specs, train.steps vs epochs,
--version, list, every argument's help, status --watch's table, the heartbeat."""

from __future__ import annotations

import argparse
import io
import json
import math
import time

import pytest

import orchestrator.cli as ocli
from orchestrator.cli.heartbeat import Heartbeat, StepTracker
from orchestrator.cli.listing import SECTIONS, listing
from orchestrator.spec.sets import apply_sets, load_spec_with_sets, parse_set
from orchestrator.spec.sweep_spec import SpecError
from workloads.config import ConfigError, parse_value


def run_cli(argv, capsys):
    capsys.readouterr()
    rc = ocli.main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# --- values ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text, want", [
    ("3e-3", 3e-3), ("1E5", 1e5), ("-2.5e-1", -0.25), ("30", 30), ("1_000", 1000),
    ("0.5", 0.5), ("inf", math.inf), ("Infinity", math.inf), (".inf", math.inf),
    ("-inf", -math.inf), ("true", True), ("null", None), ("adamw", "adamw"),
    ("[1e-3, 3e-3]", [1e-3, 3e-3]), ("{family: spheret, p: 2}", {"family": "spheret", "p": 2}),
])
def test_parse_value_numbers_first(text, want):
    got = parse_value(text)
    assert got == want and type(got) is type(want)


def test_parse_value_nan_and_bad_yaml():
    assert math.isnan(parse_value("nan"))
    with pytest.raises(ConfigError, match="cannot parse value"):
        parse_value("[1, 2")


# --- --set on specs -------------------------------------------------------------------------
BASE = {"name": "s", "workload": {"preset": "gpt-debug", "overrides": {"optim.lr": 1e-3}},
        "space": {"optim.lr": {"grid": [1e-3]}}, "budget": {"steps": 100}}


def test_apply_sets_grammar():
    out = apply_sets(BASE, ["budget.steps=50", "search.num_samples=4", "seeds=2",
                            "workload.overrides.optim.lr=3e-3",
                            "workload.overrides.model.residual={family: spheret, p: 2}",
                            "space.optim.lr.grid=[1e-4, 1e-2]",
                            "space.model.residual.p={grid: [1, inf]}"])
    assert out["budget"]["steps"] == 50
    assert out["search"] == {"num_samples": 4}
    assert out["seeds"] == 2
    assert out["workload"]["overrides"] == {
        "optim.lr": 3e-3, "model.residual": {"family": "spheret", "p": 2}}
    assert out["space"]["optim.lr"] == {"grid": [1e-4, 1e-2]}
    # inside YAML, inf stays a word: the spec reads every p through parse_p
    assert out["space"]["model.residual.p"] == {"grid": [1, "inf"]}
    assert BASE["budget"]["steps"] == 100  # the input is not changed


@pytest.mark.parametrize("item, msg", [
    ("budget.steps", "expected KEY=VALUE"), ("=3", "expected KEY=VALUE"),
    ("budget..steps=3", "expected KEY=VALUE"), ("name.x=1", "name is 's', not a section"),
])
def test_apply_sets_errors(item, msg):
    with pytest.raises(SpecError, match=msg):
        apply_sets(BASE, [item])


def test_parse_set_value():
    assert parse_set("optim.lr=3e-3") == ("optim.lr", 3e-3)


def test_load_spec_with_sets_validates():
    spec = load_spec_with_sets("quickstart", [
        "budget.steps=60", "budget.eval_every=20", "scheduler.max_t=60",
        "scheduler.grace_period=20", "search.num_samples=4",
        "workload.overrides.optim.lr=3e-3"])
    assert spec.budget.steps == 60 and spec.search.num_samples == 4
    assert spec.workload.overrides["optim.lr"] == 3e-3
    with pytest.raises(SpecError, match=r"^budget\.stepz: unknown field; valid: steps"):
        load_spec_with_sets("quickstart", ["budget.stepz=5"])
    assert load_spec_with_sets("norm_ablation", ["seeds=2"]).seeds == [0, 1]  # a grid


def test_set_seeds_on_a_search_is_refused_in_one_line():
    """issue 33 §8: an Optuna spec ran seeds[0] only and said nothing of the rest."""
    with pytest.raises(SpecError) as e:
        load_spec_with_sets("quickstart", ["seeds=2"])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--set seeds: search.algorithm optuna-tpe runs "
                                                "each sampled configuration once, with seed 0")
    assert "--more-seeds" in msg
    assert load_spec_with_sets("quickstart", ["seeds=1"]).seeds == [0]  # one seed: fine


def test_run_dry_run_with_sets(capsys):
    rc, out, err = run_cli(["run", "quickstart", "--dry-run", "--set", "search.num_samples=3",
                            "--set", "budget.steps=400", "--set", "scheduler.max_t=400"],
                           capsys)
    assert rc == 0, err
    assert "3 trials" in out
    rc, out, err = run_cli(["run", "quickstart", "--dry-run", "--set", "budget.steps=abc"],
                           capsys)
    assert rc == 2 and err.count("\n") == 1 and "budget.steps" in err


def test_search_p_dry_run_starts_and_writes_nothing(capsys, tmp_path):
    """issue 33 §16: search-p had no --dry-run."""
    rc, out, err = run_cli(["search-p", "--dry-run", "--out", str(tmp_path / "out"),
                            "--set", "search.num_samples=6", "--top-k", "2",
                            "--confirm-seeds", "2"], capsys)
    assert rc == 0, err
    assert "stage 1, 6 trials by optuna-tpe" in out
    assert "up to 3 configurations" in out and "x 2 seeds = up to 6 trials" in out
    assert "estimated total: ~" in out and "nothing was started or written" in out
    assert not (tmp_path / "out").exists()


def test_search_p_set_error_is_one_line(capsys, tmp_path):
    rc, _, err = run_cli(["search-p", "--out", str(tmp_path), "--set", "search.bogus=1"],
                         capsys)
    assert rc == 2 and err.count("\n") == 1 and "search.bogus: unknown field" in err


# --- train: steps beat epochs ---------------------------------------------------------------
def test_train_steps_replace_epochs(capsys, monkeypatch):
    import workloads.train as wt

    seen = {}

    class Res:
        steps, train_time_s, final_val_loss, best_val_loss, divergence = 30, 1.0, 2.0, 2.0, None

    def fake_run(cfg, report=None, monitor=None, checkpoint_dir=None, resume=False):
        seen["cfg"] = cfg
        return Res()

    monkeypatch.setattr(wt, "run", fake_run)
    rc, out, err = run_cli(["train", "--preset", "mlp-mnist", "--set", "train.steps=30",
                            "--set", "optim.lr=3e-3"], capsys)
    assert rc == 0, err
    cfg = seen["cfg"]
    assert cfg.train.steps == 30 and cfg.train.epochs == 0 and cfg.optim.lr == 3e-3
    assert "train.steps=30 replaces preset mlp-mnist's 10 epochs" in out
    assert out.splitlines()[1].startswith("[train] mlp-mnist: 30 steps")


def test_train_resume_says_where_it_starts_and_ends_at_the_last_evaluation(tmp_path, capsys):
    """--resume: no checkpoint yet is a fresh start said in one line; a checkpoint at
    train.steps trains nothing and reports its last evaluation (it printed nan); more steps go
    on from it. A real mlp-debug run (MNIST, offline), a few steps."""
    base = ["train", "--preset", "mlp-debug", "--set", "train.steps=6", "--set",
            "train.eval_every=3", "--out", str(tmp_path / "o"), "--resume"]
    rc, out, err = run_cli(base, capsys)
    assert rc == 0, err
    assert "--resume: no checkpoint in" in out and "starting at step 0" in out
    first = out.splitlines()[-1]
    assert first.startswith("done: 6 steps") and "nan" not in first

    rc, out, err = run_cli(base, capsys)
    assert rc == 0, err
    assert "continuing from" in out and "step-00000006" in out
    assert "nothing left to train" in out
    assert out.splitlines()[-1].split(" in ")[0] == first.split(" in ")[0]  # same steps
    assert out.splitlines()[-1].split("final")[1] == first.split("final")[1]  # same losses

    more = [a if a != "train.steps=6" else "train.steps=9" for a in base]
    rc, out, err = run_cli(more, capsys)
    assert rc == 0, err
    assert "nothing left" not in out and out.splitlines()[-1].startswith("done: 9 steps")


def test_train_resume_without_out_is_refused(capsys):
    rc, _, err = run_cli(["train", "--preset", "mlp-debug", "--resume"], capsys)
    assert rc == 2 and "--resume needs --out" in err


# --- --version, list, help ------------------------------------------------------------------
def test_version(capsys):
    rc, out, _ = run_cli(["--version"], capsys)
    assert rc == 0 and out.startswith("geosweep ")
    assert out.split()[1] == ocli.version()


def test_list_reads_the_registries(capsys):
    from search_spaces import list_specs
    from workloads.config import PRESETS
    from workloads.geometry.manifolds import MANIFOLDS
    from workloads.optim.assignment import STRATEGIES
    from workloads.residual import RESIDUALS

    rc, out, _ = run_cli(["list"], capsys)
    assert rc == 0
    names = {line.split()[0] for line in out.splitlines() if line.startswith("  ")}
    for reg in (PRESETS, list_specs(), RESIDUALS, MANIFOLDS, STRATEGIES, ("adamw", "muon", "sgd")):
        assert set(reg) <= names
    assert "SCIENCE.md" not in out
    assert listing("families").splitlines()[0] == SECTIONS["families"][0] + ":"
    rc, _, err = run_cli(["list", "nope"], capsys)
    assert rc == 2 and "invalid choice" in err
    # a description is a whole sentence, not a docstring's first line (issue 33 §16)
    dgram = next(ln for ln in out.splitlines() if ln.split()[:1] == ["dgram"])
    assert dgram.endswith("``colnorm_polar``."), dgram
    from orchestrator.cli.listing import _first_line

    assert _first_line("One line. Two.\n\nMore.") == "One line."
    assert _first_line("Runs p = 2 (see\n    eq. 3) fast.\n") == "Runs p = 2 (see eq. 3) fast."


def _walk(parser: argparse.ArgumentParser, path: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{path} {name}", "(the command itself)", helps.get(name)
                yield from _walk(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, "/".join(action.option_strings) or action.dest, action.help


def test_every_argument_has_help():
    rows = list(_walk(ocli.build_parser(), "geosweep"))
    assert len(rows) > 60  # every command was walked
    missing = [f"{p}: {a}" for p, a, h in rows if not (h and h.strip())]
    assert missing == []


# --- status --watch -------------------------------------------------------------------------
def _fake_live_sweep(tmp_path):
    from orchestrator.store.parquet import ParquetSink

    root = tmp_path / "w"
    root.mkdir()
    (root / "spec.yaml").write_text("search: {metric: val/loss, mode: min}\n")
    pq = str(root / "parquet")
    sink = ParquetSink(pq, "w")
    for tid, vals in {"t0": [3.0, 2.5], "t1": [3.1, 2.2], "t2": [4.0]}.items():
        sink.write_curve(tid, [{"step": 10 * (i + 1), "split": "val", "metric": "loss",
                                "value": v, "wall_time": 5.0 * (i + 1)}
                               for i, v in enumerate(vals)])
    sink.write_trial({"trial": "t0", "status": "completed", "arm": "lr=1e-3", "last_step": 20,
                      "final_val_loss": 2.5, "wall_s": 12.0})
    manifest = {"name": "w", "trials": 4, "parquet_root": pq}
    (root / "sweep.json").write_text(json.dumps(manifest))
    return root, manifest, sink


def test_live_table_ranks_running_and_finished(tmp_path):
    from orchestrator.cli.watch import live_table
    from orchestrator.store.parquet import read_curves, read_trials

    root, m, _ = _fake_live_sweep(tmp_path)
    t = live_table(read_trials(m["parquet_root"], "w"), read_curves(m["parquet_root"], "w"),
                   "val/loss", "min")
    assert list(t["trial"]) == ["t1", "t0", "t2"]
    assert list(t["rank"]) == [1, 2, 3]
    assert list(t["status"]) == ["running", "completed", "running"]
    assert list(t["step"]) == [20, 20, 10]
    assert list(t["time_s"]) == [10.0, 12.0, 5.0]
    assert list(t["val/loss"]) == [2.2, 2.5, 4.0]
    tmax = live_table(read_trials(m["parquet_root"], "w"), read_curves(m["parquet_root"], "w"),
                      "val/loss", "max")
    assert list(tmax["trial"]) == ["t2", "t0", "t1"]


def test_status_watch_stops_when_the_sweep_ends(tmp_path):
    from orchestrator.cli.watch import watch

    root, m, sink = _fake_live_sweep(tmp_path)
    frames: list[str] = []
    assert watch(root, m, 0.01, printer=frames.append, clear=False, max_rounds=2) == 0
    assert len(frames) == 2 and "sweep w: 1/4 trials ended, 2 running" in frames[0]
    for tid in ("t1", "t2", "t3"):
        sink.write_trial({"trial": tid, "status": "completed", "last_step": 20,
                          "final_val_loss": 2.0, "wall_s": 1.0})
    frames.clear()
    assert watch(root, m, 0.01, printer=frames.append, clear=False, max_rounds=50) == 0
    assert len(frames) == 1 and "4/4 trials ended, 0 running" in frames[0]


def test_status_watch_argument(capsys, tmp_path):
    rc, _, err = run_cli(["status", str(tmp_path), "--watch", "0"], capsys)
    assert rc == 2 and "must be > 0 seconds" in err


# --- heartbeat ------------------------------------------------------------------------------
def test_heartbeat_prints_when_silent_and_tracks_steps():
    buf = io.StringIO()

    class Info:
        step = 5

    hb = Heartbeat("x", phase="loading", every=0.2, stream=buf)
    tracker = StepTracker(None, hb, total=100)
    with hb:
        time.sleep(0.6)
        assert tracker.check(Info()) is None
        Info.step = 6
        tracker.check(Info())
        time.sleep(0.6)
    lines = buf.getvalue().splitlines()
    assert lines and lines[0].startswith("[x] still working: loading (")
    assert any("training: step 6/100" in ln for ln in lines)
    with pytest.raises(AttributeError):
        tracker.signals  # noqa: B018 - absent without a divergence monitor
    assert tracker.state_dict() == {}


def test_heartbeat_says_evaluating_not_the_last_step():
    """issue 33 §12: for the last 60 s of `train` the heartbeat said `step 30/30` while the
    validation set was scored."""
    hb = Heartbeat("x", every=10.0, stream=io.StringIO())
    tracker = StepTracker(None, hb, total=30, eval_every=10, metrics_every=20)

    class Info:
        step = 9

    tracker.check(Info())
    assert hb.phase.startswith("training: step 9/30")
    Info.step = 10
    tracker.check(Info())
    assert hb.phase == "evaluating on the validation set after step 10/30"
    Info.step = 20
    tracker.check(Info())
    assert hb.phase == "evaluating on the validation set and collecting metrics after step 20/30"
    Info.step = 30
    tracker.check(Info())
    assert hb.phase == "evaluating on the validation set and collecting metrics after step 30/30"


# --- dry-run estimate -----------------------------------------------------------------------
def test_estimate_lines_arithmetic(monkeypatch):
    from orchestrator.cli import estimate as E
    from orchestrator.spec.yaml_reader import load_spec

    monkeypatch.setattr(E.os, "cpu_count", lambda: 16)
    spec = load_spec("quickstart")  # 8 trials x 300 steps, ASHA 100/2/300, 2 at a time
    costs = E.TrialCosts(step_s=0.05, eval_s=0.1, metrics_s=0.5, setup_s=1.0)
    lines = E.estimate_lines(spec, 8, costs)
    assert lines[0] == ("total: at most 2400 training steps (8 trials x 300 steps); ASHA stops "
                        "most trials early: ~1400 expected (175 per trial)")
    # per trial: setup + 175 steps + 3.5 evals + 2.75 metric passes + its start
    per = 1.0 + 175 * 0.05 + 3.5 * 0.1 + 2.75 * 0.5 + E.TRIAL_START_S["in_trial"]
    want = E.RAY_START_S + E.WORKER_START_S + 8 * per / 2 + E.SWEEP_END_S  # ~78 s
    assert lines[1].startswith(f"estimated wall time: ~{want:.0f} s (measured here on gpt-debug")
    assert "50.0 ms/step, 0.10 s/eval, 0.50 s/metrics pass" in lines[1]
    mlp = load_spec("continuity_mlp")
    assert "epochs" in E.estimate_lines(mlp, 45, costs)[0]


def test_asha_expected_steps():
    from orchestrator.cli.estimate import asha_expected_steps

    assert asha_expected_steps(300, 100, 2.0, 300) == 175.0  # 100 + 100/2 + 100/4
    assert asha_expected_steps(300, 300, 2.0, 300) == 300.0  # no rung below the end
    assert asha_expected_steps(100, 10, 3.0, 100) == pytest.approx(10 + 20 / 3 + 60 / 9 + 10 / 27)


@pytest.mark.parametrize("preset", ["gpt-debug", "mlp-debug"])
def test_measure_costs_are_real_times(preset):
    """The probe trains through the real loop: a warm step and a metrics pass are real positive
    times (the metrics pass dearer than a step: SVDs of every matrix); an eval of the debug
    presets' few batches can be below the clock's noise, so it is only never negative."""
    from orchestrator.cli.estimate import measure_costs
    from workloads.config import preset as make

    c = measure_costs(make(preset))
    assert 0 < c.step_s < 60 and 0 <= c.eval_s < 60 and c.setup_s >= 0
    assert c.metrics_s > c.step_s


def test_heartbeat_printer_pickles_like_tune_does():
    """Tune pickles the progress callback and with it the sweep's printer (a closure over the
    heartbeat): a lock in it failed every sweep (TypeError: cannot pickle '_thread.lock')."""
    from ray import cloudpickle

    buf = io.StringIO()
    hb = Heartbeat("geosweep", every=60, stream=buf)

    def printer(line: str) -> None:
        hb.say(line)

    with hb:
        copy = cloudpickle.loads(cloudpickle.dumps(printer))
    copy("[geosweep] from a copy")
    printer("[geosweep] from the original")
    assert buf.getvalue() == "[geosweep] from the original\n"


def test_progress_eta_from_the_first_report_and_one_clock():
    """issue 33 §14: `ETA ?` until the first trial ended, and the progress line's clock started
    after Ray (0 s elapsed while the heartbeat had said 11 s)."""
    from orchestrator.sweep.progress import command_start, eta_seconds

    # 4 trials of 100 steps, two running at step 25 after 10 s of work: 50 of 400 steps
    assert eta_seconds(4, 100, {"a": 25, "b": 25}, set(), 10.0) == pytest.approx(70.0)
    # a stopped trial's slot is free: its whole budget counts as done
    assert eta_seconds(4, 100, {"a": 25, "b": 50}, {"b"}, 10.0) == pytest.approx(
        (400 - 125) / 12.5)
    assert eta_seconds(4, None, {"a": 25}, set(), 10.0) is None  # no budget known yet
    assert eta_seconds(4, 100, {}, set(), 10.0) is None  # nothing reported yet
    start = command_start()
    assert start <= time.time() and start == command_start()
    hb = Heartbeat("x", stream=io.StringIO())
    # the heartbeat counts from the same start: elapsed since the process started
    assert abs((time.monotonic() - hb._t0) - (time.time() - start)) < 0.5
