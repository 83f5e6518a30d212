"""Issue 28's classes of failure as tables (tests/orchestrator/hostile_stores.py and
hostile_inputs.py; the rules in hostile_round3.py), through the real CLI in-process
(``main(argv)``, as tests/orchestrator/cli/test_hostile.py).

Beyond test_hostile's rules (exit code, one stderr line matching a pattern, no traceback, no
Ray started), every case proves that nothing it should not touch was touched: each file under
the case's folder is hashed before and after, and only the globs the case names may differ
(a successful eval's rows, a report's folder). A foreign database, a folder outside the sweep,
the original of a moved copy stay byte for byte as they were. The secret of the ``secrets``
class appears in neither stdout nor stderr of any case.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import stat
from pathlib import Path

import hostile_inputs
import hostile_kit as kit
import hostile_round3 as r3
import hostile_stores
import pytest
from hostile_kit import SPEC

from orchestrator.cli import main

CASES: list[r3.Case] = hostile_stores.CASES + hostile_inputs.CASES

# the least each class must hold (the counts docs/reliability.md gives)
MIN_CASES = {"escape": 60, "foreign_store": 40, "broken_store": 35, "secrets": 20,
             "tracebacks": 40, "answers": 35}


def test_every_class_is_a_table():
    counts = {c: sum(k.cls == c for k in CASES) for c in r3.CLASSES}
    assert sum(counts.values()) == len(CASES)
    for cls, least in MIN_CASES.items():
        assert counts[cls] >= least, (cls, counts[cls])
    assert len({c.id for c in CASES}) == len(CASES)


def _snapshot(root: Path) -> dict[str, str]:
    """relative path -> a hash of the content (regular files), or the kind of entry."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = os.fsencode(p.relative_to(root)).decode("utf-8", "backslashreplace")
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "link:" + os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                out[rel] = hashlib.sha1(p.read_bytes()).hexdigest()
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            else:
                out[rel] = f"special:{stat.S_IFMT(st.st_mode)}"
    return out


def _allowed(rel: str, globs: tuple[str, ...]) -> bool:
    if Path(rel).name == ".lock" or "__pycache__" in rel:
        return True
    return any(fnmatch.fnmatch(rel, g) or rel == g.removesuffix("/**") for g in globs)


@pytest.fixture(autouse=True)
def _reap():
    yield
    while kit.CHILDREN:
        p = kit.CHILDREN.pop()
        p.kill()
        p.wait()


@pytest.fixture(scope="module")
def http_port():
    """An HTTP server that is not MLflow (it answers 501 to every GET)."""
    import http.server
    import threading

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    srv.RequestHandlerClass.log_message = lambda *a: None  # type: ignore[method-assign]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", CASES, ids=[f"{c.cls}:{c.id}" for c in CASES])
def test_round3(case: r3.Case, tmp_path: Path, capsys, monkeypatch, http_port):
    if case.skip_root and os.geteuid() == 0:
        pytest.skip("permissions mean nothing to root")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_ADDRESS", "")  # a case reaching Ray would start a local one
    monkeypatch.setenv("GEOSWEEP_RAY_STATE", str(tmp_path / "no-warm-ray.json"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for k in ("GEOSWEEP_CACHE", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
              "MLFLOW_TRACKING_TOKEN", "RAY_API_SERVER_ADDRESS", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(k, raising=False)
    http = f"127.0.0.1:{http_port}"
    for k, v in (case.env or {}).items():
        monkeypatch.setenv(k, v.format(http=http))
    import ray

    if case.setup is not None:
        case.setup(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(case.spec if case.spec is not None else SPEC)
    before = _snapshot(tmp_path)
    fill = {"tmp": tmp_path, "spec": spec, "sweep": tmp_path / "runs" / "tiny",
            "model": tmp_path / "model", "http": http, "fake": tmp_path / "runs" / "fake"}
    argv = [a.format(**fill) for a in case.argv]
    if case.cwd:
        monkeypatch.chdir(tmp_path / case.cwd)
    code = main(argv)
    out, err = capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    assert code == case.code, (code, err[-2000:], out[-2000:])
    assert "Traceback" not in out + err
    assert r3.SECRET not in out + err
    assert not ray.is_initialized()
    assert not (tmp_path / "PWNED_BY_PICKLE").exists()
    if case.code == 0:
        assert "geosweep: error" not in err, err[-2000:]
        assert re.search(case.line, out), out[-3000:]
        for pattern in case.makes:
            assert list(tmp_path.glob(pattern)), pattern
    else:
        lines = err.rstrip("\n").split("\n")
        assert len(lines) == 1, f"not one line: {err!r}"
        assert re.search(case.line, lines[0]), lines[0]
    after = _snapshot(tmp_path)
    changed = sorted(k for k in set(before) | set(after)
                     if before.get(k) != after.get(k) and not _allowed(k, case.may_change))
    assert changed == [], changed  # nothing outside what the case may write was touched
