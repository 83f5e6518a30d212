"""Hostile and tired-user input across every subcommand (issue 15): each case is argv + files
set up -> the exit code and ONE stderr line matching a pattern, no traceback, and nothing
half-written (the --out folder of a refused `run` is not created).

The CLI runs in-process through ``main(argv)`` (the imports are paid once); no case reaches
Ray (a case that did would fail its timeout, and `run` cases would leave a sweep folder).
"""

from __future__ import annotations

import re
from pathlib import Path

import hostile_cases
import hostile_kit as kit
import pytest
from hostile_kit import SPEC, Case, sweep_folder
from tiny_spec import spec_with

from orchestrator.cli import main


def _bad_manifests() -> list[tuple[str, bytes]]:
    return [("empty", b""), ("truncated", b'{"name": "ti'), ("list", b"[]"), ("null", b"null"),
            ("int_name", b'{"name": 5}'), ("no_name", b'{"trials": 2}'),
            ("neg_trials", b'{"name": "tiny", "trials": -1}'),
            ("str_trials", b'{"name": "tiny", "trials": "2"}'),
            ("uri_int", b'{"name": "tiny", "mlflow_uri": 5}'),
            ("binary", b"\xff\xfe\x00garbage")]


CASES: list[Case] = []
for _cmd in ("status", "report", "eval", "resume", "ui"):
    for _kind, _raw in _bad_manifests():
        CASES.append(Case(f"{_cmd}-manifest-{_kind}", [_cmd, "{sweep}"], 2,
                          r"sweep\.json",
                          setup=lambda t, r=_raw: sweep_folder(t, raw=r)))
    CASES.append(Case(f"{_cmd}-missing-dir", [_cmd, "{tmp}/nope"], 2, r"not a geosweep"))
    CASES.append(Case(f"{_cmd}-dir-is-file", [_cmd, "{tmp}/file"], 2, r"not a geosweep",
                      setup=lambda t: (t / "file").write_text("x")))

