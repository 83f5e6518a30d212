"""Bad input through the real CLI: every malformed spec or CLI misuse is ONE line on stderr,
exit code 2, before Ray starts and before anything is written (issue 7, section 4).

Every case runs in its own process with a private ``RAY_TMPDIR``: Ray writes its session
folder there the moment it starts, so an empty folder afterwards proves Ray never started.
The ``--out`` folder does not exist beforehand and must not exist afterwards (for the
existing-sweep case: its contents must be unchanged).

Most cases fork a process that already imported the CLI (spec validation imports torch, which
costs seconds per fresh interpreter on a loaded 2-core machine) and call ``main(argv)`` with
fds 1/2 on files; the cases marked ``fresh`` run ``python -m orchestrator.cli`` from scratch,
which also covers the module entry point and import-time warnings.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tiny_spec import ROOT, spec_with

GOOD = spec_with(name="bad")

# 9 levels of 9 aliases: 9**9 = 387M nodes once expanded (the billion-laughs shape).
BOMB = "name: bad\nworkload: {preset: gpt-debug}\na0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))


def _spec(**sections: str) -> str:
    """GOOD with top-level sections replaced or added (value: the section's flow-style YAML)."""
    return spec_with(GOOD, **sections)


@dataclass
class Case:
    id: str
    argv: list[str]  # {spec}, {out}, {sweep} are filled in
    match: str  # a fragment the one error line must contain (names the bad field/option)
    spec: str | None = None  # YAML text written to {spec}
    existing: bool = False  # create {out}/bad with a file in it first
    blocker: bool = False  # create {out}/bad as a regular file first
    fresh: bool = False  # a new interpreter (python -m orchestrator.cli) instead of a fork
    extra_env: dict[str, str] = field(default_factory=dict)


RUN = ["run", "{spec}", "--out", "{out}"]

CASES = [
    # --- wrong types ----------------------------------------------------------------------
    Case("budget_steps_str", RUN, "budget.steps", _spec(budget="{steps: ten}")),
    Case("num_samples_float", RUN, "search.num_samples",
         _spec(search="{algorithm: random, num_samples: 2.5}",
               space="{optim.lr: {loguniform: [1.0e-4, 1.0e-2]}}")),
    Case("seeds_str", RUN, "seeds", _spec(seeds="abc")),
    Case("seeds_negative", RUN, "seeds", _spec(seeds="[0, -1]")),
    Case("seeds_duplicate", RUN, "seeds", _spec(seeds="[1, 1]")),
    Case("space_not_mapping", RUN, "space", _spec(space="[optim.lr]")),
    Case("param_not_mapping", RUN, "space.optim.lr", _spec(space="{optim.lr: 0.001}")),
    Case("override_wrong_type", RUN, "train.batch_size",
         _spec(workload="{preset: gpt-debug, overrides: {train.batch_size: many}}")),
    Case("cpus_zero", RUN, "resources.cpus_per_worker", _spec(resources="{cpus_per_worker: 0}")),
    Case("top_level_list", RUN, "top level", "- name: bad\n- workload: x\n"),
    Case("invalid_yaml", RUN, "invalid YAML", "name: bad\nworkload: {preset: gpt-debug\n"),
    # --- unknown names --------------------------------------------------------------------
    Case("unknown_family_override", RUN, "residual",
         _spec(workload="{preset: gpt-debug, overrides: {model.residual.family: nope}}")),
    Case("unknown_family_space", RUN, "space.model.residual.family",
         _spec(space="{model.residual.family: {grid: [pre_ln, nope]}}")),
    Case("unknown_preset", RUN, "workload.preset", _spec(workload="{preset: gpt-huge}")),
    Case("unknown_algorithm", RUN, "search.algorithm", _spec(search="{algorithm: bayes}")),
    Case("unknown_scheduler", RUN, "scheduler.type", _spec(scheduler="{type: hyperband}")),
    # --- out of range ---------------------------------------------------------------------
    Case("p_zero", RUN, "space.model.residual.p",
         _spec(workload="{preset: gpt-debug, overrides: {model.residual.family: spheret}}",
               space="{model.residual.p: {grid: [0, 2]}}")),
    Case("p_negative_range", RUN, "space.model.residual.p",
         _spec(workload="{preset: gpt-debug, overrides: {model.residual.family: spheret}}",
               search="{algorithm: random, num_samples: 2}",
               space="{model.residual.p: {uniform: [-1, 4]}}")),
    Case("lr_zero", RUN, "space.optim.lr", _spec(space="{optim.lr: {grid: [0.0, 1.0e-3]}}")),
    Case("lr_negative_override", RUN, "optim.lr",
         _spec(workload="{preset: gpt-debug, overrides: {optim.lr: -0.1}}")),
    Case("loguniform_low_high", RUN, "space.optim.lr",
         _spec(search="{algorithm: random, num_samples: 2}",
               space="{optim.lr: {loguniform: [1.0e-2, 1.0e-4]}}")),
    Case("budget_steps_zero", RUN, "budget.steps", _spec(budget="{steps: 0}")),
    # --- unknown keys ---------------------------------------------------------------------
    Case("unknown_top_key", RUN, "colour", _spec(colour="red")),
    Case("unknown_search_key", RUN, "search.algo", _spec(search="{algo: grid}")),
    Case("unknown_divergence_key", RUN, "divergence", _spec(divergence="{nan_ok: true}")),
    Case("unknown_config_key_space", RUN, "optim.lrr", _spec(space="{optim.lrr: {grid: [1]}}")),
    Case("unknown_config_key_override", RUN, "optim.bogus",
         _spec(workload="{preset: gpt-debug, overrides: {optim.bogus: 1}}")),
    # --- empty / conflicting --------------------------------------------------------------
    Case("empty_space_random", RUN, "space",
         _spec(space="{}", search="{algorithm: random, num_samples: 4}")),
    Case("empty_grid", RUN, "space.optim.lr", _spec(space="{optim.lr: {grid: []}}")),
    Case("two_kinds", RUN, "space.optim.lr",
         _spec(space="{optim.lr: {grid: [1.0e-3], choice: [2.0e-3]}}")),
    Case("grid_num_samples", RUN, "search.num_samples",
         _spec(search="{algorithm: grid, num_samples: 3}")),
    Case("budget_vs_override", RUN, "budget.steps",
         _spec(workload="{preset: gpt-debug, overrides: {train.steps: 9}}")),
    Case("missing_workload", RUN, "workload", "name: bad\nseeds: [0]\n"),
    Case("bad_name", RUN, "name", _spec(name="'Bad Name!'")),
    Case("yaml_bomb", RUN, "alias bomb", BOMB, fresh=True),
    # --- missing files --------------------------------------------------------------------
    Case("missing_corpus", RUN, "data.corpus",
         _spec(workload="{preset: gpt-debug, overrides: {data.corpus: /nonexistent.txt}}")),
    Case("missing_corpus_space", RUN, "data.corpus",
         _spec(space="{data.corpus: {grid: [shakespeare, /nonexistent/x.txt]}}")),
    Case("missing_spec_file", ["run", "/nonexistent/spec.yaml", "--out", "{out}"], "no such file",
         fresh=True),
    Case("unknown_spec_name", ["run", "no_such_spec", "--out", "{out}"], "shipped"),
    # --- CLI misuse -----------------------------------------------------------------------
    Case("resume_and_overwrite", [*RUN, "--resume", "--overwrite"], "--overwrite", GOOD),
    Case("unreachable_address", [*RUN, "--address", "127.0.0.1:1"], "--address", GOOD),
    Case("unreachable_mlflow", [*RUN, "--mlflow-uri", "http://127.0.0.1:9"], "--mlflow-uri", GOOD),
    Case("out_under_a_file", ["run", "{spec}", "--out", "/etc/hostname/x"], "--out", GOOD),
    Case("out_on_procfs", ["run", "{spec}", "--out", "/proc/geosweep-test"], "--out", GOOD),
    Case("existing_sweep_folder", RUN, "--resume", GOOD, existing=True, fresh=True),
    Case("sweep_folder_is_a_file", RUN, "not a folder", GOOD, blocker=True),
    Case("unknown_subcommand", ["frobnicate"], "frobnicate", fresh=True),
    Case("no_subcommand", [], "command"),
    Case("unknown_option", [*RUN, "--frobnicate"], "--frobnicate", GOOD),
    Case("train_unknown_preset", ["train", "--preset", "gpt-huge"], "gpt-huge"),
    Case("train_set_no_equals", ["train", "--preset", "gpt-debug", "--set", "optim.lr"],
         "--set"),
    Case("train_set_bad_value", ["train", "--preset", "gpt-debug", "--set", "optim.lr=-1"],
         "optim.lr"),
    Case("train_set_unknown_key", ["train", "--preset", "gpt-debug", "--set", "optim.bogus=1"],
         "optim.bogus"),
    Case("train_missing_corpus", ["train", "--preset", "gpt-debug", "--set",
                                  "data.corpus=/nonexistent.txt"], "data.corpus"),
    Case("ui_not_a_sweep", ["ui", "{out}"], "not a geosweep sweep folder"),
    Case("ui_bad_port", ["ui", "{out}", "--port", "http"], "--port"),
    Case("status_not_a_sweep", ["status", "/"], "not a geosweep sweep folder"),
    Case("resume_not_a_sweep", ["resume", "{out}"], "not a geosweep sweep folder"),
    Case("checkpoint_not_at_report", RUN, "budget.checkpoint_every",
         _spec(budget="{steps: 4, eval_every: 2, metrics_every: 0, checkpoint_every: 3}")),
    Case("resume_zero_seeds", ["resume", "{sweep}", "--more-seeds", "0"], "--more-seeds",
         existing=True),
    Case("resume_negative_samples", ["resume", "{sweep}", "--num-samples", "-2"],
         "--num-samples", existing=True),
    Case("resume_seeds_and_samples", ["resume", "{sweep}", "--more-seeds", "1",
                                      "--num-samples", "1"], "one of them", existing=True),
    Case("resume_seeds_not_int", ["resume", "{sweep}", "--more-seeds", "many"], "--more-seeds",
         existing=True),
]


def test_enough_cases():
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


def _tree(p: Path) -> list[tuple[str, int]]:
    return sorted((str(f.relative_to(p)), f.stat().st_size) for f in p.rglob("*"))


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """Import what the CLI and a full spec validation import, once, so forked cases start warm."""
    import orchestrator.cli
    import workloads.data  # noqa: F401
    from orchestrator.spec.yaml_reader import load_spec

    orchestrator.cli.build_parser()
    good = tmp_path_factory.mktemp("warm") / "good.yaml"
    good.write_text(GOOD)
    load_spec(good)
    return orchestrator.cli.main


def _forked(main, argv: list[str], env: dict[str, str], cwd: Path, log: Path,
            timeout: float) -> tuple[int, str, str]:
    """``main(argv)`` in a forked child with its own env and fds 1/2 on files."""
    out, err = log.with_suffix(".out"), log.with_suffix(".err")
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 70
        try:
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            fo, fe = os.open(out, os.O_WRONLY | os.O_CREAT), os.open(err, os.O_WRONLY | os.O_CREAT)
            os.dup2(fo, 1)
            os.dup2(fe, 2)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - flushed below
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            code = main(argv)
        except BaseException as e:  # noqa: BLE001 - any escape is a test failure: report it
            import traceback

            traceback.print_exception(e)
            code = 71
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code if isinstance(code, int) else 72)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"{argv}: no answer in {timeout} s")
        time.sleep(0.05)
    return os.waitstatus_to_exitcode(status), out.read_text(), err.read_text()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path: Path, warm):
    spec, out, ray_tmp = tmp_path / "spec.yaml", tmp_path / "out", tmp_path / "raytmp"
    ray_tmp.mkdir()
    if case.spec is not None:
        spec.write_text(case.spec)
    before = None
    if case.existing:
        (out / "bad").mkdir(parents=True)
        (out / "bad" / "sweep.json").write_text("{}")
        before = _tree(out)
    if case.blocker:
        out.mkdir()
        (out / "bad").write_text("not a sweep")
        before = _tree(out)
    argv = [a.format(spec=spec, out=out, sweep=out / "bad") for a in case.argv]
    env = dict(os.environ, RAY_TMPDIR=str(ray_tmp), TMPDIR=str(ray_tmp),
               RAY_USAGE_STATS_ENABLED="0", **case.extra_env)
    if case.fresh:
        proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=90)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    else:
        rc, stdout, stderr = _forked(warm, argv, env, ROOT, tmp_path / "log", timeout=90)
    lines = stderr.rstrip("\n").split("\n")
    assert rc == 2, (rc, stderr[-2000:])
    assert len(lines) == 1 and lines[0].strip(), f"not one line: {stderr!r}"
    assert lines[0].startswith("geosweep: error: "), lines[0]
    assert case.match in lines[0], lines[0]
    assert stdout == "", stdout
    # no Ray: it would have made RAY_TMPDIR/ray/session_*; nothing else may write there either
    assert list(ray_tmp.iterdir()) == [], list(ray_tmp.rglob("*"))[:5]
    if before is None:
        assert not out.exists(), _tree(out)
    else:
        assert _tree(out) == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flag", ["--resume", "--overwrite"])
def test_existing_folder_flags(flag: str, tmp_path: Path, warm, monkeypatch):
    """The other side of the refusal: --resume keeps the folder and resumes, --overwrite
    empties it first. ``_execute`` (where Ray would start) is replaced by a recorder."""
    import orchestrator.cli.run as cli

    spec, out = tmp_path / "spec.yaml", tmp_path / "out"
    spec.write_text(GOOD)
    (out / "bad").mkdir(parents=True)
    # a sweep.json as `run` writes it: a resume checks where the folder's files say it writes
    (out / "bad" / "sweep.json").write_text('{"name": "bad", "trials": 1}')
    calls = []
    monkeypatch.setattr(cli, "execute", lambda s, o, a, resume, keep_ray=False:
                        calls.append((o, resume)) or 0)
    assert warm(["run", str(spec), "--out", str(out), flag]) == 0
    assert calls == [(out.resolve(), flag == "--resume")]
    assert (out / "bad" / "sweep.json").exists() == (flag == "--resume")
