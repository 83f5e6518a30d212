"""`geosweep` command line: run | resume | status | report | ui | train | continuity | ...

Every user error is one line on stderr and exit code 2, raised before anything is written or
Ray is started. Heavy imports (torch, ray, mlflow) happen inside the commands, so `--help` and
input errors are instant.
"""

from __future__ import annotations

import importlib
import os
import sys

from orchestrator.cli.errors import Parser, UsageError

__all__ = ["main", "entry", "build_parser", "COMMANDS", "UsageError", "say_error", "check_argv"]

# command -> the module that adds it (``add(subparsers)``) and runs it. Imported only when the
# parser is built; each module imports its heavy dependencies inside its command function.
COMMANDS = {
    "run": "orchestrator.cli.run",
    "resume": "orchestrator.cli.resume",
    "status": "orchestrator.cli.status",
    "report": "orchestrator.cli.report",
    "ui": "orchestrator.cli.ui",
    "train": "orchestrator.cli.train",
    "search-p": "orchestrator.cli.search_p",
    "continuity": "orchestrator.cli.continuity",
    "eval": "orchestrator.cli.eval",
    "list": "orchestrator.cli.listing",
    "submit | jobs | logs | stop": "orchestrator.cli.cluster",
    "ray": "orchestrator.cli.warm_ray",
}


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("geosweep")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> Parser:
    p = Parser(prog="geosweep", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"geosweep {version()}",
                   help="print geosweep's version and exit")
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        importlib.import_module(module).add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; every error is one redacted line on stderr (``say_error``)."""
    from cluster.redact import RedactingStream
    from orchestrator.cli.failures import CURRENT

    CURRENT.update(sweep=None, writing=None)  # main() may run many times in one process
    # MLflow prints "View run ... at: URL" for every run it ends on a tracking server: one per
    # trial in a sweep's (or a Ray Job's) output; `geosweep ui` and the summary link them
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    # every line the command prints (its own, its libraries', its logging) goes through the
    # one redaction (cluster/redact.py): no password of a URL or token reaches the terminal
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
    try:
        return _main(argv)
    finally:
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except (OSError, ValueError):  # a closed pipe: nothing left to say on it
                pass
        sys.stdout, sys.stderr = streams


def say_error(message: object) -> None:
    """``geosweep: error: MESSAGE`` as one line (a message of several lines is joined)."""
    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    print(f"geosweep: error: {text}", file=sys.stderr)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        check_argv(sys.argv[1:] if argv is None else argv)
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help / --version
            return int(e.code or 0)
        return args.fn(args)
    except UsageError as e:
        say_error(e)
        return 2
    except KeyboardInterrupt:
        print("geosweep: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # known failures are one line (cli/failures.py); bugs still raise
        from orchestrator.cli.failures import one_line

        known = one_line(e)
        if known is None:
            raise
        say_error(known[1])
        return known[0]


def check_argv(argv: list[str]) -> None:
    """An argument that is not valid UTF-8 (a byte the shell passed through as a surrogate)
    is refused here, naming it: specs, values, paths and the Parquet/MLflow stores all are
    UTF-8 text, and the libraries below fail on it with tracebacks or many lines."""
    for i, a in enumerate(argv):
        try:
            a.encode("utf-8")
        except UnicodeEncodeError as e:
            flag = next((p for p in reversed(argv[:i]) if p.startswith("--")), None)
            bad = a.encode("utf-8", "surrogateescape")[e.start:e.start + 1]
            what = f"{flag} value" if flag and i and argv[i - 1] == flag else "argument"
            shown = a.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise UsageError(f"{what} '{shown}' is not valid UTF-8 (byte 0x{bad.hex()} at "
                             f"{e.start}); use UTF-8 text") from None


# Commands whose process ends right after the sweep or the report: nothing is left to clean
# up once Ray is shut down and the output flushed (every file they write is closed, MLflow
# calls are synchronous), so the interpreter's teardown (finalizers and garbage of torch, Ray,
# MLflow, pyarrow, pandas, matplotlib: ~1 s, 1.5 s after a 1,000-trial report) is skipped; a
# user waits for the results, not for that.
_FAST_EXIT = ("run", "resume", "search-p", "report")


def entry() -> None:
    """The `geosweep` executable: ``main()``, then a fast exit after sweeps."""
    rc = main()
    if len(sys.argv) > 1 and sys.argv[1] in _FAST_EXIT:
        from cluster.local import shutdown

        shutdown()  # a Ray this process started; a joined one (warm, a cluster) stays up
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)
