"""Does the divergence detector catch every diverging run, soon, without flagging healthy ones?

A labelled set of real short runs (``workloads.train.run``, no Ray): gpt-debug over the
residual families and mlp-debug over activations/norms/skip, each at healthy and at exploding
learning rates. Each run trains to the end with every detector watching but none stopping it
(``_Watch`` records each detector's first verdict and returns None), so one run gives both
the undisturbed reference trajectory that defines the label and the detection step.

Labels, from the reference run's per-step train loss (r0 = its first loss; a start far above
ln(classes), as with a 3x init scale, is a bad start, not a divergence):
- onset: the first step whose loss is non-finite, or that starts SUSTAIN = 3 consecutive steps
  (or the rest of the run) with loss > 2 r0 or > 3 b_t + 0.5, b_t the lowest 10-step rolling
  median so far (a collapse after training); failing those, the last step if the final val
  loss is non-finite or > 2 min(r0, ln(classes)). A shorter excursion that recovers is a
  spike, not an onset.
- diverging: an onset exists. healthy: no onset, max loss <= 1.5 r0 and never > 2 b_t + 0.25.
  The rest is borderline: listed, but counted neither as a miss nor as a false positive.

Latency: detection step - onset, clipped at 0 (the early-warning rules may fire before the
loss does), in steps and in report intervals (``train.eval_every``).
Targets (issue 17): no diverging run missed, median latency <= 1 report interval, false
positives <= 1% of healthy runs. Detectors: ``default`` (``DivergenceRules()``) is the one the
targets apply to; ``early`` adds the instability rules (max logit, sigma_max(W_Q) growth,
update/weight ratio) at the thresholds below, reported for comparison.

    python benchmarks/divergence_detection.py [--threads 1] [--quick]

Prints a table, then one JSON line (the last line) with ``missed``, ``false_positive_rate``
and ``median_latency_reports`` (of the default detector).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.spec.divergence_rules import DivergenceRules  # noqa: E402
from orchestrator.sweep.divergence import DivergenceMonitor  # noqa: E402
from workloads.config import PRESETS, apply_overrides  # noqa: E402
from workloads.report import Divergence, StepInfo  # noqa: E402
from workloads.train import run  # noqa: E402
from workloads.validate import validate  # noqa: E402

DETECTORS = {
    "default": DivergenceRules(),
    "early": DivergenceRules(max_logit=50.0, sigma_q_growth=10.0, update_ratio_max=1.0),
}
GPT_FAMILIES = ("pre_ln", "post_ln", "peri_ln", "pre_dyt", "keel", "geonorm", "spheret")
GPT_LRS = (1e-3, 1e-2, 1.0, 30.0)  # 30: no clipping
MLP_VARIANTS = {
    "relu": {},
    "gelu_ln": {"model.activation": "gelu", "model.norm": "layernorm"},
    "radial_rms": {"model.activation": "radial_rms"},
    "noskip": {"model.skip": False},
    "init3": {"model.init_scale": 3.0},
}
MLP_LRS = (1e-4, 1e-3, 1e-2, 0.3, 3.0)
SUSTAIN = 3  # steps a finite excursion must last to be an onset; shorter ones are borderline


class _Watch:
    """Several monitors on one run; records each one's first verdict, never stops the run."""

    def __init__(self) -> None:
        self.mons = {k: DivergenceMonitor(r) for k, r in DETECTORS.items()}
        self.first: dict[str, Divergence] = {}

    def signals(self, step: int) -> frozenset[str]:
        return frozenset().union(*(m.signals(step) for m in self.mons.values()))

    def check(self, info: StepInfo) -> None:
        for k, m in self.mons.items():
            if k not in self.first:
                wanted = m.signals(info.step)  # each monitor sees only what it asked for
                mine = StepInfo(info.step, info.loss, info.grad_norm, info.lr,
                                {x: v for x, v in info.extras.items() if x in wanted},
                                info.param_max, info.chance_loss)
                if (d := m.check(mine)) is not None:
                    self.first[k] = d

    def check_eval(self, step: int, val_loss: float, final: bool) -> None:
        for k, m in self.mons.items():
            if k not in self.first and (d := m.check_eval(step, val_loss, final)) is not None:
                self.first[k] = d

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def label(losses: list[float], final_val: float, chance: float) -> tuple[str, int | None]:
    """(diverging | healthy | borderline, onset step or None) of a reference trajectory."""
    r0 = losses[0] if math.isfinite(losses[0]) else chance  # the run's own start
    best, calm, bad = math.inf, True, []
    for t, v in enumerate(losses, start=1):
        if not math.isfinite(v):
            bad.append(2)  # non-finite: an onset by itself
        else:
            bad.append(int(v > 2 * r0 or (best < math.inf and v > 3 * best + 0.5)))
            calm = calm and v <= 1.5 * r0 and not (best < math.inf and v > 2 * best + 0.25)
        if t >= 10:
            best = min(best, statistics.median([x for x in losses[t - 10:t] if math.isfinite(x)]
                                               or [math.inf]))
    for i, b in enumerate(bad):  # a non-finite step, or SUSTAIN steps above (or to the end)
        if b == 2 or (b and all(bad[i:i + SUSTAIN])):
            return "diverging", i + 1
    if not math.isfinite(final_val) or final_val > 2 * min(r0, chance):
        return "diverging", len(losses)
    return ("healthy" if calm else "borderline"), None


