"""`geosweep ray start | stop | status`: a warm local Ray that `geosweep run` joins.

A sweep started while it runs skips Ray's start (~3-4 s) and shutdown; see cluster/warm.py
(loopback only, token auth, its own temp dir, stopped by its own process group).
"""

from __future__ import annotations

import argparse
import sys
import time

from orchestrator.cli.errors import UsageError

__all__ = ["cmd_ray", "add"]


def cmd_ray(args: argparse.Namespace) -> int:
    from cluster import warm
    from cluster.local import ray_env

    if args.action == "start":
        was = warm.current()
        try:
            rec = warm.start(num_cpus=args.num_cpus, env=ray_env())
        except warm.WarmRayError as e:
            print(f"geosweep: error: {e}", file=sys.stderr)
            return 1
        verb = "already running" if was else "started"
        print(f"[geosweep] local Ray {verb} at {rec['address']} (pid {rec['pid']}); "
              "`geosweep run` joins it; stop it with `geosweep ray stop`")
        return 0
    if args.action == "stop":
        print("[geosweep] local Ray stopped" if warm.stop() else "[geosweep] no local Ray running")
        return 0
    rec = warm.current()
    if rec is None:
        print("[geosweep] no local Ray running (start one with `geosweep ray start`)")
        return 3
    up = time.time() - float(rec.get("started", time.time()))
    print(f"[geosweep] local Ray at {rec['address']} (pid {rec['pid']}), up {up:.0f} s, "
          f"temp dir {rec.get('temp_dir')}")
    return 0


def _cpus(v: str) -> int:
    try:
        x = int(v)
    except ValueError:
        x = -1
    if x <= 0:
        raise UsageError(f"--num-cpus: {v!r} is not a positive whole number")
    return x


def add(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("ray", help="start | stop | status of a warm local Ray that sweeps join")
    r.add_argument("action", choices=("start", "stop", "status"),
                   help="start a warm Ray (127.0.0.1, token auth), stop it, or show it")
    r.add_argument("--num-cpus", type=_cpus, default=None,
                   help="CPUs the local Ray offers (default: all)")
    r.set_defaults(fn=cmd_ray)