_OUT = ["--out", "{tmp}/out"]
CASES += [
    # where a sweep writes: refused before Ray starts
    Case("mlflow-unknown-scheme", ["run", "{spec}", *_OUT, "--mlflow-uri", "ftp://h/x"], 2,
         r"--mlflow-uri: unknown scheme 'ftp'"),
    Case("mlflow-garbage", ["run", "{spec}", *_OUT, "--mlflow-uri", "qq:%%"], 2,
         r"--mlflow-uri"),
    Case("mlflow-sqlite-no-path", ["run", "{spec}", *_OUT, "--mlflow-uri", "sqlite://"], 2,
         r"--mlflow-uri: .* names no database"),
    Case("mlflow-sqlite-memory", ["run", "{spec}", *_OUT, "--mlflow-uri", "sqlite:///:memory:"],
         2, r"names no database"),
    Case("mlflow-sqlite-is-dir", ["run", "{spec}", *_OUT, "--mlflow-uri", "sqlite:///{tmp}"], 2,
         r"is a folder"),
    Case("mlflow-sqlite-not-sqlite", ["run", "{spec}", *_OUT, "--mlflow-uri",
                                      "sqlite:///{tmp}/f.db"], 2, r"not an SQLite database",
         setup=lambda t: (t / "f.db").write_text("hello")),
    Case("mlflow-sqlite-under-file", ["run", "{spec}", *_OUT, "--mlflow-uri",
                                      "sqlite:///{tmp}/file/m.db"], 2, r"--mlflow-uri",
         setup=lambda t: (t / "file").write_text("x")),
    Case("mlflow-sqlite-proc", ["run", "{spec}", *_OUT, "--mlflow-uri",
                                "sqlite:////proc/geosweep/m.db"], 2, r"--mlflow-uri"),
    Case("mlflow-folder-under-file", ["run", "{spec}", *_OUT, "--mlflow-uri", "{tmp}/file/x"],
         2, r"--mlflow-uri", setup=lambda t: (t / "file").write_text("x")),
    Case("mlflow-dead-server", ["run", "{spec}", *_OUT, "--mlflow-uri", "http://127.0.0.1:9"],
         2, r"unreachable"),
    Case("parquet-unknown-scheme", ["run", "{spec}", *_OUT, "--parquet-root", "foo://b/x"], 2,
         r"--parquet-root: unknown scheme 'foo'"),
    Case("parquet-ftp", ["run", "{spec}", *_OUT, "--parquet-root", "ftp://b/x"], 2,
         r"unknown scheme"),
    Case("parquet-under-file", ["run", "{spec}", *_OUT, "--parquet-root", "{tmp}/file/p"], 2,
         r"--parquet-root", setup=lambda t: (t / "file").write_text("x")),
    Case("parquet-is-file", ["run", "{spec}", *_OUT, "--parquet-root", "{tmp}/file"], 2,
         r"--parquet-root: .* not a folder", setup=lambda t: (t / "file").write_text("x")),
    Case("parquet-proc", ["run", "{spec}", *_OUT, "--parquet-root", "/proc/geosweep"], 2,
         r"--parquet-root"),
    Case("cache-dir-under-file", ["run", "{spec}", *_OUT], 2, r"data.cache_dir",
         spec=spec_with(workload="{preset: gpt-debug, overrides: {data.cache_dir: /proc/gs}}")),
    Case("out-is-file", ["run", "{spec}", "--out", "{tmp}/file"], 2, r"--out",
         setup=lambda t: (t / "file").write_text("x")),
    Case("out-under-file", ["run", "{spec}", "--out", "{tmp}/file/deeper"], 2, r"--out",
         setup=lambda t: (t / "file").write_text("x")),
    Case("out-proc", ["run", "{spec}", "--out", "/proc/geosweep"], 2, r"--out"),
    # seeds, sizes, numbers
    Case("seed-2pow32", ["run", "{spec}", *_OUT], 2, r"seeds.*2\*\*32",
         spec=spec_with(seeds="[4294967296]")),
    Case("seed-huge", ["run", "{spec}", *_OUT], 2, r"seeds", spec=spec_with(seeds=f"[{2**70}]")),
    Case("seed-negative", ["run", "{spec}", *_OUT], 2, r"seeds", spec=spec_with(seeds="[-1]")),
    Case("seed-float", ["run", "{spec}", *_OUT], 2, r"seeds", spec=spec_with(seeds="[0.5]")),
    Case("seed-bool", ["run", "{spec}", *_OUT], 2, r"seeds", spec=spec_with(seeds="[true]")),
    Case("seeds-count-huge", ["run", "{spec}", *_OUT], 2, r"seeds",
         spec=spec_with(seeds="100000000")),
    Case("seeds-zero", ["run", "{spec}", *_OUT], 2, r"seeds", spec=spec_with(seeds="0")),
    Case("seeds-empty-list", ["run", "{spec}", *_OUT], 2, r"seeds", spec=spec_with(seeds="[]")),
    Case("seeds-dupes", ["run", "{spec}", *_OUT], 2, r"seeds", spec=spec_with(seeds="[1, 1]")),
    Case("grid-64M-arms", ["run", "{spec}", *_OUT], 2, r"arms.*100000",
         spec=spec_with(space="{" + ", ".join(
             f"model.x{i}: {{grid: [{', '.join(str(j) for j in range(10))}]}}"
             for i in range(8)) + "}")),
    Case("grid-110k-trials-dry-run", ["run", "{spec}", "--dry-run"], 2, r"grid trials",
         spec=spec_with(space="{optim.lr: {grid: [" + ", ".join(
             f"{j + 1}.0e-4" for j in range(11)) + "]}}", seeds="10000")),
    Case("lr-inf-grid", ["run", "{spec}", *_OUT], 2, r"optim.lr",
         spec=spec_with(space="{optim.lr: {grid: [.inf]}}")),
    Case("lr-nan-grid", ["run", "{spec}", *_OUT], 2, r"optim.lr",
         spec=spec_with(space="{optim.lr: {grid: [.nan]}}")),
    Case("steps-negative", ["run", "{spec}", *_OUT], 2, r"steps",
         spec=spec_with(budget="{steps: -4}")),
    Case("spec-empty-file", ["run", "{spec}", *_OUT], 2, r".", spec=""),
    Case("spec-binary", ["run", "{spec}", *_OUT], 2, r".", spec="\x00\x01\x02"),
    Case("spec-list", ["run", "{spec}", *_OUT], 2, r".", spec="- a\n- b\n"),
    Case("spec-name-traversal", ["run", "{spec}", *_OUT], 2, r"name",
         spec=spec_with(name="../../etc")),
    Case("spec-name-slash", ["run", "{spec}", *_OUT], 2, r"name", spec=spec_with(name="a/b")),
    Case("spec-missing", ["run", "{tmp}/nope.yaml", *_OUT], 2, r"nope"),
    Case("spec-is-dir", ["run", "{tmp}", *_OUT], 2, r"."),
    Case("run-resume-and-overwrite", ["run", "{spec}", *_OUT, "--resume", "--overwrite"], 2,
         r"mutually exclusive"),
    Case("run-existing-folder", ["run", "{spec}", "--out", "{tmp}/runs"], 2,
         r"already exists", setup=lambda t: sweep_folder(t)),
    # resume: extensions and moved folders
    Case("resume-more-seeds-zero", ["resume", "{sweep}", "--more-seeds", "0"], 2, r">= 1",
         setup=lambda t: sweep_folder(t)),
    Case("resume-more-seeds-negative", ["resume", "{sweep}", "--more-seeds", "-3"], 2, r">= 1",
         setup=lambda t: sweep_folder(t)),
    Case("resume-more-seeds-billion", ["resume", "{sweep}", "--more-seeds", "1000000000"], 2,
         r"--more-seeds must be <= 10000", setup=lambda t: sweep_folder(t)),
    Case("resume-num-samples-billion", ["resume", "{sweep}", "--num-samples", "1000000000"], 2,
         r"--num-samples must be <= ", setup=lambda t: sweep_folder(t)),
    Case("resume-both-extensions", ["resume", "{sweep}", "--more-seeds", "1",
                                    "--num-samples", "1"], 2, r"one of them",
         setup=lambda t: sweep_folder(t)),
    Case("resume-more-seeds-text", ["resume", "{sweep}", "--more-seeds", "many"], 2,
         r"more-seeds", setup=lambda t: sweep_folder(t)),
    Case("resume-renamed-folder", ["resume", "{tmp}/runs/tiny-old"], 2,
         r"named 'tiny' but the folder is 'tiny-old'",
         setup=lambda t: sweep_folder(t, name="tiny-old")),
    Case("resume-no-spec", ["resume", "{sweep}"], 2, r"no spec\.yaml",
         setup=lambda t: sweep_folder(t, spec=None)),
    Case("resume-broken-spec", ["resume", "{sweep}"], 2, r".",
         setup=lambda t: sweep_folder(t, spec="name: [")),
    # continuity: model folders from elsewhere
    Case("continuity-evil-state", ["continuity", "{model}", "--out", "{tmp}/c"], 2,
         r"refused to load: it pickles .*system", setup=lambda t: kit.evil_state(t)),
    Case("continuity-truncated-state", ["continuity", "{model}", "--out", "{tmp}/c"], 2,
         r"truncated or corrupt", setup=lambda t: kit.model(t, "state.pt", b"PK\x03\x04junk")),
    Case("continuity-empty-state", ["continuity", "{model}", "--out", "{tmp}/c"], 2,
         r"truncated or corrupt", setup=lambda t: kit.model(t, "state.pt", b"")),
    Case("continuity-garbage-safetensors", ["continuity", "{model}", "--out", "{tmp}/c"], 2,
         r"not a readable safetensors",
         setup=lambda t: kit.model(t, "model.safetensors", b"\x00" * 64)),
    Case("continuity-index-not-json", ["continuity", "{model}", "--out", "{tmp}/c"], 2,
         r"not valid JSON", setup=lambda t: kit.model(t, "model.safetensors.index.json", b"{")),
    Case("continuity-index-no-map", ["continuity", "{model}", "--out", "{tmp}/c"], 2,
         r"weight_map", setup=lambda t: kit.model(t, "model.safetensors.index.json", b"{}")),
    Case("continuity-index-traversal", ["continuity", "{model}", "--out", "{tmp}/c"], 2,
         r"weight_map", setup=lambda t: kit.model(t, "model.safetensors.index.json",
                                               b'{"weight_map": {"a": "../../etc/passwd"}}')),
    Case("continuity-index-missing-shard", ["continuity", "{model}", "--out", "{tmp}/c"], 2,
         r"missing shards", setup=lambda t: kit.model(t, "model.safetensors.index.json",
                                                   b'{"weight_map": {"a": "s1.safetensors"}}')),
    Case("continuity-empty-folder", ["continuity", "{model}", "--out", "{tmp}/c"], 2,
         r"holds no model", setup=lambda t: (t / "model").mkdir()),
    Case("continuity-nan-weights", ["continuity", "{model}", "--out", "{tmp}/c"], 2,
         r"NaN or inf", setup=lambda t: kit.nan_model(t)),
    Case("continuity-config-not-object", ["continuity", "{model}", "--out", "{tmp}/c"], 2,
         r"config.json", setup=lambda t: kit.nan_model(t, config=b"[1, 2]")),
    # lock
    Case("run-locked", ["run", "{spec}", "--out", "{tmp}/runs", "--resume"], 2,
         r"in use by another geosweep \(pid \d+", setup=lambda t: kit.locked(t)),
    Case("resume-locked", ["resume", "{sweep}"], 2, r"in use by another geosweep",
         setup=lambda t: kit.locked(t)),
    Case("run-overwrite-locked", ["run", "{spec}", "--out", "{tmp}/runs", "--overwrite"], 2,
         r"in use by another geosweep", setup=lambda t: kit.locked(t)),
    # train (no Ray)
    Case("train-out-is-file", ["train", "--preset", "gpt-debug", "--out", "{tmp}/file"], 2,
         r"--out: .* not a folder", setup=lambda t: (t / "file").write_text("x")),
    Case("train-out-under-file", ["train", "--preset", "gpt-debug", "--out", "{tmp}/file/o"], 2,
         r"--out", setup=lambda t: (t / "file").write_text("x")),
    Case("train-lr-inf", ["train", "--preset", "gpt-debug", "--set", "optim.lr=.inf"], 2,
         r"optim.lr: must be finite"),
    Case("train-lr-nan", ["train", "--preset", "gpt-debug", "--set", "optim.lr=.nan"], 2,
         r"optim.lr"),
    Case("train-lr-zero", ["train", "--preset", "gpt-debug", "--set", "optim.lr=0"], 2,
         r"optim.lr: must be > 0"),
    Case("train-steps-text", ["train", "--preset", "gpt-debug", "--set", "train.steps=lots"], 2,
         r"train.steps"),
    Case("train-device-tpu", ["train", "--preset", "gpt-debug", "--set", "train.device=tpu"], 2,
         r"train.device"),
    Case("train-unknown-preset", ["train", "--preset", "gpt-9000"], 2, r"gpt-9000"),
    Case("train-set-no-equals", ["train", "--preset", "gpt-debug", "--set", "optim.lr"], 2,
         r"key=value"),
    Case("train-set-unknown-key", ["train", "--preset", "gpt-debug", "--set", "optim.lrr=1"], 2,
         r"optim.lrr"),
    Case("train-resume-evil-checkpoint", ["train", "--preset", "gpt-debug", "--out", "{tmp}/o",
                                          "--resume"], 2, r"refused to load",
         setup=lambda t: kit.evil_ckpt(t)),
    Case("train-resume-truncated-checkpoint", ["train", "--preset", "gpt-debug", "--out",
                                               "{tmp}/o", "--resume"], 2,
         r"truncated or corrupt", setup=lambda t: kit.evil_ckpt(t, b"PK\x03\x04")),
    # broken Parquet parts
    Case("status-zero-byte-parquet", ["status", "{sweep}"], 2, r"Parquet",
         setup=lambda t: kit.parquet_part(t, b"")),
    Case("status-garbage-parquet", ["status", "{sweep}"], 2, r"Parquet",
         setup=lambda t: kit.parquet_part(t, b"PAR1garbage")),
    Case("report-zero-byte-parquet", ["report", "{sweep}"], 2, r"Parquet",
         setup=lambda t: kit.parquet_part(t, b"")),
    # Ray addresses: reached with a timeout and a gRPC handshake, RAY_ADDRESS too
    Case("run-address-http-not-gcs", ["run", "{spec}", *_OUT, "--address", "{http}"], 2,
         r"--address: .* not a Ray GCS"),
    Case("run-address-dead", ["run", "{spec}", *_OUT, "--address", "127.0.0.1:1"], 2,
         r"--address: cannot reach Ray"),
    Case("run-address-bad-port", ["run", "{spec}", *_OUT, "--address", "ray://h:x"], 2,
         r"--address: .* not host:port"),
    Case("run-ray-address-env-dead", ["run", "{spec}", *_OUT], 2, r"RAY_ADDRESS: cannot reach",
         env={"RAY_ADDRESS": "127.0.0.1:1"}),
    Case("run-ray-address-env-http", ["run", "{spec}", *_OUT], 2, r"RAY_ADDRESS: .* not a Ray",
         env={"RAY_ADDRESS": "{http}"}),
    Case("resume-ray-address-env-dead", ["resume", "{sweep}"], 2, r"RAY_ADDRESS: cannot reach",
         env={"RAY_ADDRESS": "127.0.0.1:1"}, setup=lambda t: sweep_folder(t)),
    Case("search-p-address-dead", ["search-p", *_OUT, "--address", "127.0.0.1:1"], 2,
         r"--address: cannot reach Ray"),
    # misc
    Case("no-command", [], 2, r"command"),
    Case("unknown-command", ["explode"], 2, r"invalid choice"),
    Case("ui-port-text", ["ui", "{sweep}", "--port", "http"], 2, r"port",
         setup=lambda t: sweep_folder(t)),
]
CASES += hostile_cases.CASES  # the second round (re-audit of issue 15)


