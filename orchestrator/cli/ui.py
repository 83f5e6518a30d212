"""`geosweep ui DIR`: the MLflow UI on a sweep's store."""

from __future__ import annotations

import argparse
import os
import sys

from orchestrator.cli.checks import sweep_dir


def cmd_ui(args: argparse.Namespace) -> int:
    root = sweep_dir(args.dir)
    from orchestrator.store.manifest import read_manifest

    manifest = read_manifest(root)
    uri = manifest.get("mlflow_uri") or f"sqlite:///{root / 'mlflow.db'}"
    if uri.startswith("http"):
        print(f"this sweep logs to the MLflow server {uri}: open it in a browser")
        return 0
    import subprocess

    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
           "--host", args.host, "--port", str(args.port), "--workers", "1"]
    if args.host not in ("127.0.0.1", "localhost"):
        print("[geosweep] warning: the MLflow UI is reachable from the network; protect it",
              file=sys.stderr)
    print(f"[geosweep] MLflow UI for {root.name}: http://{args.host}:{args.port}", flush=True)
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    return subprocess.call(cmd, env=env)


def add(sub: argparse._SubParsersAction) -> None:
    u = sub.add_parser("ui", help="open the MLflow UI on a sweep's store")
    u.add_argument("dir")
    u.add_argument("--host", default="127.0.0.1")
    u.add_argument("--port", type=int, default=5000)
    u.set_defaults(fn=cmd_ui)
