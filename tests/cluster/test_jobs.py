"""cluster/jobs.py without a cluster: what is shipped, how it is quoted, how the token travels.

A small stand-in Jobs API (http.server on 127.0.0.1) speaks the few endpoints the real
JobSubmissionClient uses, records every request and answers 401 without the right bearer
token, so the real SDK code path (version check, package upload, submit) runs end to end.
"""

from __future__ import annotations

import io
import json
import secrets
import shlex
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from cluster import jobs
from cluster.jobs import STAGED_SPEC_DIR, build_submission

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-" + secrets.token_hex(16)  # random: the shipped sources must not contain it


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``geosweep ARGV`` in-process with the cluster commands registered: (rc, out, err)."""
    import orchestrator.cli as ocli  # registers the cluster commands itself

    capsys.readouterr()
    rc = ocli.main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_ADDRESS",
              "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(k, raising=False)


# --- runtime_env and entrypoint ----------------------------------------------------------------


def test_checkout_shipped_name_ships_repo_root_with_excludes():
    sub = build_submission("quickstart", root=ROOT)
    env = sub.runtime_env
    assert env["working_dir"] == str(ROOT)
    for pat in (".venv", ".git", "geosweep-runs", ".geosweep-cache", "__pycache__", "*.parquet"):
        assert pat in env["excludes"]
    assert env["env_vars"]["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"
    assert env["env_vars"]["RAY_USAGE_STATS_ENABLED"] == "0"
    assert shlex.split(sub.entrypoint) == [
        "python", "-m", "orchestrator.cli", "run", "quickstart", "--out", "~/geosweep-runs",
        "--address", "auto"]
    assert sub.staged is None and sub.metadata == {"geosweep_spec": "quickstart"}


def test_checkout_spec_inside_repo_is_a_relative_path():
    sub = build_submission(str(ROOT / "search_spaces" / "quickstart.yaml"), out="/shared/runs",
                           mlflow_uri="http://head:5000", parquet_root="s3://b/pq", root=ROOT)
    assert sub.spec_arg == "search_spaces/quickstart.yaml"
    assert sub.runtime_env["working_dir"] == str(ROOT)
    assert shlex.split(sub.entrypoint)[3:] == [
        "run", "search_spaces/quickstart.yaml", "--out", "/shared/runs", "--address", "auto",
        "--mlflow-uri", "http://head:5000", "--parquet-root", "s3://b/pq"]


def test_checkout_spec_outside_repo_is_staged_with_a_clean_copy(tmp_path):
    spec = tmp_path / "my spec.yaml"
    spec.write_text((ROOT / "search_spaces" / "quickstart.yaml").read_text())
    sub = build_submission(str(spec), root=ROOT)
    try:
        work = Path(sub.runtime_env["working_dir"])
        assert work != ROOT and work.is_relative_to(Path(sub.staged))
        assert (work / STAGED_SPEC_DIR / "my spec.yaml").read_text() == spec.read_text()
        assert (work / "orchestrator" / "cli" / "__init__.py").is_file()
        assert (work / "pyproject.toml").is_file()
        names = {p.name for p in work.rglob("*")}
        assert not names & {".git", ".venv", "__pycache__", ".pytest_cache", "geosweep-runs"}
        assert shlex.split(sub.entrypoint)[4] == f"{STAGED_SPEC_DIR}/my spec.yaml"
    finally:
        sub.cleanup()
    assert not Path(work).exists()


def test_pip_mode_relies_on_installed_geosweep(tmp_path):
    sub = build_submission("quickstart", root=None)
    assert "working_dir" not in sub.runtime_env and "excludes" not in sub.runtime_env
    assert shlex.split(sub.entrypoint)[:3] == ["geosweep", "run", "quickstart"]
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\n")
    sub = build_submission(str(spec), root=None)
    try:
        work = Path(sub.runtime_env["working_dir"])
        assert sorted(p.relative_to(work).as_posix() for p in work.rglob("*")) == [
            STAGED_SPEC_DIR, f"{STAGED_SPEC_DIR}/s.yaml"]
        assert shlex.split(sub.entrypoint)[:3] == ["geosweep", "run", f"{STAGED_SPEC_DIR}/s.yaml"]
    finally:
        sub.cleanup()


def test_entrypoint_quoting_resists_shell_injection():
    out = "/tmp/a b; touch /tmp/pwned $(id) `x` 'q\""
    sub = build_submission("quickstart", out=out, mlflow_uri="http://h:1/?a=1&b=2", root=ROOT,
                           extra_args=["--overwrite"])
    argv = shlex.split(sub.entrypoint)
    assert argv[argv.index("--out") + 1] == out
    assert argv[argv.index("--mlflow-uri") + 1] == "http://h:1/?a=1&b=2"
    assert argv[-1] == "--overwrite"


def test_missing_spec_file_is_one_line():
    with pytest.raises(jobs.JobsError, match=r"^spec: no such file 'nope/x.yaml'$"):
        build_submission("nope/x.yaml", root=ROOT)


# --- token ----------------------------------------------------------------------------------


def test_token_sources_in_ray_order(no_token, monkeypatch, tmp_path):
    assert jobs.auth_token() is None and jobs.auth_headers() == {}
    home = Path(tmp_path / "home" / ".ray")
    home.mkdir(parents=True)
    (home / "auth_token").write_text("from-home\n")
    assert jobs.auth_token() == "from-home"
    p = tmp_path / "tokfile"
    p.write_text("from-path")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(p))
    assert jobs.auth_token() == "from-path"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert jobs.auth_headers() == {"Authorization": "Bearer from-env"}
    assert jobs.redact("x from-env y") == "x *** y"


def test_token_never_in_runtime_env_or_entrypoint(no_token, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    sub = build_submission("quickstart", root=ROOT)
    assert TOKEN not in json.dumps(sub.runtime_env) + sub.entrypoint


# --- against a stand-in Jobs API ---------------------------------------------------------------


class _FakeJobs(BaseHTTPRequestHandler):
    token: str | None = None
    requests: list[dict] = []
    uploads: dict[str, bytes] = {}

    def log_message(self, *a):  # keep test output clean
        pass

    def _auth_ok(self) -> bool:
        return self.token is None or self.headers.get("Authorization") == f"Bearer {self.token}"

    def _send(self, code: int, body: object) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        self.requests.append({"method": method, "path": self.path,
                              "auth": self.headers.get("Authorization"), "body": body})
        if not self._auth_ok():
            return self._send(401, b"Unauthorized: Missing authentication token")
        if self.path == "/api/version":
            return self._send(200, {"ray_version": "2.60.0", "version": "4",
                                    "ray_commit": "x", "session_name": "s"})
        if self.path.startswith("/api/packages/"):
            if method == "PUT":
                self.uploads[self.path] = body
                return self._send(200, b"")
            return self._send(200 if self.path in self.uploads else 404, b"")
        if self.path == "/api/jobs/" and method == "POST":
            return self._send(200, {"job_id": "raysubmit_1", "submission_id": "raysubmit_1"})
        if self.path.startswith("/api/jobs/nope"):
            return self._send(404, b"Job nope does not exist")
        return self._send(404, b"not found")

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_PUT(self):
        self._handle("PUT")


@pytest.fixture
def fake_api(no_token):
    _FakeJobs.requests, _FakeJobs.uploads, _FakeJobs.token = [], {}, TOKEN
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakeJobs)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_submit_sends_bearer_token_and_uploads_clean_project(fake_api, monkeypatch, tmp_path,
                                                             capsys):
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # must not override --address
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump({"name": "tiny", "workload": {"preset": "gpt-debug"}}))
    rc, out, err = run_cli(["submit", str(spec), "--address", fake_api, "--out", "/shared/r"],
                           capsys)
    assert rc == 0, err
    assert "submitted job raysubmit_1" in out
    assert TOKEN not in out + err
    reqs = _FakeJobs.requests
    assert reqs and all(r["auth"] == f"Bearer {TOKEN}" for r in reqs)
    assert all(TOKEN.encode() not in r["body"] for r in reqs)
    job = json.loads(next(r["body"] for r in reqs if r["path"] == "/api/jobs/"))
    assert shlex.split(job["entrypoint"]) == [
        "python", "-m", "orchestrator.cli", "run", f"{STAGED_SPEC_DIR}/tiny.yaml", "--out",
        "/shared/r", "--address", "auto"]
    wd = job["runtime_env"]["working_dir"]
    assert wd.startswith("gcs://_ray_pkg_") and wd.endswith(".zip")
    (zipped,) = _FakeJobs.uploads.values()
    names = zipfile.ZipFile(io.BytesIO(zipped)).namelist()
    assert f"{STAGED_SPEC_DIR}/tiny.yaml" in names
    assert "orchestrator/cli/__init__.py" in names and "cluster/jobs.py" in names
    bad = [n for n in names if any(p in (".git", ".venv", "__pycache__", "geosweep-runs")
                                   for p in n.split("/"))]
    assert bad == []
    assert job["metadata"] == {"geosweep_spec": "tiny"}


def test_wrong_or_missing_token_is_one_line_without_the_token(fake_api, monkeypatch, capsys):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "not-" + TOKEN)
    rc, out, err = run_cli(["jobs", "--address", fake_api], capsys)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("geosweep: error: cannot reach the Ray Jobs")
    assert "RAY_AUTH_TOKEN" in err and TOKEN not in err
    assert _FakeJobs.requests[0]["auth"] == f"Bearer not-{TOKEN}"


def test_unknown_job_and_unreachable_address_are_one_line(fake_api, monkeypatch, capsys):
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    rc, _, err = run_cli(["logs", "nope", "--address", fake_api], capsys)
    assert rc == 2 and err.count("\n") == 1 and "job nope" in err
    from ray_services import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    rc, _, err = run_cli(["submit", "quickstart", "--address", dead], capsys)
    assert rc == 2 and err.count("\n") == 1 and dead in err and TOKEN not in err
    rc, _, err = run_cli(["submit", "no_such_spec", "--address", dead], capsys)
    assert rc == 2 and err.count("\n") == 1 and "no_such_spec" in err
    rc, _, err = run_cli(["jobs"], capsys)
    assert rc == 2 and "--address" in err


# --- cluster configs ----------------------------------------------------------------------------

CONFIGS = ROOT / "cluster" / "configs"


@pytest.mark.parametrize("name", ["aws.yaml", "gcp.yaml"])
def test_cluster_launcher_configs(name):
    (cfg,) = list(yaml.safe_load_all((CONFIGS / name).read_text()))
    for k in ("cluster_name", "provider", "head_node_type", "available_node_types",
              "setup_commands", "file_mounts", "max_workers"):
        assert k in cfg, k
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] in types
    head = types[cfg["head_node_type"]]
    # trials never land on the head (it runs the sweep driver, the dashboard and MLflow)
    assert head["resources"] == {"CPU": 0, "GPU": 0}
    gpu = [t for n, t in types.items() if t.get("resources", {}).get("GPU", 0) >= 1]
    assert gpu and all(t["max_workers"] >= 1 for t in gpu)
    assert any("geosweep" in c for c in cfg["setup_commands"])
    assert all(isinstance(c, str) for c in cfg["setup_commands"])
    assert any("RAY_USAGE_STATS_ENABLED=0" in c or "disable-usage-stats" in c
               for c in cfg["head_start_ray_commands"])
    assert any("127.0.0.1" in c for c in cfg["head_start_ray_commands"])


def test_kuberay_manifests():
    (rc,) = list(yaml.safe_load_all((CONFIGS / "kuberay-raycluster.yaml").read_text()))
    assert rc["apiVersion"] == "ray.io/v1" and rc["kind"] == "RayCluster"
    spec = rc["spec"]
    assert "rayStartParams" in spec["headGroupSpec"]
    groups = spec["workerGroupSpecs"]
    limits = [c["resources"]["limits"] for g in groups for c in g["template"]["spec"]["containers"]]
    assert any(int(lim.get("nvidia.com/gpu", 0)) >= 1 for lim in limits)
    (rj,) = list(yaml.safe_load_all((CONFIGS / "kuberay-rayjob.yaml").read_text()))
    assert rj["apiVersion"] == "ray.io/v1" and rj["kind"] == "RayJob"
    assert "geosweep run" in rj["spec"]["entrypoint"]
    assert "rayClusterSpec" in rj["spec"]
    assert rj["spec"]["shutdownAfterJobFinishes"] is True


def test_local_cluster_script_binds_loopback_and_has_stop():
    text = (CONFIGS / "local_cluster.sh").read_text()
    assert text.startswith("#!/usr/bin/env bash")
    assert 'HOST="${HOST:-127.0.0.1}"' in text
    assert "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false" in text and "--workers 1" in text
    assert "stop)" in text and "warning" in text.lower()
    # stops the processes it started (pid files), never every Ray on the machine
    assert "kill -TERM" in text and "ray stop" not in text


def test_services_warn_only_off_loopback():
    from ray_services import network_warning

    for host in ("127.0.0.1", "localhost", "::1"):
        assert network_warning(host, "MLflow") is None
    msg = network_warning("0.0.0.0", "the Ray dashboard / Jobs API")
    assert msg.startswith("the Ray dashboard / Jobs API listens on 0.0.0.0") and "protect" in msg
