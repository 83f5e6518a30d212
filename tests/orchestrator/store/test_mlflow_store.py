"""store/mlflow_store.py, the one classification of store problems: every kind made for real
and told apart (the file unchanged by the probe), MLflow's own behaviour that makes the probe
necessary, errors raised mid-way classified, and the health probe of a server behind HTTP
basic auth (userinfo in the URI, MLflow's credential variables), which MLflow's client then
really uses."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.store.mlflow_store import (
    KINDS,
    StoreError,
    classify_error,
    head_revision,
    open_client,
    probe,
    probe_server,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A real MLflow store of this MLflow (made by MLflow itself)."""
    from mlflow import MlflowClient

    p = tmp_path_factory.mktemp("store") / "mlflow.db"
    MlflowClient(f"sqlite:///{p}").search_experiments()
    return p


def _sql(p: Path, *stmts: str) -> None:
    con = sqlite3.connect(p)
    with con:
        for s in stmts:
            con.execute(s)
    con.close()


def _make(kind: str, p: Path, store: Path) -> None:
    if kind == "folder":
        p.mkdir()
    elif kind == "not_a_file":
        os.mkfifo(p)
    elif kind == "empty":
        p.write_bytes(b"")
    elif kind == "empty_tables":
        _sql(p, "CREATE TABLE t (x)", "DROP TABLE t")
    elif kind == "not_sqlite":
        p.write_bytes(b"hello, not a database" * 10)
    elif kind == "corrupt":
        shutil.copy(store, p)
        p.write_bytes(p.read_bytes()[:20000])
    elif kind == "foreign":
        _sql(p, "CREATE TABLE notes (x)")
    elif kind == "other_schema":
        shutil.copy(store, p)
        _sql(p, "UPDATE alembic_version SET version_num = 'cfd24bdc0731'")
    elif kind == "missing":
        pass


# kind of file -> the kind probe says (empty_tables is "empty" too)
SQLITE_KINDS = {"missing": "missing", "folder": "folder", "not_a_file": "not_a_file",
                "empty": "empty", "empty_tables": "empty", "not_sqlite": "not_sqlite",
                "corrupt": "corrupt", "foreign": "foreign", "other_schema": "other_schema"}