@pytest.fixture(autouse=True)
def _reap():
    yield
    while kit.CHILDREN:
        p = kit.CHILDREN.pop()
        p.kill()
        p.wait()


def test_at_least_100_cases():
    assert len(CASES) >= 100, len(CASES)
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.fixture(scope="module")
def http_port():
    """An HTTP server that is not Ray (as the dashboard's port 8265 would be)."""
    import http.server
    import threading

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    srv.RequestHandlerClass.log_message = lambda *a: None  # type: ignore[method-assign]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile(case: Case, tmp_path: Path, capsys, monkeypatch, http_port):
    if case.no_cuda:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_ADDRESS", "")  # a case reaching Ray would start a local one
    # never a warm Ray of `geosweep ray start` (its CPUs would decide resource cases)
    monkeypatch.setenv("GEOSWEEP_RAY_STATE", str(tmp_path / "no-warm-ray.json"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("GEOSWEEP_CACHE", raising=False)
    for k, v in (case.env or {}).items():
        monkeypatch.setenv(k, v.format(http=f"127.0.0.1:{http_port}"))
    import ray

    if case.setup is not None:
        case.setup(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(case.spec if case.spec is not None else SPEC)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    fill = {"tmp": tmp_path, "spec": spec, "sweep": tmp_path / "runs" / "tiny",
            "model": tmp_path / "model", "http": f"127.0.0.1:{http_port}",
            "fake": tmp_path / "runs" / "fake"}
    argv = [a.format(**fill) for a in case.argv]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == case.code, (code, err[-2000:])
    assert "Traceback" not in out + err
    assert not ray.is_initialized()
    assert not (tmp_path / "PWNED_BY_PICKLE").exists()
    if case.code == 0:  # a case that must succeed, and write what it is documented to
        assert "geosweep: error" not in err, err[-2000:]
        assert re.search(case.line, out), out[-2000:]
        for pattern in case.makes:
            assert list(tmp_path.glob(pattern)), pattern
        return
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1, f"not one line: {err!r}"
    assert re.search(case.line, lines[0]), lines[0]
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    made = [p for p in after if p not in before and not p.endswith(".lock")]
    assert made == [], made  # nothing half-written
