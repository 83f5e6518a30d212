"""The alpha_init pilot (issue 30 item 4): SpheretNorm's step init, 1.0 (the value used so far)
against nGPT's 0.05, at norm_ablation's settings, before norm_ablation crosses or fixes it.

Every trial is norm_ablation's config (search_spaces/norm_ablation.yaml: gpt-debug with 6
layers, AdamW wd 0, 50 warm-up steps, 1000 steps, its divergence rules) with one arm's overrides,
trained in this process without Ray (workloads.train.run with the spec's DivergenceMonitor).
Arms: SpheretNorm p = 1 and p = inf x alpha_init {1.0, 0.05} x lr {1e-3, 1e-2, 1e-1}, and Pre-LN
at the same lrs as the reference, x 2 seeds. Recorded per trial: the final val loss, whether
and how it diverged, the saturation control at the end (the worst sublayer's share of tokens
with beta > pi/2, and its mean beta) and the first and last step size a_0 = a_1.

Run from the repository root (about 15 CPU-minutes on a quiet core):
    PYTHONPATH=. .venv/bin/python docs/results/alpha_init_pilot.py docs/results/alpha_init_pilot.csv
"""

from __future__ import annotations

import csv
import math
import sys
import time

import torch

from orchestrator.spec.yaml_reader import load_spec
from orchestrator.sweep.divergence import DivergenceMonitor
from workloads.train import run

FAMILIES = {
    "spheret p=1": {"model.residual": {"family": "spheret", "p": 1.0}},
    "spheret p=inf": {"model.residual": {"family": "spheret", "p": math.inf}},
    "pre_ln": {"model.residual": {"family": "pre_ln"}},
}
ALPHA_INITS = (1.0, 0.05)
LRS = (1e-3, 1e-2, 1e-1)
SEEDS = (0, 1)
FIELDS = ["family", "alpha_init", "lr", "seed", "status", "reason", "step_stopped",
          "final_val_loss", "sat_share_end", "beta_max_end", "a0_start", "a0_end", "wall_s"]


def arms():
    for fam, ov in FAMILIES.items():
        inits = ALPHA_INITS if fam != "pre_ln" else (None,)
        for a in inits:
            for lr in LRS:
                for seed in SEEDS:
                    res = dict(ov["model.residual"])
                    if a is not None:
                        res["alpha_init"] = a
                    yield fam, a, lr, seed, {"model.residual": res, "optim.lr": lr,
                                             "train.seed": seed}


def one(spec, fam, a, lr, seed, flat) -> dict:
    cfg = spec.trial_config(flat)
    last: dict = {}

    def report(rep) -> None:
        last.update(rep.scalars)
        if rep.step == cfg.train.eval_every:
            last["a0_first"] = rep.scalars.get("stream/a/0", math.nan)

    t0 = time.perf_counter()
    out = run(cfg, report=report, monitor=DivergenceMonitor(spec.divergence))
    div = out.divergence
    return {"family": fam, "alpha_init": "" if a is None else a, "lr": lr, "seed": seed,
            "status": "diverged" if div else "completed", "reason": div.reason if div else "",
            "step_stopped": div.step if div else out.steps,
            "final_val_loss": out.final_val_loss,
            "sat_share_end": last.get("stream/frac_beta_gt_half_pi_max", math.nan),
            "beta_max_end": last.get("stream/beta_mean_max", math.nan),
            "a0_start": "" if a is None else a, "a0_end": last.get("stream/a/0", math.nan),
            "wall_s": round(time.perf_counter() - t0, 1)}


def main(out_csv: str) -> None:
    torch.set_num_threads(1)
    spec = load_spec("norm_ablation")
    rows = []
    for fam, a, lr, seed, flat in arms():
        r = one(spec, fam, a, lr, seed, flat)
        rows.append(r)
        print(", ".join(f"{k}={r[k]}" for k in FIELDS), flush=True)
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "alpha_init_pilot.csv")
