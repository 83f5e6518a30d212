"""Submit a sweep to a Ray cluster as a Ray Job (the Jobs SDK) and manage it.

The job's entrypoint is the same ``run`` command a laptop uses (``geosweep run SPEC --out OUT
--address auto ...``); Ray Tune on the cluster does the scheduling. What travels with the job
(``runtime_env``):

- running from a checkout (``pyproject.toml`` of geosweep next to the packages): the project as
  ``working_dir`` (the repo root, minus ``EXCLUDES``), entrypoint ``python -m orchestrator.cli``.
  A spec file outside the repo is added to a staged copy of the project (``STAGED_SPEC_DIR``).
- geosweep pip-installed (non-editable): the cluster's installed geosweep; only a spec *file*
  travels, alone in a temporary ``working_dir``. A shipped spec name travels as the name.

Token auth (on by default in Ray 2.60): the token comes from ``RAY_AUTH_TOKEN``, the file named
by ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token`` and is sent as an ``Authorization: Bearer``
header. It is never printed, logged, put into the runtime_env or the entrypoint, and it is
redacted (with the userinfo of an address like ``http://user:pw@head:8265``) from every error
message and log text this module hands back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.redact import ray_auth_token
from cluster.redact import redact as _redact

__all__ = [
    "JobsError", "Submission", "EXCLUDES", "STAGED_SPEC_DIR", "TERMINAL", "auth_token",
    "auth_headers", "project_root", "build_submission", "client", "submit", "list_jobs",
    "status", "logs", "stop", "wait", "redact",
]

# Never uploaded: environments, VCS, results, caches (Ray's working_dir limit is 500 MiB and a
# sweep folder or a token cache would blow it and leak data to the cluster).
EXCLUDES = [".venv", "venv", ".git", "geosweep-runs", ".geosweep-cache", "__pycache__",
            "*.pyc", ".pytest_cache", ".ruff_cache", "*.egg-info", "build", "dist", "mlruns",
            "mlartifacts", "ray_results", "*.db", "*.parquet", "*.pt", "*.npy", "*.bin",
            "benchmarks/out", "tmp"]
STAGED_SPEC_DIR = "geosweep-submit"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
DEFAULT_CLUSTER_OUT = "~/geosweep-runs"  # on the head node; give shared storage on a real cluster
# The job's env: Ray usage stats off (no network), unbuffered logs, and let the driver's
# ray.init(runtime_env={"env_vars": ...}) add to the job's runtime_env instead of conflicting.
JOB_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1",
           "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"}


class JobsError(Exception):
    """A one-line user-facing error (bad address, unknown job, refused token), redacted."""

    def __init__(self, message: str) -> None:
        super().__init__(_redact(message))


# --- token ----------------------------------------------------------------------------------


def auth_token() -> str | None:
    """Ray's auth token, looked up the way Ray looks it up; None when there is none."""
    return ray_auth_token()


def auth_headers() -> dict[str, str]:
    tok = auth_token()
    return {"Authorization": f"Bearer {tok}"} if tok else {}


def redact(text: str) -> str:
    """``text`` without secrets: the auth token, URL userinfo, credential query parameters
    and Authorization headers (cluster/redact.py, the one redaction geosweep uses)."""
    return _redact(text)


# --- what is shipped ------------------------------------------------------------------------


def project_root() -> Path | None:
    """The geosweep checkout this code runs from, or None for a non-editable install."""
    root = Path(__file__).resolve().parent.parent
    pp = root / "pyproject.toml"
    if pp.is_file() and 'name = "geosweep"' in pp.read_text(errors="replace"):
        return root
    return None


@dataclass
class Submission:
    """What ``submit`` sends: the entrypoint command line and the runtime_env."""

    entrypoint: str
    runtime_env: dict[str, Any]
    spec_arg: str
    staged: str | None = None  # a temporary folder to delete after the upload
    metadata: dict[str, str] = field(default_factory=dict)

    def cleanup(self) -> None:
        if self.staged:
            shutil.rmtree(self.staged, ignore_errors=True)
            self.staged = None


