"""A Ray that listens on 127.0.0.1 only: the setting for a one-node local Ray
(``loopback_env``), and ``ray start`` for a node that joins a head on loopback (run as a
script: ``python cluster/ray_loopback.py start --address=127.0.0.1:PORT
--node-ip-address=127.0.0.1 ...``).

Ray 2.60 decides where a node listens from its node IP: 127.0.0.1 (or ``localhost``/``::1``)
binds every server of the node (raylet, core workers, dashboard agent and its metrics exporter,
runtime-env agent) to 127.0.0.1; any other IP binds them to all interfaces. ``ray start``
turns ``--node-ip-address=127.0.0.1`` and ``--address=127.0.0.1:PORT`` into the machine's
routable IP (``ray/_private/services.py`` ``resolve_ip_for_localhost``) unless
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, and with that setting it refuses to start a node that
joins a head. A head is fine with the setting (``loopback_env``); a joining node
needs this launcher: Ray's own CLI with loopback hosts kept as given (docs/platform.md,
"Loopback-only Ray"). Nothing here imports geosweep: it also runs as a plain script.
"""

from __future__ import annotations

import os
import sys

__all__ = ["LOOPBACK_VAR", "loopback_env", "loopback_in_effect", "is_loopback_address", "main"]

# "0": Ray's get_node_ip_address answers 127.0.0.1 (not the routable IP) on Linux too
LOOPBACK_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def loopback_env() -> dict[str, str]:
    """Set (and return) what makes a one-node local Ray listen on 127.0.0.1 only; a value the
    user exported (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1``: Ray's default, all interfaces) wins.
    Not for a driver's runtime_env nor a node that joins a head: "0" makes `ray start` refuse."""
    os.environ.setdefault(LOOPBACK_VAR, "0")
    return {LOOPBACK_VAR: os.environ[LOOPBACK_VAR]}


def loopback_in_effect() -> None:
    """Make an already imported Ray follow the variable: Ray reads it once, at import, and a
    process may have imported Ray before ``loopback_env()`` (a test session, a notebook)."""
    from ray._private import ray_constants

    if os.environ.get(LOOPBACK_VAR) == "0":
        ray_constants.ENABLE_RAY_CLUSTER = False


def is_loopback_address(address: str) -> bool:
    """``127.0.0.1:PORT`` / ``localhost:PORT`` (a GCS address on this machine)."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host in ("127.0.0.1", "localhost")


def main(argv: list[str]) -> int:
    # "1" while Ray is imported: `ray start` reads it once, then refuses to join a head on "0"
    os.environ[LOOPBACK_VAR] = "1"
    from ray._private import services
    from ray.scripts.scripts import main as ray_main

    resolve = services.resolve_ip_for_localhost

    def keep_loopback(host: str) -> str:
        # Ray's own swaps a loopback host for the routable IP: the node would then listen on
        # all interfaces and look for the head where the head does not listen
        return "127.0.0.1" if host in ("127.0.0.1", "localhost") else resolve(host)

    # both callers (the node IP in `ray start`, the bootstrap address through
    # canonicalize_bootstrap_address) look the function up on the module when they run
    services.resolve_ip_for_localhost = keep_loopback
    # the node's processes (raylet, agents, workers) see what a loopback head's see
    os.environ[LOOPBACK_VAR] = "0"
    sys.argv = ["ray", *argv]
    return ray_main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
