"""`geosweep` command line: run | resume | status | report | ui | train | continuity | ...

Every user error is one line on stderr and exit code 2, raised before anything is written or
Ray is started. Heavy imports (torch, ray, mlflow) happen inside the commands, so `--help` and
input errors are instant.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

__all__ = ["main", "UsageError"]

DEFAULT_OUT = "geosweep-runs"


class UsageError(Exception):
    """A user mistake: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse prints a usage block before its error; ours is the one line (see main)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)


# --- helpers -----------------------------------------------------------------------------


def _load_spec(ref: str, args: argparse.Namespace | None = None):
    from orchestrator.sweep.spec import SpecError
    from orchestrator.sweep.spec_yaml import load_spec

    try:
        spec = load_spec(ref)
        if args is not None:
            upd: dict[str, Any] = {}
            if getattr(args, "mlflow_uri", None):
                upd["mlflow_uri"] = args.mlflow_uri
            if getattr(args, "parquet_root", None):
                upd["parquet_root"] = args.parquet_root
            if upd:
                spec = spec.model_copy(update={"tracking": spec.tracking.model_copy(update=upd)})
        return spec
    except SpecError as e:
        raise UsageError(str(e)) from None


def _check_out_dir(out: str) -> Path:
    p = Path(out).expanduser().resolve()
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        raise UsageError(f"--out: {out!r} is not writable")
    # os.access says yes to root everywhere (and /proc says yes to anyone): really try it.
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".geosweep-probe-", dir=probe))
    except OSError as e:
        raise UsageError(f"--out: {out!r} is not writable ({e.strerror})") from None
    return p


def _check_corpora(values: list[Any], where: str) -> None:
    """Local corpus files must exist before Ray starts (a trial would only fail later)."""
    from workloads.data import DataError, resolve_corpus
    from workloads.data.corpora import HUB_CORPORA

    for v in values:
        if isinstance(v, str) and v != "mnist" and v not in HUB_CORPORA:
            try:
                resolve_corpus(v)
            except DataError as e:
                raise UsageError(f"{where}{e}") from None


def _check_spec_corpora(spec) -> None:
    _check_corpora([spec.base_config().data.corpus], "")
    p = spec.space.get("data.corpus")
    if p is not None:
        _check_corpora(p.candidates(), "space.")


def _check_mlflow_uri(uri: str | None) -> None:
    if not uri or not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=3).read()
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise UsageError(f"--mlflow-uri: MLflow server {uri} is unreachable ({e})") from None


def _check_address(address: str | None) -> None:
    if not address or address == "auto":
        return
    import socket
    from urllib.parse import urlparse

    u = urlparse(address if "://" in address else f"ray://{address}")
    host, port = u.hostname, u.port or (8265 if u.scheme.startswith("http") else 6379)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as e:
        raise UsageError(f"--address: cannot reach Ray at {address} ({e})") from None


def prepare_sweep_folder(target: Path, resume: bool, overwrite: bool) -> None:
    """An existing sweep folder is kept only with --resume and deleted only with --overwrite."""
    if target.exists() and not target.is_dir():
        raise UsageError(f"--out: {target} exists and is not a folder")
    if target.exists() and any(target.iterdir()):
        if overwrite:
            shutil.rmtree(target)
        elif not resume:
            raise UsageError(f"{target} already exists: use --resume to continue it or "
                             "--overwrite to start again")


def _sweep_dir(ref: str) -> Path:
    p = Path(ref).expanduser().resolve()
    if not (p / "sweep.json").exists():
        raise UsageError(f"{ref}: not a geosweep sweep folder (no sweep.json)")
    return p


# --- commands ----------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.sweep.space import grid_trials

    spec = _load_spec(args.spec, args)
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite are mutually exclusive")
    _check_spec_corpora(spec)
    if args.dry_run:
        return _dry_run(spec)
    out = _check_out_dir(args.out)
    _check_mlflow_uri(spec.tracking.mlflow_uri)
    _check_address(args.address)
    prepare_sweep_folder(out / spec.name, resume=args.resume, overwrite=args.overwrite)
    del grid_trials
    return _execute(spec, out, args.address, resume=args.resume)


