"""First-batch loss of the Paper C arms at the default (depth-scaled) init vs ln 10 (issue 13).

Run from the repository root: PYTHONPATH=. .venv/bin/python docs/results/check_first_loss.py
"""

import math

import torch

from workloads import train
from workloads.config import apply_overrides, preset
from workloads.validate import validate

ARMS = (("Res+ReLU", {}), ("Res+None", {"model.activation": "none"}),
        ("NoRes+ReLU", {"model.skip": False}),
        ("Res+RadialRMS", {"model.activation": "radial_rms"}))

if __name__ == "__main__":
    torch.set_num_threads(1)
    for name, ov in ARMS:
        for seed in (0, 1):
            cfg = validate(apply_overrides(preset("mlp-mnist"), {
                **ov, "train.seed": seed, "train.epochs": 0, "train.steps": 1,
                "train.eval_every": 1, "train.metrics_every": 0}))
            r = train.run(cfg)
            print(f"{name} seed {seed}: first-batch loss {r.initial_loss:.3f} "
                  f"(ln 10 = {math.log(10):.3f})", flush=True)
