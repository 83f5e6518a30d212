"""The second round of tests/orchestrator/cli/test_hostile.py's table: the issue-15 cases the
first round did not reach (eval, report, ui and continuity on broken artefacts, full disk is
tests/orchestrator/cli/test_full_disk.py) and new attacker / tired-user cases. Same rules:
exit code + one stderr line, no traceback, nothing half-written; a code-0 case names what it
must have written. None reaches Ray."""

from __future__ import annotations

from pathlib import Path

import hostile_kit as kit
from hostile_kit import Case, sweep_folder
from tiny_spec import spec_with

_OUT = ["--out", "{tmp}/out"]
_EVAL = ["eval", "{fake}", "--no-hub", "--max-batches", "1"]
_CONT = ["continuity", "{model}", "--out", "{tmp}/c"]


def _trial0_final(root: Path) -> Path:
    return [p for p in kit.state_files(root) if "abc12_00000" in str(p)][-1]


def _grid(n_params: int, n_values: int) -> str:
    keys = ["optim.lr", "optim.weight_decay", "train.batch_size"][:n_params]
    return "{" + ", ".join(f"{k}: {{grid: [{', '.join(str(j + 1) for j in range(n_values))}]}}"
                           for k in keys) + "}"


CASES: list[Case] = [
    # MLflow store corrupt: Parquet is written all the same; ui refuses the store
    Case("eval-truncated-mlflow-db-writes-parquet", _EVAL, 0, r"not logging to MLflow: .*"
         r"unreadable", setup=lambda t: kit.fake_with(t, lambda r: kit.truncate(
             r / "mlflow.db", 20000)), makes=("runs/fake/parquet/eval/sweep=fake/*.parquet",)),
    Case("report-truncated-mlflow-db-writes-report", ["report", "{fake}"], 0,
         r"report written in \d+s: .*report\.md",
         setup=lambda t: kit.fake_with(t, lambda r: kit.truncate(r / "mlflow.db", 20000)),
         makes=("runs/fake/report/report.md", "runs/fake/report/arms.csv")),
    Case("ui-truncated-mlflow-db", ["ui", "{fake}"], 2, r"mlflow.db: is (unreadable|corrupt)",
         setup=lambda t: kit.fake_with(t, lambda r: kit.truncate(
             r / "mlflow.db", 20000))),
    Case("ui-mlflow-db-not-sqlite", ["ui", "{fake}"], 2, r"not an SQLite database",
         setup=lambda t: kit.fake_with(t, lambda r: (r / "mlflow.db").write_text("hello"))),
    # report --metric on a label column blanked it and overwrote the report
    *[Case(f"report-metric-{m}", ["report", "{fake}", "--metric", m], 2,
           rf"--metric: '{m}' is not a numeric per-trial value", setup=kit.fake_sweep)
      for m in ("status", "trial", "arm", "seed")],
    # eval on broken or foreign checkpoints
    Case("eval-truncated-checkpoint", _EVAL, 2, r"state.pt: not a readable checkpoint",
         setup=lambda t: kit.fake_with(t, lambda r: kit.truncate(_trial0_final(r), 1000))),
    Case("eval-evil-checkpoint", _EVAL, 2, r"state.pt: refused to load: it pickles",
         setup=lambda t: kit.fake_with(t, lambda r: kit.evil_state_file(_trial0_final(r)))),
    Case("eval-parquet-symlink-outside", _EVAL, 2, r"parquet is a symlink to .*outside the "
         r"sweep folder", setup=lambda t: kit.fake_with(t, lambda r: kit.symlink_out(
             r, "parquet", t))),
    Case("report-symlink-outside", ["report", "{fake}"], 2, r"report is a symlink to .*outside",
         setup=lambda t: kit.fake_with(t, lambda r: kit.symlink_out(r, "report", t))),
    Case("eval-env-cache-unwritable", _EVAL, 2, r"GEOSWEEP_CACHE: /proc/geosweep",
         setup=kit.fake_sweep, env={"GEOSWEEP_CACHE": "/proc/geosweep"}),
    Case("eval-trial-empty-string", [*_EVAL, "--trial", ""], 2, r"--trial: unknown trial ''",
         setup=kit.fake_sweep),
    Case("report-baseline-unknown", ["report", "{fake}", "--baseline", "nope"], 2,
         r"--baseline: unknown arm 'nope'", setup=kit.fake_sweep),
    Case("status-leftover-tmp-part", ["status", "{fake}"], 0, r"3 trials planned, 3 recorded",
         setup=lambda t: kit.fake_with(t, lambda r: (
             r / "parquet/trials/sweep=fake/_trial=x.parquet.tmp-1").write_bytes(b"half"))),
    # eval --corpus traps
    Case("eval-corpus-bad-utf8-after-64k", [*_EVAL, "--corpus", "late_bad.txt"], 2,
         r"late_bad.txt is not UTF-8 text \(byte 84000",
         setup=lambda t: (kit.fake_sweep(t), kit.corpus(t, "late_bad.txt"))),
    Case("eval-corpus-latin1", [*_EVAL, "--corpus", "latin1.txt"], 2, r"not UTF-8 text",
         setup=lambda t: (kit.fake_sweep(t), kit.corpus(t, "latin1.txt"))),
    *[Case(f"eval-corpus-{k}-column", [*_EVAL, "--corpus", f"{k}_text.parquet"], 2,
           rf"column 'text' holds {k}.*, not text",
           setup=lambda t, k=k: (kit.fake_sweep(t), kit.corpus(t, f"{k}_text.parquet")))
      for k in ("int", "bin", "list")],
    # sweep.json whose name would be a path
    *[Case(f"{cmd}-manifest-name-traversal", [cmd, "{sweep}"], 2, r"is not a sweep name",
           setup=lambda t: sweep_folder(t, manifest={"name": "../../pwn", "trials": 1}))
      for cmd in ("status", "eval", "report")],
    Case("status-manifest-is-fifo", ["status", "{tmp}/runs/x"], 2, r"no sweep.json",
         setup=lambda t: kit.fifo(t / "runs" / "x" / "sweep.json")),
    Case("resume-spec-is-symlink-to-passwd", ["resume", "{sweep}"], 2, r"spec",
         setup=lambda t: _spec_link(t)),
    # continuity: where it writes is checked before the checkpoint is read
    Case("continuity-mlflow-dead-server", [*_CONT, "--mlflow-uri", "http://127.0.0.1:9"], 2,
         r"--mlflow-uri: MLflow server .* unreachable"),
    Case("continuity-mlflow-ftp", [*_CONT, "--mlflow-uri", "ftp://h/x"], 2,
         r"--mlflow-uri: unknown scheme 'ftp'"),
    Case("continuity-out-is-file", ["continuity", "{model}", "--out", "{tmp}/f"], 2,
         r"--out: .* not a folder", setup=lambda t: (t / "f").write_text("x")),
    Case("continuity-fifo-safetensors", _CONT, 2, r"model.safetensors is not a regular file",
         setup=lambda t: kit.fifo(t / "model" / "model.safetensors")),
    Case("continuity-fifo-config", _CONT, 2, r"config.json is not a regular file",
         setup=lambda t: (kit.model(t, "state.pt", b""), kit.fifo(t / "model/config.json"))),
    Case("continuity-devzero-safetensors", _CONT, 2, r"not a regular file",
         setup=lambda t: ((t / "model").mkdir(), (t / "model/model.safetensors").symlink_to(
             "/dev/zero"))),
    Case("continuity-hub-offline", ["continuity", "someone/some-model", "--out", "{tmp}/c"], 2,
         r"hub is offline"),
    # sizes: a count of 1e30 started Ray and trained forever
    Case("run-budget-steps-1e30", ["run", "{spec}", *_OUT], 2, r"train.steps: at most 1e\+09",
         spec=spec_with(budget="{steps: " + "1" + "0" * 30 + ", eval_every: 2}")),
    Case("run-set-budget-steps-huge", ["run", "{spec}", *_OUT, "--set",
                                       "budget.steps=99999999999"], 2, r"at most 1e\+09"),
    Case("train-steps-1e12", ["train", "--preset", "gpt-debug", "--set",
                              "train.steps=1000000000000"], 2, r"train.steps: at most"),
    Case("train-batch-size-huge", ["train", "--preset", "gpt-debug", "--set",
                                   "train.batch_size=100000000000"], 2, r"train.batch_size"),
    Case("train-steps-float", ["train", "--preset", "gpt-debug", "--set", "train.steps=4.5"], 2,
         r"train.steps"),
    # a model no machine here can hold: refused before Ray (it ran out of memory in the trial)
    Case("train-model-too-big", ["train", "--preset", "gpt-debug", "--set", "model.n_embd=640000",
                                 "--set", "model.n_head=1"], 2,
         r"--preset gpt-debug: a model of 9\.8\de\+12 parameters needs at least .* GiB"),
    Case("run-space-model-too-big", ["run", "{spec}", *_OUT], 2,
         r"space\.model\.n_embd=1000000: a model of .* parameters needs at least",
         spec=spec_with(space="{model.n_embd: {grid: [64, 1000000]}, model.n_head: {grid: [1]}}")),
    Case("run-grid-64M-arms-dry-run", ["run", "{spec}", "--dry-run"], 2, r"64000000 arms",
         spec=spec_with(space=_grid(3, 400))),
    # a local Ray cannot hold the trial: Tune would only warn, forever
    Case("run-cpus-beyond-machine", ["run", "{spec}", *_OUT], 2, r"needs 100000 CPUs",
         spec=spec_with(resources="{workers_per_trial: 1, cpus_per_worker: 100000}")),
    Case("run-workers-beyond-machine", ["run", "{spec}", *_OUT], 2, r"needs 100000 CPUs",
         spec=spec_with(resources="{workers_per_trial: 100000, cpus_per_worker: 1}")),
    Case("run-gpus-beyond-machine", ["run", "{spec}", *_OUT], 2, r"needs 512 GPUs",
         spec=spec_with(resources="{workers_per_trial: 2, cpus_per_worker: 0.5, "
                                  "gpus_per_worker: 256}")),
    Case("run-custom-resource-local", ["run", "{spec}", *_OUT], 2, r"resources.custom: tpu",
         spec=spec_with(resources="{cpus_per_worker: 1, custom: {tpu: 1}}")),
    # names and specs
    Case("spec-name-newline", ["run", "{spec}", *_OUT], 2, r"name",
         spec=spec_with(name='"tiny\\nx"')),
    Case("spec-name-unicode", ["run", "{spec}", *_OUT], 2, r"name", spec=spec_with(name="tïny")),
    Case("spec-name-300-chars", ["run", "{spec}", *_OUT], 2, r"name",
         spec=spec_with(name="a" * 300)),
    Case("spec-name-dotdot", ["run", "{spec}", *_OUT], 2, r"name", spec=spec_with(name="..")),
    Case("spec-is-fifo", ["run", "{tmp}/fifo.yaml", *_OUT], 2, r"fifo.yaml",
         setup=lambda t: kit.fifo(t / "fifo.yaml")),
    Case("spec-is-dev-zero", ["run", "/dev/zero", *_OUT], 2, r"/dev/zero"),
    Case("run-set-bad-yaml", ["run", "{spec}", *_OUT, "--set", "budget={{steps: ["], 2,
         r"--set budget: cannot parse"),
    Case("run-env-cache-unwritable", ["run", "{spec}", *_OUT], 2, r"data.cache_dir: /proc",
         env={"GEOSWEEP_CACHE": "/proc/geosweep"}),
    # train
    Case("train-set-bad-yaml", ["train", "--preset", "gpt-debug", "--set",
                                "model.residual={{family: ["], 2, r"cannot parse value"),
    Case("train-device-cuda-without-cuda", ["train", "--preset", "gpt-debug", "--set",
                                            "train.device=cuda"], 2, r"no CUDA device",
         no_cuda=True),
    Case("train-cache-dir-unwritable", ["train", "--preset", "gpt-debug", "--set",
                                        "data.cache_dir=/proc/geosweep"], 2, r"data.cache_dir"),
    Case("train-env-cache-unwritable", ["train", "--preset", "gpt-debug"], 2,
         r"data.cache_dir: /proc", env={"GEOSWEEP_CACHE": "/proc/geosweep"}),
    Case("train-resume-other-model", ["train", "--preset", "gpt-debug", "--set",
                                      "model.n_layer=3", "--out", "{tmp}/o", "--resume"], 2,
         r"--resume: the checkpoint .* is of another model", setup=lambda t: _own_ckpt(t)),
    # status --watch, ui
    *[Case(f"status-watch-{v}", ["status", "{sweep}", "--watch", v], 2, r"--watch",
           setup=lambda t: sweep_folder(t)) for v in ("0", "nan", "inf", "-1")],
    Case("ui-host-unresolvable", ["ui", "{sweep}", "--host", "999.1.1.1"], 2, r"--host",
         setup=lambda t: sweep_folder(t)),
    Case("ui-port-zero", ["ui", "{sweep}", "--port", "0"], 2, r"1..65535",
         setup=lambda t: sweep_folder(t)),
    # cluster commands at a dead address
    Case("jobs-dead-address", ["jobs", "--address", "http://127.0.0.1:9"], 2, r"cannot reach"),
]


def _spec_link(t: Path) -> None:
    root = sweep_folder(t, spec=None)
    (root / "spec.yaml").symlink_to("/etc/passwd")


def _own_ckpt(t: Path) -> None:
    """A real gpt-debug checkpoint (the fake sweep's) under {tmp}/o/checkpoints."""
    import shutil

    src = _trial0_final(kit.fake_sweep(t))
    dst = t / "o" / "checkpoints" / "step-00000008"
    dst.mkdir(parents=True)
    shutil.copy(src, dst / "state.pt")