def _execute(spec, out: Path, address: str | None, resume: bool, extend=None) -> int:
    from orchestrator.sweep.spec import SpecError
    from orchestrator.sweep.tuner import run_sweep

    print(f"[geosweep] sweep {spec.name!r}: results in {out / spec.name}", flush=True)
    from cluster.local import RayStartError

    try:
        result = run_sweep(spec, out, address=address, resume=resume,
                           printer=lambda s: print(s, flush=True), extend=extend)
    except RayStartError as e:
        print(f"geosweep: error: {e}", file=sys.stderr)
        return 1
    except SpecError as e:  # an extension that does not apply (checked before Ray starts)
        raise UsageError(str(e)) from None
    c = result.counts
    print(f"[geosweep] finished in {result.wall_s:.0f}s: "
          + ", ".join(f"{v} {k}" for k, v in sorted(c.items())))
    if result.best:
        b = result.best
        print(f"[geosweep] best trial {b['trial']} ({b.get('arm', '')}): "
              f"{spec.search.metric} = {b['final_val_loss']:.4f}")
    p = result.paths
    print(f"[geosweep] Parquet dataset: {p.parquet_root}")
    print(f"[geosweep] MLflow store:    {p.mlflow_uri}")
    print(f"[geosweep] browse:          geosweep ui {p.root}")
    print(f"[geosweep] tables:          geosweep report {p.root}")
    return 0