def _is_name(ref: str) -> bool:
    # Mirrors orchestrator.spec.yaml_reader.load_spec: a bare word that is not a file is a name.
    return not ("/" in ref or os.sep in ref or ref.endswith((".yaml", ".yml"))
                or Path(ref).is_file())


def _excluded(rel: Path) -> bool:
    import fnmatch

    return any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in EXCLUDES) or any(
        fnmatch.fnmatch(str(rel), pat + "/*") for pat in EXCLUDES if "/" in pat)


def build_submission(spec_ref: str, out: str | None = None, mlflow_uri: str | None = None,
                     parquet_root: str | None = None, extra_args: Sequence[str] = (),
                     root: Path | None | str = "auto") -> Submission:
    """Entrypoint + runtime_env for ``spec_ref`` (a shipped name or a local YAML path).

    ``root``: the project checkout to ship ("auto": ``project_root()``; None: pip mode).
    Nothing is uploaded here; a spec outside the checkout is staged into a temporary folder
    (``Submission.staged``) that the caller removes after submitting.
    """
    root = project_root() if root == "auto" else (Path(root).resolve() if root else None)
    env: dict[str, Any] = {"env_vars": dict(JOB_ENV)}
    staged: str | None = None
    name = spec_ref
    if _is_name(spec_ref):
        spec_arg = spec_ref
        if root is not None:
            env["working_dir"] = str(root)
    else:
        path = Path(spec_ref).expanduser().resolve()
        if not path.is_file():
            raise JobsError(f"spec: no such file {spec_ref!r}")
        name = path.stem
        inside = root is not None and path.is_relative_to(root) and not _excluded(
            path.relative_to(root))
        if inside:
            spec_arg = path.relative_to(root).as_posix()
            env["working_dir"] = str(root)
        else:
            staged = tempfile.mkdtemp(prefix="geosweep-submit-")
            work = Path(staged) / "work"
            if root is not None:  # a copy of the project + the spec
                shutil.copytree(root, work, ignore=shutil.ignore_patterns(*EXCLUDES),
                                symlinks=True)
            (work / STAGED_SPEC_DIR).mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, work / STAGED_SPEC_DIR / path.name)
            spec_arg = f"{STAGED_SPEC_DIR}/{path.name}"
            env["working_dir"] = str(work)
    if "working_dir" in env:
        env["excludes"] = list(EXCLUDES)
    cmd = (["python", "-m", "orchestrator.cli"] if root is not None else ["geosweep"])
    cmd += ["run", spec_arg, "--out", out or DEFAULT_CLUSTER_OUT, "--address", "auto"]
    if mlflow_uri:
        cmd += ["--mlflow-uri", mlflow_uri]
    if parquet_root:
        cmd += ["--parquet-root", parquet_root]
    cmd += [str(a) for a in extra_args]
    return Submission(shlex.join(cmd), env, spec_arg, staged,
                      metadata={"geosweep_spec": name})


# --- the Jobs API -----------------------------------------------------------------------------


_ADDRESS_VARS = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")


def _http_address(address: str) -> str:
    if "://" not in address:
        address = f"http://{address}"
    return address.rstrip("/")


def client(address: str):
    """A ``JobSubmissionClient`` for the dashboard at ``address``, with the token header."""
    from ray.job_submission import JobSubmissionClient

    # Ray lets $RAY_ADDRESS / $RAY_API_SERVER_ADDRESS override an explicit address (inside a
    # Ray job RAY_ADDRESS is the GCS): the address the user gave wins here.
    saved = {k: os.environ.pop(k) for k in _ADDRESS_VARS if k in os.environ}
    try:
        return JobSubmissionClient(_http_address(address), headers=auth_headers())
    except Exception as e:  # noqa: BLE001 - connection/auth/version errors become one line
        raise JobsError(_one_line(f"cannot reach the Ray Jobs API at {address}", e)) from None
    finally:
        os.environ.update(saved)


