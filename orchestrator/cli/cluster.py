"""`geosweep submit | jobs | logs | stop`: sweeps as Ray Jobs on a cluster.

``add_cluster_commands(subparsers)`` registers the four subcommands on the ``geosweep`` parser
(``orchestrator/cli/__init__.py`` calls it). Every user error (unreachable address, refused token,
unknown job, bad spec) is raised as ``orchestrator.cli.errors.UsageError``: one line, exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from orchestrator.cli.checks import load_cli_spec
from orchestrator.cli.errors import UsageError

__all__ = ["add_cluster_commands", "cmd_submit", "cmd_jobs", "cmd_logs", "cmd_stop"]

_ADDRESS_HELP = "Ray dashboard / Jobs API address, e.g. http://HEAD:8265 (default: $RAY_ADDRESS)"


def _usage(e: Exception):
    return UsageError(str(e))


def _address(args: argparse.Namespace) -> str:
    addr = args.address or os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get(
        "RAY_ADDRESS")
    if not addr:
        raise UsageError("--address: give the Ray dashboard address, e.g. http://HEAD:8265")
    return addr


def cmd_submit(args: argparse.Namespace) -> int:
    from cluster import jobs

    address = _address(args)
    load_cli_spec(args.spec)  # a bad spec fails here, in one line, not later on the cluster
    try:
        job_id = jobs.submit(args.spec, address, out=args.out, mlflow_uri=args.mlflow_uri,
                             parquet_root=args.parquet_root,
                             extra_args=[f for f in ("--overwrite", "--resume")
                                         if getattr(args, f[2:])],
                             submission_id=args.job_id)
    except jobs.JobsError as e:
        raise _usage(e) from None
    print(f"[geosweep] submitted job {job_id} to {address}", flush=True)
    print(f"[geosweep] follow it:  geosweep logs {job_id} --address {address} --follow")
    print(f"[geosweep] stop it:    geosweep stop {job_id} --address {address}")
    if not args.wait:
        return 0
    return _follow_until_done(job_id, address)


def _follow_until_done(job_id: str, address: str) -> int:
    from cluster import jobs

    try:
        for chunk in jobs.logs(job_id, address, follow=True):
            sys.stdout.write(chunk)
            sys.stdout.flush()
        st = jobs.wait(job_id, address, timeout=60)
    except jobs.JobsError as e:
        raise _usage(e) from None
    print(f"[geosweep] job {job_id}: {st}")
    return 0 if st == "SUCCEEDED" else 1


def cmd_jobs(args: argparse.Namespace) -> int:
    from cluster import jobs

    try:
        rows = jobs.list_jobs(_address(args))
    except jobs.JobsError as e:
        raise _usage(e) from None
    if not rows:
        print("no jobs")
        return 0
    for r in rows:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["start"])) \
            if r["start"] else "-"
        print(f"{r['job_id']:<28} {r['status']:<10} {started}  {r['entrypoint'][:80]}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from cluster import jobs

    try:
        for chunk in jobs.logs(args.job, _address(args), follow=args.follow):
            sys.stdout.write(chunk)
            sys.stdout.flush()
    except jobs.JobsError as e:
        raise _usage(e) from None
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from cluster import jobs

    address = _address(args)
    try:
        was_running = jobs.stop(args.job, address)
        st = jobs.status(args.job, address)
    except jobs.JobsError as e:
        raise _usage(e) from None
    print(f"[geosweep] job {args.job}: {'stop requested' if was_running else 'not running'}, "
          f"status {st}")
    return 0


def add_cluster_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``submit``, ``jobs``, ``logs`` and ``stop`` on the geosweep parser."""
    s = subparsers.add_parser("submit", help="run a sweep on a Ray cluster as a Ray Job")
    s.add_argument("spec", help="a shipped spec name or a local YAML path")
    s.add_argument("--address", default=None, help=_ADDRESS_HELP)
    s.add_argument("--out", default=None,
                   help="sweep parent folder ON THE CLUSTER (shared storage; "
                        "default ~/geosweep-runs on the head)")
    s.add_argument("--mlflow-uri", default=None, help="MLflow tracking server, as the head "
                                                      "sees it (default: sqlite in --out)")
    s.add_argument("--parquet-root", default=None, help="Parquet root (path or fs URI)")
    s.add_argument("--job-id", default=None, help="submission id (default: Ray picks one)")
    s.add_argument("--wait", action="store_true", help="follow the logs until the job ends")
    s.add_argument("--overwrite", action="store_true", help="passed to `geosweep run`")
    s.add_argument("--resume", action="store_true", help="passed to `geosweep run`")
    s.set_defaults(fn=cmd_submit)

    j = subparsers.add_parser("jobs", help="list the Ray Jobs of a cluster")
    j.add_argument("--address", default=None, help=_ADDRESS_HELP)
    j.set_defaults(fn=cmd_jobs)

    g = subparsers.add_parser("logs", help="print (or --follow) a Ray Job's logs")
    g.add_argument("job", help="the job id that submit printed (geosweep jobs lists them)")
    g.add_argument("--address", default=None, help=_ADDRESS_HELP)
    g.add_argument("--follow", action="store_true", help="keep printing until the job ends")
    g.set_defaults(fn=cmd_logs)

    t = subparsers.add_parser("stop", help="stop a Ray Job")
    t.add_argument("job", help="the job id to stop")
    t.add_argument("--address", default=None, help=_ADDRESS_HELP)
    t.set_defaults(fn=cmd_stop)


add = add_cluster_commands  # the name orchestrator.cli.COMMANDS calls