def runs(quick: bool) -> list[tuple[str, str, dict]]:
    out = []
    fams = GPT_FAMILIES[:2] if quick else GPT_FAMILIES
    for fam in fams:
        for lr in GPT_LRS:
            over = {"model.residual.family": fam, "optim.lr": lr, "train.steps": 60}
            if lr >= 30:
                over["optim.grad_clip"] = 0.0
            out.append((f"gpt/{fam}", "gpt-debug", over))
    variants = dict(list(MLP_VARIANTS.items())[:2]) if quick else MLP_VARIANTS
    for name, extra in variants.items():
        for lr in MLP_LRS:
            out.append((f"mlp/{name}", "mlp-debug", {**extra, "optim.lr": lr, "train.steps": 100}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="a few runs only (smoke test)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t_all = time.perf_counter()
    rows = []
    for name, preset, over in runs(args.quick):
        cfg = validate(apply_overrides(PRESETS[preset](), {"train.metrics_every": 0,
                                                           "train.eval_every": 10, **over}))
        watch = _Watch()
        res = run(cfg, monitor=watch)
        chance = watch.mons["default"].chance_loss or math.inf
        kind, onset = label(res.train_losses, res.final_val_loss, chance)
        row = {"run": name, "lr": over["optim.lr"], "label": kind, "onset": onset,
               "max_loss": max((v for v in res.train_losses if math.isfinite(v)), default=math.nan),
               "final_val": res.final_val_loss, "every": cfg.train.eval_every}
        for k in DETECTORS:
            d = watch.first.get(k)
            row[k] = f"{d.reason}@{d.step}" if d else "-"
            row[f"{k}_step"] = d.step if d else None
        rows.append(row)
    summary = {"runs": len(rows), "wall_s": round(time.perf_counter() - t_all, 1),
               "threads": args.threads}
    for k in DETECTORS:
        summary[k] = _score(rows, k)
    _table(rows)
    for k in DETECTORS:
        print(f"{k}: " + ", ".join(f"{m}={v}" for m, v in summary[k].items()))
    print(json.dumps({**summary, **summary["default"]}))


def _score(rows: list[dict], k: str) -> dict:
    div = [r for r in rows if r["label"] == "diverging"]
    healthy = [r for r in rows if r["label"] == "healthy"]
    caught = [r for r in div if r[f"{k}_step"] is not None]
    lat = [max(0, r[f"{k}_step"] - r["onset"]) for r in caught]
    lat_rep = [max(0, r[f"{k}_step"] - r["onset"]) / r["every"] for r in caught]
    fp = sum(r[f"{k}_step"] is not None for r in healthy)
    return {
        "diverging": len(div), "healthy": len(healthy),
        "borderline": sum(r["label"] == "borderline" for r in rows),
        "missed": len(div) - len(caught),
        "false_positives": fp,
        "false_positive_rate": round(fp / len(healthy), 4) if healthy else None,
        "median_latency_steps": statistics.median(lat) if lat else None,
        "max_latency_steps": max(lat) if lat else None,
        "median_latency_reports": statistics.median(lat_rep) if lat_rep else None,
        "flagged_borderline": sum(r[f"{k}_step"] is not None for r in rows
                                  if r["label"] == "borderline"),
    }


def _table(rows: list[dict]) -> None:
    cols = ["run", "lr", "label", "onset", "max_loss", "final_val", *DETECTORS]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols))


if __name__ == "__main__":
    main()
