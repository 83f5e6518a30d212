"""Whole training step (forward + backward + optimizer) per Manifold Muon assignment and mode.

The cost that search_spaces/manifold_assignment.yaml pays (25 trials x 2000 steps on CPU): its
five arms (unconstrained, all_stiefel, all_dgram, hetero, hetero_inv) with matched init, on
real gradients of random character batches (near rank-deficient, as in training: the solver's
hard case, docs/science.md §3.2), at the optimizers' base learning rates, for each direction
mode (``--modes``, default fast, paper, exact; ``--tol`` / ``--dual-steps`` override every
mode's own). Arms are interleaved step by step (rotating order); the clock is this process's
CPU time (one torch thread), so other programs on a shared machine count little; medians over
the steps after the first ``--skip``.

    python benchmarks/manifold_train_step.py [--preset gpt-debug] [--steps 25] [--skip 3]
        [--modes fast,paper,exact] [--tol T] [--dual-steps K]

Prints a table; the last line is one JSON object: per arm and mode ``<arm>_step_ms_<mode>``
(whole step), ``<arm>_opt_ms_<mode>`` (the optimizer's part), ``<arm>_vs_muon_<mode>`` (whole
step / the unconstrained Muon step), ``<arm>_opt_vs_muon_<mode>`` (optimizer part / Muon's
optimizer part), ``<arm>_dual_residual_max_<mode>`` (worst true residual over the manifold
matrices and timed steps), ``<arm>_dual_passes_median_<mode>`` and ``<arm>_dual_mu_max_<mode>``
(the largest smoothing of a direction taken), ``<arm>_eigh_ms_<mode>`` (the CPU time of the
``torch.linalg.eigh`` calls inside the optimizer step: the fast mode takes one per matrix and
pass, so this column is what the eigh-based solvers cannot go below) and
``<arm>_eigh_floor_vs_muon_<mode>`` ((Muon's whole step + that eigh time) / Muon's whole step:
the smallest ``x muon`` an eigh-based solver with these passes can reach).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

from workloads.config import preset
from workloads.models import build_model
from workloads.optim import build_optimizers

ARMS = ("unconstrained", "all_stiefel", "all_dgram", "hetero", "hetero_inv")
VOCAB = 65  # char-level Shakespeare


class EighClock:
    """Wraps ``torch.linalg.eigh`` (the solvers look it up at each call) and sums the CPU
    time of its calls while ``on``."""

    def __init__(self) -> None:
        self.real, self.on, self.total = torch.linalg.eigh, False, 0.0

    def __call__(self, *args, **kwargs):
        if not self.on:
            return self.real(*args, **kwargs)
        t0 = time.process_time()
        try:
            return self.real(*args, **kwargs)
        finally:
            self.total += time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt-debug")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--modes", default="fast,paper,exact")
    ap.add_argument("--tol", type=float, default=None)
    ap.add_argument("--dual-steps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    modes = args.modes.split(",")
    wl = preset(args.preset)
    torch.manual_seed(0)
    base = build_model(wl.model, vocab_size=VOCAB)
    runs = [("unconstrained", "fast")] + [(a, m) for m in modes for a in ARMS[1:]]
    setups = {}
    for arm, mode in runs:
        cfg = copy.deepcopy(wl.optim)
        cfg.name, cfg.manifold.assignment, cfg.manifold.init_match = "muon", arm, True
        cfg.manifold.dual_mode, cfg.manifold.dual_tol = mode, args.tol
        cfg.manifold.dual_steps = args.dual_steps
        model = copy.deepcopy(base)
        setups[arm, mode] = (model, build_optimizers(model, cfg))
    gen = torch.Generator().manual_seed(1)
    B, T = wl.train.batch_size, wl.model.block_size
    step_t: dict = {r: [] for r in runs}
    opt_t: dict = {r: [] for r in runs}
    worst = dict.fromkeys(runs, 0.0)
    mu_max = dict.fromkeys(runs, 0.0)
    passes: dict = {r: [] for r in runs}
    eigh_t: dict = {r: [] for r in runs}
    clock = EighClock()
    torch.linalg.eigh = clock
    for s in range(args.steps):
        x = torch.randint(0, VOCAB, (B, T + 1), generator=gen)
        for run in runs[s % len(runs):] + runs[: s % len(runs)]:
            model, opts = setups[run]
            t0 = time.process_time()
            _, loss = model(x[:, :-1].contiguous(), x[:, 1:].contiguous())
            loss.backward()
            t1 = time.process_time()
            clock.on, clock.total = True, 0.0
            opts.step()
            clock.on = False
            opts.zero_grad()
            t2 = time.process_time()
            if s < args.skip:
                continue
            step_t[run].append(t2 - t0)
            opt_t[run].append(t2 - t1)
            eigh_t[run].append(clock.total)
            rows = list(opts.health().values())
            if rows:
                worst[run] = max(worst[run], max(r["dual_residual"] for r in rows))
                mu_max[run] = max(mu_max[run], max(r["dual_mu"] for r in rows))
                passes[run].append(max(r["dual_passes"] for r in rows))
    print(f"{args.preset}, torch {torch.__version__}, threads {args.threads}, {args.steps} steps "
          f"({args.skip} untimed), tol {args.tol or 'the mode own'}, "
          f"pass cap {args.dual_steps or 'the mode own'}")
    print(f"{'arm':<14}{'mode':<7}{'step ms':>9}{'opt ms':>9}{'x muon':>8}{'opt x':>7}"
          f"{'worst res':>11}{'passes':>8}{'max mu':>9}{'eigh ms':>9}{'floor x':>8}")
    out: dict[str, float] = {}
    ref = statistics.median(step_t["unconstrained", "fast"])
    ref_opt = statistics.median(opt_t["unconstrained", "fast"])
    for arm, mode in runs:
        st, op = statistics.median(step_t[arm, mode]), statistics.median(opt_t[arm, mode])
        pm = statistics.median(passes[arm, mode]) if passes[arm, mode] else 0.0
        eg = statistics.median(eigh_t[arm, mode])
        print(f"{arm:<14}{mode:<7}{1e3 * st:>9.1f}{1e3 * op:>9.1f}{st / ref:>8.2f}"
              f"{op / ref_opt:>7.2f}{worst[arm, mode]:>11.2e}{pm:>8.1f}{mu_max[arm, mode]:>9.1e}"
              f"{1e3 * eg:>9.1f}{(ref + eg) / ref:>8.2f}")
        sfx = "" if arm == "unconstrained" else f"_{mode}"
        out.update({f"{arm}_step_ms{sfx}": 1e3 * st, f"{arm}_opt_ms{sfx}": 1e3 * op,
                    f"{arm}_vs_muon{sfx}": st / ref, f"{arm}_opt_vs_muon{sfx}": op / ref_opt,
                    f"{arm}_dual_residual_max{sfx}": worst[arm, mode],
                    f"{arm}_dual_passes_median{sfx}": pm,
                    f"{arm}_dual_mu_max{sfx}": mu_max[arm, mode],
                    f"{arm}_eigh_ms{sfx}": 1e3 * eg,
                    f"{arm}_eigh_floor_vs_muon{sfx}": (ref + eg) / ref})
    print(json.dumps({"preset": args.preset, "dual_tol": args.tol,
                      **{k: float(f"{v:.3g}") for k, v in out.items()}}))


if __name__ == "__main__":
    main()