def _state(p: Path) -> str:
    if not p.exists():
        return "absent"
    if not p.is_file():
        return "not a file"
    return hashlib.sha1(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("made", sorted(SQLITE_KINDS))
def test_every_sqlite_kind_is_told_apart_and_left_as_it_was(made, tmp_path, store):
    p = tmp_path / "mlflow.db"
    _make(made, p, store)
    before = _state(p)
    found = probe(f"sqlite:///{p}", pages=True)
    assert found is not None and found.kind == SQLITE_KINDS[made], found
    assert found.kind in KINDS
    assert str(p) in found.message and "\n" not in found.message
    assert _state(p) == before  # the probe wrote nothing
    if made != "missing":
        with pytest.raises(StoreError) as e:
            open_client(f"sqlite:///{p}", create=True)
        assert e.value.problem.kind == SQLITE_KINDS[made]
        assert _state(p) == before


def test_a_good_store_passes_and_missing_is_fine_for_a_writer(store, tmp_path):
    assert probe(f"sqlite:///{store}", pages=True) is None
    assert probe(f"sqlite:///{tmp_path / 'new.db'}", create=True) is None
    client = open_client(f"sqlite:///{tmp_path / 'new.db'}", create=True)
    assert [e.name for e in client.search_experiments()] == ["Default"]
    assert probe(f"sqlite:///{tmp_path / 'new.db'}") is None  # a store of this schema


def test_without_the_probe_mlflow_would_migrate_a_foreign_database(tmp_path):
    """Why the probe exists: MlflowClient builds its tables inside any sqlite file."""
    from mlflow import MlflowClient

    p = tmp_path / "theirs.db"
    _sql(p, "CREATE TABLE notes (x)")
    MlflowClient(f"sqlite:///{p}").search_experiments()
    con = sqlite3.connect(p)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    con.close()
    assert {"notes", "experiments", "runs", "alembic_version"} <= tables


def test_head_revision_is_the_schema_mlflow_makes(store):
    con = sqlite3.connect(store)
    (version,) = con.execute("SELECT version_num FROM alembic_version").fetchone()
    con.close()
    assert head_revision() == version


def test_a_locked_store_is_locked_not_a_hang(store, tmp_path):
    p = tmp_path / "locked.db"
    shutil.copy(store, p)
    code = ("import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None);"
            " c.execute('BEGIN EXCLUSIVE'); print('ok', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(p)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        found = probe(f"sqlite:///{p}", pages=True)
        assert found is not None and found.kind == "locked", found
    finally:
        holder.kill()
        holder.wait()
    assert probe(f"sqlite:///{p}") is None  # free again


@pytest.mark.parametrize("uri, kind", [
    ("garbage", "file_store"), ("./mlruns", "file_store"), ("file:///tmp/mlruns", "file_store"),
    ("/abs/mlruns", "file_store"), ("http://127.0.0.1:9", "unreachable"),
    ("http://user:pw@127.0.0.1:9", "unreachable"), ("http://127.0.0.1:port", "unreachable"),
])
def test_other_stores(uri, kind, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    found = probe(uri)
    assert found is not None and found.kind == kind, found
    assert "pw@" not in found.message
    if kind == "file_store":
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's own way back
        assert probe(uri) is None


@pytest.mark.parametrize("text, kind", [
    ("database is locked", "locked"), ("database disk image is malformed", "corrupt"),
    ("file is not a database", "corrupt"), ("unable to open database file", "unreadable"),
    ("attempt to write a readonly database", "unreadable"),
    ("no such table: experiments", "foreign"),
    ("Detected out-of-date database schema (found version x, but expected y)", "other_schema"),
])
def test_errors_raised_mid_way_are_classified_through_their_causes(text, kind):
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    inner = sqlite3.OperationalError(text)
    try:
        try:
            raise sqlalchemy.exc.OperationalError("SELECT 1", {}, inner) from inner
        except Exception as e:
            raise MlflowException(f"(sqlite3.OperationalError) {text}") from e
    except MlflowException as e:
        found = classify_error("sqlite:////x/mlflow.db", e)
    assert found is not None and found.kind == kind, found
    assert classify_error("sqlite:////x/mlflow.db", ValueError("a bug")) is None


def test_a_corrupt_store_as_mlflow_fails_on_it_is_classified(store, tmp_path):
    from mlflow import MlflowClient

    p = tmp_path / "c.db"
    shutil.copy(store, p)
    p.write_bytes(p.read_bytes()[:20000])  # a copy cut short (a full disk, a killed rsync)
    with pytest.raises(Exception) as e:
        MlflowClient(f"sqlite:///{p}").search_experiments(max_results=1000)
    found = classify_error(f"sqlite:///{p}", e.value)
    assert found is not None and found.kind == "corrupt", (found, e.value)


# --- a server behind basic auth ----------------------------------------------------------------

USER, PASSWORD = "alice", "p@ss:w/rd"  # characters a URL must percent-encode


class _BasicAuth(http.server.BaseHTTPRequestHandler):
    """``/health`` and MLflow's experiments search, behind HTTP basic auth."""

    seen: list[str] = []

    def log_message(self, *a):
        pass

    def do_GET(self):
        want = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        got = self.headers.get("Authorization", "")
        type(self).seen.append(got)
        if got != want:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
            self.end_headers()
            return
        body = b"OK" if self.path.startswith("/health") else json.dumps(
            {"experiments": [{"experiment_id": "0", "name": "Default",
                              "lifecycle_stage": "active"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


@pytest.fixture(scope="module")
def auth_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BasicAuth)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


_ENC = "p%40ss%3Aw%2Frd"  # PASSWORD percent-encoded, as a URL carries it


@pytest.mark.parametrize("userinfo, env, kind", [
    (f"{USER}:{_ENC}@", {}, None),
    ("", {"MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": PASSWORD}, None),
    (f"{USER}:wrong@", {}, "refused"),
    (f"nobody:{_ENC}@", {}, "refused"),
    ("", {}, "refused"),
    ("", {"MLFLOW_TRACKING_TOKEN": "tok-123456"}, "refused"),  # a bearer token, not basic
])
@pytest.mark.timeout(60)
def test_health_probe_of_a_basic_auth_server(auth_server, userinfo, env, kind, monkeypatch):
    for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    found = probe_server(f"http://{userinfo}{auth_server}")
    assert (found.kind if found else None) == kind, found
    if found:
        assert _ENC not in found.message and PASSWORD not in found.message
        assert "credentials" in found.message


@pytest.mark.timeout(60)
def test_a_basic_auth_server_is_usable_from_the_cli_and_mlflow(auth_server, capsys):
    """The CLI's check passes on the URI with userinfo, and MLflow's client then sends the
    same credentials: the server behind basic auth is usable end to end."""
    from mlflow import MlflowClient

    from orchestrator.cli.checks import check_mlflow_uri

    uri = f"http://{USER}:{_ENC}@{auth_server}"
    check_mlflow_uri(uri)  # no UsageError
    _BasicAuth.seen.clear()
    exps = MlflowClient(tracking_uri=uri).search_experiments()
    assert [e.name for e in exps] == ["Default"]
    want = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert _BasicAuth.seen and set(_BasicAuth.seen) == {want}


def test_the_sink_records_no_secret(tmp_path, monkeypatch):
    """What MLflow's readers see of a sweep (params, tags, the spec and provenance it logs)
    holds no password of a URI and no token of the environment."""
    from orchestrator.store.mlflow import MlflowSink

    pw, tok = "Pw-0f-the-server", "tok-ray-123456789"
    monkeypatch.setenv("RAY_AUTH_TOKEN", tok)
    sink = MlflowSink(f"sqlite:///{tmp_path / 'mlflow.db'}", "sw", "sw",
                      artifact_location=str(tmp_path / "mlartifacts"))
    spec = f"name: sw\ntracking: {{mlflow_uri: 'http://u:{pw}@host:5000'}}\n"
    run = sink.start_parent(spec, params={"tracking.mlflow_uri": f"http://u:{pw}@host"},
                            provenance={"env": {"RAY_AUTH_TOKEN": tok}, "cmd": f"--x {tok}"})
    sink.set_tags(None, {"note": f"server http://u:{pw}@host down"})
    got = sink.client.get_run(run)
    texts = list(got.data.params.values()) + list(got.data.tags.values())
    art = tmp_path / "mlartifacts"
    texts += [p.read_text() for p in art.rglob("*") if p.is_file()]
    assert any("spec.yaml" in str(p) for p in art.rglob("*"))
    assert texts and not any(pw in t or tok in t for t in texts)
    assert any("u:***@host" in t for t in texts)
