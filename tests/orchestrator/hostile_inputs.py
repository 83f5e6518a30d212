"""The input tables of issue 28 (tests/orchestrator/hostile_round3.py says the rules):
``secrets``, ``tracebacks``, ``answers``."""

from __future__ import annotations

import shutil
from pathlib import Path

import hostile_kit as kit
from hostile_round3 import (
    _CONT,
    _EVAL,
    _EVAL_WRITES,
    _OUT,
    _REPORT_WRITES,
    BROKEN,
    FOREIGN,
    SECRET,
    Case,
    _fake,
    _manifest,
    _running,
    _trial0_ckpt,
)
from tiny_spec import spec_with

# --- class: secrets --------------------------------------------------------------------------

_USERINFO = f"user:{SECRET}@"


def _secret_cases() -> list[Case]:
    dead = f"http://{_USERINFO}127.0.0.1:9"
    return [
        Case("secrets", "run-mlflow-uri-userinfo-dead", ["run", "{spec}", *_OUT, "--mlflow-uri",
                                                         dead], 2,
             r"--mlflow-uri: MLflow server http://user:\*\*\*@127\.0\.0\.1:9 is unreachable"),
        Case("secrets", "run-mlflow-uri-userinfo-not-mlflow",
             ["run", "{spec}", *_OUT, "--mlflow-uri", f"http://{_USERINFO}{{http}}"], 2,
             r"user:\*\*\*@127\.0\.0\.1:\d+ answers HTTP \d+ at /health"),
        Case("secrets", "run-mlflow-uri-lone-token",
             ["run", "{spec}", *_OUT, "--mlflow-uri", f"https://{SECRET}@127.0.0.1:9"], 2,
             r"https://\*\*\*@127\.0\.0\.1:9 is unreachable"),
        Case("secrets", "run-mlflow-uri-query-token",
             ["run", "{spec}", *_OUT, "--mlflow-uri", f"http://127.0.0.1:9/?token={SECRET}"], 2,
             r"token=\*\*\* is unreachable"),
        Case("secrets", "run-set-tracking-userinfo",
             ["run", "{spec}", *_OUT, "--set", f"tracking.mlflow_uri={dead}"], 2,
             r"user:\*\*\*@.* is unreachable"),
        Case("secrets", "run-spec-tracking-userinfo", ["run", "{spec}", *_OUT], 2,
             r"user:\*\*\*@.* is unreachable",
             spec=spec_with(tracking=f"{{mlflow_uri: '{dead}'}}")),
        Case("secrets", "continuity-mlflow-uri-userinfo", [*_CONT, "--mlflow-uri", dead], 2,
             r"user:\*\*\*@127\.0\.0\.1:9 is unreachable"),
        Case("secrets", "search-p-mlflow-uri-userinfo",
             ["search-p", *_OUT, "--set", f"tracking.mlflow_uri={dead}"], 2,
             r"user:\*\*\*@127\.0\.0\.1:9 is unreachable"),
        *[Case("secrets", f"{cmd}-address-userinfo", [cmd, *extra, "--address", dead], 2,
               r"http://user:\*\*\*@127\.0\.0\.1:9")
          for cmd, extra in (("jobs", []), ("logs", ["j1"]), ("stop", ["j1"]),
                             ("submit", ["{spec}"]))],
        Case("secrets", "jobs-ray-address-env-userinfo", ["jobs"], 2,
             r"http://user:\*\*\*@127\.0\.0\.1:9", env={"RAY_ADDRESS": dead}),
        Case("secrets", "run-address-userinfo",
             ["run", "{spec}", *_OUT, "--address", f"ray://{_USERINFO}127.0.0.1:1"], 2,
             r"--address: cannot reach Ray at ray://user:\*\*\*@127\.0\.0\.1:1"),
        Case("secrets", "run-ray-address-env-userinfo", ["run", "{spec}", *_OUT], 2,
             r"RAY_ADDRESS: cannot reach Ray at ray://user:\*\*\*@",
             env={"RAY_ADDRESS": f"ray://{_USERINFO}127.0.0.1:1"}),
        Case("secrets", "eval-manifest-server-userinfo", _EVAL, 0,
             r"not logging to MLflow: MLflow server http://user:\*\*\*@127\.0\.0\.1:9 is "
             r"unreachable", setup=lambda t: _fake(t, lambda r: _manifest(r, mlflow_uri=dead)),
             makes=("runs/fake/parquet/eval/sweep=fake/*.parquet",), may_change=_EVAL_WRITES),
        Case("secrets", "report-manifest-server-userinfo", ["report", "{fake}"], 0,
             r"not logged: MLflow server http://user:\*\*\*@127\.0\.0\.1:9 is unreachable",
             setup=lambda t: _fake(t, lambda r: _manifest(r, mlflow_uri=dead)),
             makes=("runs/fake/report/report.md",), may_change=("runs/fake/report/**",)),
        Case("secrets", "ui-manifest-server-userinfo", ["ui", "{fake}"], 0,
             r"logs to the MLflow server http://user:\*\*\*@127\.0\.0\.1:9",
             setup=lambda t: _fake(t, lambda r: _manifest(r, mlflow_uri=dead))),
        Case("secrets", "resume-manifest-server-userinfo", ["resume", "{fake}"], 2,
             r"user:\*\*\*@127\.0\.0\.1:9 is unreachable",
             setup=lambda t: _fake(t, lambda r: _manifest(r, mlflow_uri=dead))),
        Case("secrets", "run-env-token-in-uri", ["run", "{spec}", *_OUT, "--mlflow-uri",
                                                 f"http://127.0.0.1:9/{SECRET}/x"], 2,
             r"http://127\.0\.0\.1:9/\*\*\*/x is unreachable",
             env={"MLFLOW_TRACKING_TOKEN": SECRET}),
    ]