def _one_line(prefix: str, e: BaseException) -> str:
    msg = redact(str(e)).strip().splitlines()
    first = next((m for m in msg if m.strip()), type(e).__name__)
    hint = ""
    if "401" in str(e) or "Authentication required" in str(e):
        hint = " (set RAY_AUTH_TOKEN or copy the head's ~/.ray/auth_token)"
    elif "403" in str(e) or "invalid or incorrect" in str(e):
        hint = " (the auth token does not match the cluster's)"
    return f"{prefix}: {first[:300]}{hint}"


def _call(what: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except JobsError:
        raise
    except Exception as e:  # noqa: BLE001
        raise JobsError(_one_line(what, e)) from None


def submit(spec_ref: str, address: str, out: str | None = None, mlflow_uri: str | None = None,
           parquet_root: str | None = None, extra_args: Sequence[str] = (),
           submission_id: str | None = None) -> str:
    """Submit ``geosweep run spec_ref`` as a Ray Job; returns the job (submission) id.

    The caller validates the spec first (``geosweep submit`` does, in one line, before it
    connects): this package knows nothing of specs, only of files and command lines."""
    c = client(address)
    sub = build_submission(spec_ref, out, mlflow_uri, parquet_root, extra_args)
    # Ray logs each step of packaging the working_dir at INFO (5 lines per submit, ".gitignore
    # ignored", "Uploading package gcs://..."): warnings and errors still show
    quiet = [logging.getLogger(n) for n in ("ray._private.runtime_env.packaging",
                                             "ray.dashboard.modules.dashboard_sdk")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.WARNING)
    try:
        return _call("submit failed", lambda: c.submit_job(
            entrypoint=sub.entrypoint, runtime_env=sub.runtime_env,
            submission_id=submission_id, metadata=sub.metadata))
    finally:
        for lg, lv in zip(quiet, levels):
            lg.setLevel(lv)
        sub.cleanup()


def list_jobs(address: str) -> list[dict[str, Any]]:
    """Jobs of the cluster, newest first: id, status, entrypoint, start/end (unix s)."""
    c = client(address)
    jobs = _call("list failed", c.list_jobs)
    rows = []
    for j in jobs:
        rows.append({
            "job_id": j.submission_id or j.job_id, "status": str(j.status.value),
            "entrypoint": redact(j.entrypoint or ""), "message": redact(j.message or ""),
            "start": (j.start_time or 0) / 1000.0, "end": (j.end_time or 0) / 1000.0,
        })
    return sorted(rows, key=lambda r: r["start"], reverse=True)


def status(job_id: str, address: str) -> str:
    """PENDING | RUNNING | STOPPED | SUCCEEDED | FAILED."""
    c = client(address)
    return str(_call(f"job {job_id}", lambda: c.get_job_status(job_id)).value)


def logs(job_id: str, address: str, follow: bool = False) -> Iterator[str]:
    """The job's log text: all of it at once, or chunks as they come until the job ends."""
    c = client(address)
    if not follow:
        yield redact(_call(f"job {job_id}", lambda: c.get_job_logs(job_id)))
        return
    _call(f"job {job_id}", lambda: c.get_job_status(job_id))  # unknown id -> one line now
    agen = c.tail_job_logs(job_id)
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                chunk = loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
            yield redact(chunk)
    finally:
        loop.run_until_complete(agen.aclose())
        loop.close()


def stop(job_id: str, address: str) -> bool:
    """Ask Ray to stop the job; True if it was running."""
    c = client(address)
    return bool(_call(f"job {job_id}", lambda: c.stop_job(job_id)))


def wait(job_id: str, address: str, timeout: float = 3600.0, poll_s: float = 2.0) -> str:
    """Poll until the job is SUCCEEDED/FAILED/STOPPED; returns that status."""
    c = client(address)
    deadline = time.time() + timeout
    while True:
        st = str(_call(f"job {job_id}", lambda: c.get_job_status(job_id)).value)
        if st in TERMINAL:
            return st
        if time.time() > deadline:
            raise JobsError(f"job {job_id}: still {st} after {timeout:.0f}s")
        time.sleep(poll_s)