def _dry_run(spec) -> int:
    from orchestrator.sweep.space import count_trials, grid_trials
    from orchestrator.sweep.trial import resolve_executor, trial_resources

    n = count_trials(spec)
    ex = resolve_executor(spec.resources)
    r = spec.resources
    print(f"sweep {spec.name}: {n} trials, search={spec.search.algorithm}, "
          f"scheduler={spec.scheduler.type}, max_concurrent={spec.search.max_concurrent}")
    print(f"executor={ex}, workers/trial={r.workers_per_trial}, cpus/worker={r.cpus_per_worker}, "
          f"gpus/worker={r.gpus_per_worker}, trial resources={trial_resources(r)}")
    if spec.search.algorithm == "grid":
        for i, flat in enumerate(grid_trials(spec)):
            print(f"  [{i:3d}] " + " ".join(f"{k}={v}" for k, v in flat.items()))
    else:
        print(f"  {n} samples drawn by {spec.search.algorithm} over: {', '.join(spec.space)}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from orchestrator.sweep.experiments import Extension

    for flag in ("more_seeds", "num_samples"):
        n = getattr(args, flag)
        if n is not None and n < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1, got {n}")
    if args.more_seeds and args.num_samples:
        raise UsageError("--more-seeds and --num-samples: give one of them per resume")
    root = _sweep_dir(args.dir)
    spec = _load_spec(str(root / "spec.yaml"))
    _check_address(args.address)
    ext = Extension(more_seeds=args.more_seeds or 0, num_samples=args.num_samples or 0)
    return _execute(spec, root.parent, args.address, resume=True, extend=ext or None)


def cmd_status(args: argparse.Namespace) -> int:
    root = _sweep_dir(args.dir)
    manifest = json.loads((root / "sweep.json").read_text())
    from orchestrator.store.parquet import read_trials

    trials = read_trials(manifest["parquet_root"], sweep=manifest["name"])
    print(f"sweep {manifest['name']}: {manifest['trials']} trials planned, "
          f"{len(trials)} recorded")
    if len(trials):
        counts = trials["status"].value_counts().to_dict()
        print("  " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        cols = [c for c in ("trial", "arm", "status", "final_val_loss", "divergence_reason")
                if c in trials.columns]
        print(trials[cols].to_string(index=False))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    root = _sweep_dir(args.dir)
    from orchestrator.analysis.report import ReportError, write_report

    try:
        out = write_report(root, baseline=args.baseline, metric=args.metric)
    except ReportError as e:
        raise UsageError(str(e)) from None
    print(out.read_text() if out.suffix == ".md" else out)
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    root = _sweep_dir(args.dir)
    manifest = json.loads((root / "sweep.json").read_text())
    uri = manifest["mlflow_uri"]
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


def cmd_train(args: argparse.Namespace) -> int:
    from workloads.config import ConfigError, apply_overrides, parse_value, preset
    from workloads.validate import validate

    try:
        cfg = preset(args.preset)
        overrides = {}
        for item in args.set or []:
            if "=" not in item:
                raise ConfigError(f"--set: expected key=value, got {item!r}")
            k, v = item.split("=", 1)
            overrides[k.strip()] = parse_value(v)
        cfg = validate(apply_overrides(cfg, overrides))
    except ConfigError as e:
        raise UsageError(str(e)) from None
    _check_corpora([cfg.data.corpus], "")
    from workloads.train import run

    def report(rep) -> None:
        s = rep.scalars
        parts = [f"step {rep.step:>6d}", f"train/loss {s.get('train/loss', float('nan')):.4f}"]
        for k in ("val/loss", "val/acc", "lr"):
            if k in s:
                parts.append(f"{k} {s[k]:.4g}")
        if rep.divergence:
            parts.append(f"DIVERGED ({rep.divergence.reason} at step {rep.divergence.step})")
        print(" | ".join(parts), flush=True)

    monitor = None
    if not args.no_divergence:
        from orchestrator.sweep.divergence import DivergenceMonitor, DivergenceRules

        monitor = DivergenceMonitor(DivergenceRules())
    ckpt = str(Path(args.out) / "checkpoints") if args.out else None
    res = run(cfg, report=report, monitor=monitor, checkpoint_dir=ckpt, resume=args.resume)
    print(f"done: {res.steps} steps in {res.train_time_s:.1f}s, final val loss "
          f"{res.final_val_loss:.4f}, best {res.best_val_loss:.4f}")
    return 0 if res.divergence is None else 3


# --- parser ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="geosweep", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a sweep spec (a shipped name or a YAML path)")
    r.add_argument("spec")
    r.add_argument("--out", default=DEFAULT_OUT, help="parent folder of the sweep folder")
    r.add_argument("--address", default=None, help="Ray cluster address (default: local Ray)")
    r.add_argument("--dry-run", action="store_true", help="print trials and resources only")
    r.add_argument("--resume", action="store_true", help="continue an existing sweep folder")
    r.add_argument("--overwrite", action="store_true", help="delete an existing sweep folder")
    r.add_argument("--mlflow-uri", default=None, help="MLflow tracking URI (default: sqlite)")
    r.add_argument("--parquet-root", default=None, help="Parquet root (path or fs URI)")
    r.set_defaults(fn=cmd_run)

    rs = sub.add_parser("resume", help="finish an interrupted sweep, or extend a finished one")
    rs.add_argument("dir")
    rs.add_argument("--address", default=None)
    rs.add_argument("--more-seeds", type=int, default=None, metavar="N",
                    help="add N seeds: every grid arm (or completed search trial) again")
    rs.add_argument("--num-samples", type=int, default=None, metavar="N",
                    help="add N trials to a random/Optuna search (the study continues)")
    rs.set_defaults(fn=cmd_resume)

    s = sub.add_parser("status", help="trials of a sweep folder")
    s.add_argument("dir")
    s.set_defaults(fn=cmd_status)

    rp = sub.add_parser("report", help="tables and figures from a sweep's Parquet dataset")
    rp.add_argument("dir")
    rp.add_argument("--baseline", default=None, help="arm label to compare against")
    rp.add_argument("--metric", default="final_val_loss",
                    help="per-trial value the arm table compares: a trial column "
                    "(final_val_loss, best_val_loss, val/loss) or eval/<corpus>/<metric> "
                    "from `geosweep eval`")
    rp.set_defaults(fn=cmd_report)

    u = sub.add_parser("ui", help="open the MLflow UI on a sweep's store")
    u.add_argument("dir")
    u.add_argument("--host", default="127.0.0.1")
    u.add_argument("--port", type=int, default=5000)
    u.set_defaults(fn=cmd_ui)

    t = sub.add_parser("train", help="train one workload without Ray")
    t.add_argument("--preset", required=True)
    t.add_argument("--set", action="append", metavar="KEY=VALUE")
    t.add_argument("--out", default=None, help="folder for checkpoints")
    t.add_argument("--resume", action="store_true")
    t.add_argument("--no-divergence", action="store_true", help="do not stop on divergence")
    t.set_defaults(fn=cmd_train)

    from orchestrator.cli.cluster import add_cluster_commands
    from orchestrator.cli.continuity import add_continuity_command
    from orchestrator.cli.eval import add_eval_command
    from orchestrator.cli.search_p import add_search_p_command

    add_search_p_command(sub)
    add_continuity_command(sub)
    add_eval_command(sub)
    add_cluster_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help / --version
            return int(e.code or 0)
        return args.fn(args)
    except UsageError as e:
        print(f"geosweep: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("geosweep: interrupted", file=sys.stderr)
        return 130