# --- class: tracebacks -----------------------------------------------------------------------

_BAD = "u\udcffx"  # a folder name that is not UTF-8 (the byte 0xff, as the file system has it)


def _in_bad_dir(t: Path) -> Path:
    d = t / _BAD
    d.mkdir()
    return d


def _bad_dir_sweep(t: Path) -> None:
    root = kit.fake_sweep(t)
    shutil.move(str(root.parent), str(_in_bad_dir(t) / "runs"))


def _part(t: Path, kind: str, column: str, values: list) -> None:
    """A part of ``kind`` in the fake sweep whose ``column`` holds ``values``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = _fake(t)
    base = {"curves": {"step": [1, 2], "split": ["train", "train"], "metric": ["loss", "loss"],
                       "value": [1.0, 2.0], "wall_time": [0.0, 1.0]},
            "metrics": {"step": [1, 1], "metric": ["m", "m"], "module": ["q", "q"],
                        "layer": [0, 1], "next_layer": [1, 2], "value": [0.5, 0.4]}}[kind]
    cols = dict(base, **{column: values})
    d = root / "parquet" / kind / "sweep=fake" / "trial=abc12_00000"
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), d / "part-00000001-00000002.parquet")


def _trial_part(t: Path, column: str, value) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = _fake(t)
    f = root / "parquet" / "trials" / "sweep=fake" / "trial=abc12_00000.parquet"
    tab = pq.read_table(f)
    i = tab.schema.get_field_index(column)
    tab = tab.set_column(i, column, pa.array([value] * len(tab)))
    pq.write_table(tab, f)


def _layers(t: Path, shapes: list[tuple[int, ...]], role: str = "mlp.c_fc") -> None:
    """A GPT-2 layout of 3 layers whose ``role`` weight has ``shapes[i]`` in layer i."""
    import torch
    from safetensors.torch import save_file

    (t / "model").mkdir()
    tensors = {}
    for i in range(3):
        for r in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            shape = shapes[i] if r == role else (8, 24) if r == "attn.c_attn" else (8, 8)
            tensors[f"transformer.h.{i}.{r}.weight"] = torch.randn(shape)
    save_file(tensors, str(t / "model" / "model.safetensors"))


def _refused_ckpt(t: Path, raw: bytes | None) -> None:
    root = _fake(t, _running)
    f = _trial0_ckpt(root)
    if raw is None:
        kit.evil_state_file(f)
    else:
        f.write_bytes(raw)


def _traceback_cases() -> list[Case]:
    out: list[Case] = []
    for cmd in ("status", "report", "eval", "ui", "resume"):
        argv = ["eval", "runs/fake", "--no-hub"] if cmd == "eval" else [cmd, "runs/fake"]
        out.append(Case("tracebacks", f"{cmd}-folder-path-not-utf8", argv, 2,
                        r"the path '.*u\\xffx/runs/fake' is not valid UTF-8 \(byte 0xff\)",
                        setup=_bad_dir_sweep, cwd=_BAD))
        out.append(Case("tracebacks", f"{cmd}-argv-not-utf8", [cmd, f"{{tmp}}/{_BAD}"], 2,
                        r"argument '.*u\\xffx' is not valid UTF-8 \(byte 0xff",
                        setup=_in_bad_dir))
    out += [
        Case("tracebacks", "run-out-not-utf8", ["run", "{spec}", "--out", "o"], 2,
             r"--out: the path .*u\\xffx/o' is not valid UTF-8", setup=_in_bad_dir, cwd=_BAD),
        Case("tracebacks", "train-out-not-utf8", ["train", "--preset", "gpt-debug", "--out",
                                                  "o"], 2,
             r"--out: the path .*u\\xffx/o' is not valid UTF-8", setup=_in_bad_dir, cwd=_BAD),
        Case("tracebacks", "continuity-out-not-utf8", ["continuity", "{model}", "--out", "c"],
             2, r"--out: the path .*u\\xffx/c' is not valid UTF-8",
             setup=lambda t: (_in_bad_dir(t), kit.nan_model(t)), cwd=_BAD),
    ]
    # Parquet parts of the wrong column types: one line naming the file
    for kind, col, values, typ in (
            ("curves", "step", ["a", "b"], "string"), ("curves", "step", ["1", "x"], "string"),
            ("curves", "value", ["x", "y"], "string"), ("curves", "split", [[1], [2]], "list<.*>"),
            ("curves", "metric", [1.5, 2.5], "double"),
            ("metrics", "layer", ["x", "y"], "string"), ("metrics", "value", ["x", "y"],
                                                          "string"),
            ("metrics", "next_layer", ["one", "two"], "string")):
        out.append(Case("tracebacks", f"report-{kind}-{col}-is-{values[-1]!s:.3}-{typ[:6]}",
                        ["report", "{fake}"], 2,
                        rf"{kind}/sweep=fake/trial=abc12_00000/part-00000001-00000002\.parquet: "
                        rf"column '{col}' is {typ}, a {kind} part holds",
                        setup=lambda t, k=kind, c=col, v=values: _part(t, k, c, v)))
    # numbers written as text, or text as numbers, are read as the schema says: a report
    for kind, col, values in (("curves", "step", ["1", "2"]), ("curves", "split", [1, 2]),
                              ("metrics", "layer", ["0", "1"]), ("metrics", "module", [1, 2])):
        out.append(Case("tracebacks", f"report-{kind}-{col}-castable-{values[0]}",
                        ["report", "{fake}"], 0,
                        r"report written in \d+s: .*fake/report/report\.md",
                        setup=lambda t, k=kind, c=col, v=values: _part(t, k, c, v),
                        makes=("runs/fake/report/report.md",), may_change=_REPORT_WRITES))
    for col, value, typ in (("status", 3, "int64"), ("final_val_loss", "low", "string"),
                            ("arm", 1.5, "double"), ("last_step", "eight", "string")):
        for cmd in ("status", "report"):
            out.append(Case("tracebacks", f"{cmd}-trials-{col}-is-{typ}", [cmd, "{fake}"], 2,
                            rf"trial=abc12_00000\.parquet: column '{col}' is {typ}",
                            setup=lambda t, c=col, v=value: _trial_part(t, c, v)))
    # seeds beyond numpy's and torch's seeders
    for v in ("4294967296", "-1", "18446744073709551616", str(2**70)):
        out.append(Case("tracebacks", f"train-seed-{v}", ["train", "--preset", "gpt-debug",
                                                          "--set", f"train.seed={v}"], 2,
                        r"train\.seed: must be an integer in \[0, 2\*\*32\)"))
    # continuity over layers it cannot compare
    for name, shapes, pat in (
            ("growing", [(8, 8), (16, 8), (24, 8)], r"h\.1\.mlp\.c_fc\.weight has shape "
             r"\(16, 8\) but layer 0's"),
            ("last-differs", [(8, 8), (8, 8), (8, 4)], r"h\.2\.mlp\.c_fc\.weight has shape "
             r"\(8, 4\)"),
            ("one-1d", [(8, 8), (8,), (8, 8)], r"h\.1\.mlp\.c_fc\.weight has shape \(8,\); "
             r"role .* needs a matrix"),
            ("all-1d", [(8,), (8,), (8,)], r"h\.0\.mlp\.c_fc\.weight has shape \(8,\)"),
            ("3d", [(2, 8, 8), (2, 8, 8), (2, 8, 8)], r"has shape \(2, 8, 8\)"),
            ("scalar", [(), (), ()], r"has shape \(\)")):
        out.append(Case("tracebacks", f"continuity-layers-{name}", _CONT, 2, pat,
                        setup=lambda t, s=shapes: _layers(t, s)))
    # resume: a checkpoint its unfinished trial would load is refused, naming the file in
    # the folder (not a worker's temporary copy), before Ray starts
    for name, raw, pat in (("evil", None, r"refused to load: it pickles"),
                           ("truncated", b"PK\x03\x04junk", r"truncated or corrupt"),
                           ("empty", b"", r"truncated or corrupt"),
                           ("garbage", b"\x80\x02garbage" * 10, r"truncated or corrupt")):
        out.append(Case("tracebacks", f"resume-checkpoint-{name}", ["resume", "{fake}"], 2,
                        r"runs/fake/ray/tune/trial_driver_abc12_00000_[^ ]*/step-00000008/"
                        rf"state\.pt: .*{pat}.*resume loads it for its unfinished trial",
                        setup=lambda t, r=raw: _refused_ckpt(t, r)))
    return out


# --- class: answers --------------------------------------------------------------------------

_RANDOM = spec_with(search="{algorithm: random, num_samples: 2}",
                    space="{optim.lr: {loguniform: [1.0e-4, 1.0e-2]}}")


def _answer_cases() -> list[Case]:
    out: list[Case] = []
    for v in ("100000000000000000000", "100001", "1e20"):
        out.append(Case("answers", f"num-samples-{v}-dry-run", ["run", "{spec}", "--dry-run",
                                                                "--set",
                                                                f"search.num_samples={v}"], 2,
                        r"search\.num_samples: ", spec=_RANDOM))
    out += [
        Case("answers", "num-samples-1e20-in-file", ["run", "{spec}", "--dry-run"], 2,
             r"search\.num_samples: Input should be less than or equal to 100000",
             spec=spec_with(_RANDOM, search="{algorithm: random, num_samples: "
                            "100000000000000000000}")),
        Case("answers", "search-seed-2pow32", ["run", "{spec}", "--dry-run", "--set",
                                               "search.seed=4294967296"], 2, r"search\.seed",
             spec=_RANDOM),
    ]
    for name, uri, pat in (
            ("garbage", "garbage", r"a folder store, which MLflow 3 no longer writes"),
            ("relative-folder", "./runs/mlruns", r"a folder store"),
            ("file-uri", "file:///{tmp}/mlruns", r"a folder store"),
            ("absolute-folder", "{tmp}/mlruns", r"a folder store"),
            ("percent-garbage", "qq:%%", r"unknown scheme 'qq'"),
            ("sqlite-no-path", "sqlite://", r"names no database"),
            ("sqlite-memory", "sqlite:///:memory:", r"names no database"),
            ("http-no-host", "http://", r"MLflow server http:// is (unreachable|not a valid)"),
            ("http-bad-port", "http://127.0.0.1:port", r"not a valid URL")):
        for cmd, argv in (("continuity", _CONT), ("run", ["run", "{spec}", *_OUT])):
            out.append(Case("answers", f"{cmd}-mlflow-uri-is-{name}", [*argv, "--mlflow-uri", uri],
                            2, rf"--mlflow-uri: .*{pat}"))
    # a spec whose own fields are wrong is said so before a wrong RAY_ADDRESS
    dead_ray = {"RAY_ADDRESS": "127.0.0.1:1"}
    for name, spec, pat in (
            ("mlflow-unwritable", spec_with(tracking="{mlflow_uri: 'sqlite:////proc/gs/m.db'}"),
             r"--mlflow-uri"),
            ("mlflow-dead-server", spec_with(tracking="{mlflow_uri: 'http://127.0.0.1:9'}"),
             r"--mlflow-uri: MLflow server .* unreachable"),
            ("mlflow-ftp", spec_with(tracking="{mlflow_uri: 'ftp://h/x'}"), r"unknown scheme"),
            ("mlflow-folder-store", spec_with(tracking="{mlflow_uri: 'mlruns'}"),
             r"a folder store"),
            ("parquet-unwritable", spec_with(tracking="{parquet_root: /proc/gs}"),
             r"--parquet-root"),
            ("parquet-scheme", spec_with(tracking="{parquet_root: 'foo://b/x'}"),
             r"--parquet-root: unknown scheme"),
            ("cache-unwritable", spec_with(workload="{preset: gpt-debug, overrides: "
                                                    "{data.cache_dir: /proc/gs}}"),
             r"data\.cache_dir")):
        out.append(Case("answers", f"run-spec-{name}-before-ray-address", ["run", "{spec}",
                                                                           *_OUT], 2, pat,
                        spec=spec, env=dead_ray))
    out += [
        Case("answers", "resume-folder-store-before-ray-address", ["resume", "{fake}"], 2,
             r"is a folder, not an SQLite file", env=dead_ray,
             setup=lambda t: _fake(t, lambda r: BROKEN["folder"][0](r / "mlflow.db"))),
        Case("answers", "resume-foreign-store-before-ray-address", ["resume", "{fake}"], 2,
             r"not an MLflow store", env=dead_ray,
             setup=lambda t: _fake(t, lambda r: FOREIGN["notes-db"][0](r / "mlflow.db"))),
    ]
    # bytes that are not UTF-8, and control characters, in --set values: one line
    for cmd, argv in (("run", ["run", "{spec}", *_OUT]), ("train", ["train", "--preset",
                                                                     "gpt-debug"]),
                      ("search-p", ["search-p", *_OUT]), ("dry-run", ["run", "{spec}",
                                                                       "--dry-run"])):
        out.append(Case("answers", f"{cmd}-set-not-utf8", [*argv, "--set", "name=ab\udcffc"], 2,
                        r"--set value 'name=ab\\xffc' is not valid UTF-8 \(byte 0xff at 7\)"))
        out.append(Case("answers", f"{cmd}-set-control-char", [*argv, "--set",
                                                               "train.device=a\x07b"], 2,
                        r"cannot parse value 'a\\x07b': unacceptable character"))
    out.append(Case("answers", "run-spec-path-not-utf8", ["run", "{tmp}/s\udcff.yaml", *_OUT],
                    2, r"argument '.*s\\xff\.yaml' is not valid UTF-8"))
    return out


CASES: list[Case] = _secret_cases() + _traceback_cases() + _answer_cases()
