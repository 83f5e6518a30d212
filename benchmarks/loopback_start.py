"""Start time of the local Ray of `geosweep run`: loopback only (geosweep's default) vs Ray's
default (all interfaces), alternated in fresh processes, and what each listens on.

    PYTHONPATH=. python benchmarks/loopback_start.py [--pairs 3]

Each arm is `cluster.local.connect()` in a new Python process (own temp dir, no warm Ray):
start_s is the time `connect()` takes, stop_s `shutdown()`. Prints a table and, last, one JSON
line with the medians and their ratio (loopback / default).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"

CHILD = """
import json, os, shutil, sys, tempfile, time
sys.path.insert(0, os.path.join(sys.argv[1], "tests", "cluster"))
from listening import is_loopback, listening, process_tree
from cluster.local import connect, shutdown
tmp = tempfile.mkdtemp(prefix="gslb-", dir="/tmp")
t0 = time.time()
connect(temp_dir=tmp)
start_s = time.time() - t0
rows = listening(process_tree(os.getpid()))
t1 = time.time()
shutdown()
stop_s = time.time() - t1
shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps({"start_s": start_s, "stop_s": stop_s, "sockets": len(rows),
                  "exposed": sum(not is_loopback(r[2]) for r in rows)}))
"""


def one(arm: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0",
               GEOSWEEP_RAY_STATE=os.path.join(tempfile.gettempdir(), "gslb-no-warm.json"))
    env.pop("RAY_ADDRESS", None)
    if arm == "default":
        env[VAR] = "1"  # Ray's own default on Linux: a routable node IP, all interfaces
    else:
        env.pop(VAR, None)  # geosweep's default: loopback only
    r = subprocess.run([sys.executable, "-c", CHILD, str(ROOT)], env=env, capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        return {"arm": arm, "error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    return {"arm": arm, **json.loads(r.stdout.strip().splitlines()[-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    runs = []
    for i in range(args.pairs):
        order = ("loopback", "default") if i % 2 == 0 else ("default", "loopback")
        for arm in order:
            runs.append(one(arm))
            print(runs[-1], flush=True)
    ok = {a: [r for r in runs if r["arm"] == a and "error" not in r]
          for a in ("loopback", "default")}
    med = {a: {k: statistics.median(r[k] for r in rs) if rs else float("nan")
               for k in ("start_s", "stop_s")} for a, rs in ok.items()}
    print(f"{'arm':<10} {'ok':>3} {'start_s':>8} {'stop_s':>7} {'exposed sockets':>16}")
    for a, rs in ok.items():
        exposed = sorted({r["exposed"] for r in rs})
        print(f"{a:<10} {len(rs):>3} {med[a]['start_s']:>8.2f} {med[a]['stop_s']:>7.2f} "
              f"{str(exposed):>16}")
    ratio = med["loopback"]["start_s"] / med["default"]["start_s"]
    print(json.dumps({"pairs": args.pairs, "failed": sum("error" in r for r in runs),
                      "loopback_start_s": round(med["loopback"]["start_s"], 2),
                      "default_start_s": round(med["default"]["start_s"], 2),
                      "start_ratio": round(ratio, 3),
                      "loopback_exposed": max((r["exposed"] for r in ok["loopback"]), default=None),
                      "default_exposed": max((r["exposed"] for r in ok["default"]), default=None)}))


if __name__ == "__main__":
    main()
