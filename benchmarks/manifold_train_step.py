"""Whole training step (forward + backward + optimizer) of gpt-debug per Manifold Muon assignment.

The cost that search_spaces/manifold_assignment.yaml pays (25 trials x 2000 steps on CPU): its
five arms (unconstrained, all_stiefel, all_dgram, hetero, hetero_inv) with its dual settings
(20 dual steps, tol 1e-6, matched init), on real gradients of random character batches, at the
optimizers' base learning rates (no warm-up or decay schedule). Real
gradients matter: they are near rank-deficient, so the dual needs ~10 Newton passes where the
fixed full-rank gradients of benchmarks/optimizer_step.py need ~3 (docs/science.md §3.2).
Arms are interleaved step by step (rotating order); the clock is this process's CPU time (one
torch thread), so other programs on a shared machine count little; medians over the steps after
the first ``--skip``.

    python benchmarks/manifold_train_step.py [--steps 25] [--skip 3] [--tol 1e-6]

Prints a table; the last line is one JSON object: per arm ``<arm>_step_ms`` (whole step),
``<arm>_opt_ms`` (the optimizer's part), ``<arm>_dual_residual_max`` (worst final residual over
the manifold matrices and timed steps) and ``<arm>_dual_passes_median`` (median over timed steps
of the worst matrix's passes), and ``<arm>_vs_unconstrained`` (step time ratio).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

from workloads.config import gpt_debug
from workloads.models import build_model
from workloads.optim import build_optimizers

ARMS = ("unconstrained", "all_stiefel", "all_dgram", "hetero", "hetero_inv")
VOCAB = 65  # char-level Shakespeare


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    wl = gpt_debug()
    torch.manual_seed(0)
    base = build_model(wl.model, vocab_size=VOCAB)
    setups = {}
    for arm in ARMS:
        cfg = copy.deepcopy(wl.optim)
        cfg.name, cfg.manifold.assignment, cfg.manifold.init_match = "muon", arm, True
        cfg.manifold.dual_steps, cfg.manifold.dual_tol = 20, args.tol
        model = copy.deepcopy(base)
        setups[arm] = (model, build_optimizers(model, cfg))
    gen = torch.Generator().manual_seed(1)
    B, T = wl.train.batch_size, wl.model.block_size
    step_t = {a: [] for a in ARMS}
    opt_t = {a: [] for a in ARMS}
    worst = dict.fromkeys(ARMS, 0.0)
    passes: dict[str, list[float]] = {a: [] for a in ARMS}
    for s in range(args.steps):
        x = torch.randint(0, VOCAB, (B, T + 1), generator=gen)
        for arm in ARMS[s % len(ARMS):] + ARMS[: s % len(ARMS)]:
            model, opts = setups[arm]
            t0 = time.process_time()
            _, loss = model(x[:, :-1].contiguous(), x[:, 1:].contiguous())
            loss.backward()
            t1 = time.process_time()
            opts.step()
            opts.zero_grad()
            t2 = time.process_time()
            if s < args.skip:
                continue
            step_t[arm].append(t2 - t0)
            opt_t[arm].append(t2 - t1)
            rows = list(opts.health().values())
            if rows:
                worst[arm] = max(worst[arm], max(r["dual_residual"] for r in rows))
                passes[arm].append(max(r["dual_passes"] for r in rows))
    print(f"gpt-debug, torch {torch.__version__}, threads {args.threads}, {args.steps} steps "
          f"({args.skip} untimed), dual tol {args.tol:g}")
    print(f"{'arm':<14}{'step ms':>9}{'opt ms':>9}{'x uncon':>8}{'worst res':>11}{'passes':>8}")
    out: dict[str, float] = {}
    ref = statistics.median(step_t["unconstrained"])
    for arm in ARMS:
        st, op = statistics.median(step_t[arm]), statistics.median(opt_t[arm])
        pm = statistics.median(passes[arm]) if passes[arm] else 0.0
        print(f"{arm:<14}{1e3 * st:>9.1f}{1e3 * op:>9.1f}{st / ref:>8.1f}{worst[arm]:>11.2e}"
              f"{pm:>8.1f}")
        out.update({f"{arm}_step_ms": 1e3 * st, f"{arm}_opt_ms": 1e3 * op,
                    f"{arm}_vs_unconstrained": st / ref, f"{arm}_dual_residual_max": worst[arm],
                    f"{arm}_dual_passes_median": pm})
    print(json.dumps({"preset": "gpt-debug", "dual_tol": args.tol,
                      **{k: float(f"{v:.3g}") for k, v in out.items()}}))


if __name__ == "__main__":
    main()
