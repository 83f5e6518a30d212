"""`geosweep train --preset NAME [--set key=value]...`: one workload, no Ray."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from orchestrator.cli.checks import check_corpora
from orchestrator.cli.errors import UsageError


def _train_config(args: argparse.Namespace) -> Any:
    """The preset with the --set overrides, validated; a bad one is a UsageError."""
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
        if "train.steps" in overrides and "train.epochs" not in overrides and cfg.train.epochs:
            # an explicit step count is the training length; the preset's epochs would win
            print(f"[train] note: train.steps={overrides['train.steps']} replaces preset "
                  f"{args.preset}'s {cfg.train.epochs} epochs (train.epochs set to 0)",
                  flush=True)
            overrides["train.epochs"] = 0
        cfg = validate(apply_overrides(cfg, overrides))
    except ConfigError as e:
        raise UsageError(str(e)) from None
    return cfg


def cmd_train(args: argparse.Namespace) -> int:
    cfg = _train_config(args)
    from orchestrator.cli.preflight import check_cache_dir, check_model_memory, check_writable_dir

    check_model_memory([(f"--preset {args.preset}", cfg)], hint="")
    check_corpora([cfg.data.corpus], "")
    if args.resume and not args.out:
        raise UsageError("--resume needs --out: the folder whose last checkpoint to continue from")
    if args.out:
        check_writable_dir(args.out, "--out")
    check_cache_dir(cfg)
    if cfg.train.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"train.device: {cfg.train.device!r} but this machine has no CUDA "
                             "device (use cpu or auto)")
    from orchestrator.cli.heartbeat import Heartbeat, StepTracker
    from workloads.train import run

    total = cfg.train.steps if not cfg.train.epochs else f"{cfg.train.epochs} epochs"
    hb = Heartbeat("train", phase="preparing data, model and step-0 metrics")
    hb.say(f"[train] {args.preset}: {total} steps, eval every {cfg.train.eval_every}; "
           "preparing data, model and step-0 metrics")

    def report(rep) -> None:
        s = rep.scalars
        parts = [f"step {rep.step:>6d}", f"train/loss {s.get('train/loss', float('nan')):.4f}"]
        for k in ("val/loss", "val/acc", "train/lr"):
            if k in s:
                parts.append(f"{k} {s[k]:.4g}")
        if rep.divergence:
            parts.append(f"DIVERGED ({rep.divergence.reason} at step {rep.divergence.step})")
        hb.say(" | ".join(parts))

    monitor = None
    if not args.no_divergence:
        from orchestrator.spec.divergence_rules import DivergenceRules
        from orchestrator.sweep.divergence import DivergenceMonitor

        monitor = DivergenceMonitor(DivergenceRules())
    ckpt = str(Path(args.out) / "checkpoints") if args.out else None
    if args.resume:
        _say_resume_point(ckpt)
    try:
        with hb:
            tracker = StepTracker(monitor, hb, cfg.train.steps, cfg.train.eval_every,
                                  cfg.train.metrics_every)
            res = run(cfg, report=report, monitor=tracker, checkpoint_dir=ckpt,
                      resume=args.resume)
    except RuntimeError as e:  # a checkpoint of another model under --out
        if not args.resume or "loading state_dict" not in str(e):
            raise
        raise UsageError(f"--resume: the checkpoint in {ckpt} is of another model than "
                         "--preset/--set describe; use another --out") from None
    if args.resume and not res.train_losses:
        print(f"[train] nothing left to train: the last checkpoint in {ckpt} is at step "
              f"{res.steps}, train.steps is not above it (raise train.steps to go on); its last "
              "evaluation follows", flush=True)
    print(f"done: {res.steps} steps in {res.train_time_s:.1f}s, final val loss "
          f"{res.final_val_loss:.4f}, best {res.best_val_loss:.4f}")
    return 0 if res.divergence is None else 3


def _say_resume_point(ckpt: str) -> None:
    """One line saying where --resume starts: a restartable job script passes --resume on its
    first run too, so no checkpoint yet is a fresh start, said so, not an error."""
    from workloads.checkpoint import latest_checkpoint

    last = latest_checkpoint(ckpt)
    if last is None:
        print(f"[train] --resume: no checkpoint in {ckpt} yet; starting at step 0", flush=True)
    else:
        print(f"[train] --resume: continuing from {last}", flush=True)


def add(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("train", help="train one workload without Ray")
    t.add_argument("--preset", required=True,
                   help="workload preset (geosweep list shows them), e.g. gpt-debug")
    t.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config field by its dotted key (repeatable), e.g. "
                        "optim.lr=3e-3, train.steps=30 (replaces a preset's epochs), "
                        "model.residual='{family: spheret, p: 2}'; VALUE is a number when it "
                        "reads as one, else YAML")
    t.add_argument("--out", default=None, help="folder for checkpoints")
    t.add_argument("--resume", action="store_true",
                   help="continue from the last checkpoint in --out")
    t.add_argument("--no-divergence", action="store_true", help="do not stop on divergence")
    t.set_defaults(fn=cmd_train)
