"""Cost of the continuity + instability metrics as a fraction of training time, and the error
of the cheap (warm-started subspace iteration) path against the exact batched SVD.

For each preset: the loop's step (forward, backward, clip, ``after_backward``, AdamW, zero_grad)
on random data, timed in interleaved blocks with and without ``after_backward``; ``collect`` is
timed on its own, exact and cheap. Overhead at the preset's ``train.metrics_every`` interval:

    fraction = (t_step_with - t_step_without) / t_step_without + t_collect / (every * t_step)

``exact``: the default (``metrics.svd_every = 0``: exact SVD at every collection); ``mixed``:
exact every 10th collection, cheap otherwise (SCIENCE 4.4.3). The error compares every M1/M2
row (``*.top1_*``, ``*.sub*_*``) of a cheap collect, warm-started from an exact one a few
steps earlier, with an exact collect at the same weights; ``gap_ok`` keeps the weight rows
whose two layers both have s1/s2 >= 1.05 (SCIENCE 4.3: below that v1 is ill-defined).

    python benchmarks/metrics_overhead.py [--presets gpt-tiny mlp-mnist] [--threads 1]

Prints a table, then one JSON line (the last line).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloads.config import MLPConfig, preset  # noqa: E402
from workloads.metrics.collect import MetricsCollector  # noqa: E402
from workloads.models import build_model  # noqa: E402

GPT2_VOCAB = 50257


def _setup(name: str, seed: int = 0):
    cfg = preset(name)
    torch.manual_seed(seed)
    t = cfg.train
    if isinstance(cfg.model, MLPConfig):
        model = build_model(cfg.model)
        x = torch.randn(t.batch_size, cfg.model.d_in)
        y = torch.randint(0, cfg.model.n_classes, (t.batch_size,))
        probe = x[: cfg.metrics.probe_batch]
    else:
        vocab = GPT2_VOCAB if cfg.data.tokenizer == "gpt2" else 65
        model = build_model(cfg.model, vocab_size=vocab)
        x = torch.randint(0, vocab, (t.batch_size, cfg.model.block_size))
        y = torch.roll(x, -1, 1)
        probe_len = min(cfg.model.block_size, cfg.metrics.probe_len or cfg.model.block_size, 256)
        probe = x[: cfg.metrics.probe_batch, :probe_len]
    o = cfg.optim
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2),
                            weight_decay=o.weight_decay)
    return cfg, model, opt, x, y, probe


def _steps(model, opt, x, y, col, n: int, with_metrics: bool, counter: list[int],
           ab_times: list[float] | None = None) -> float:
    """Mean seconds per training step; ``after_backward`` is also timed on its own."""
    t0 = time.perf_counter()
    for _ in range(n):
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if with_metrics:
            t1 = time.perf_counter()
            col.after_backward(counter[0])
            if ab_times is not None:
                ab_times.append(time.perf_counter() - t1)
        opt.step()
        opt.zero_grad(set_to_none=True)
        counter[0] += 1
    return (time.perf_counter() - t0) / n


def _pair_rows(rows: list[dict]) -> dict:
    return {(r["metric"], r["module"], r["layer"]): r["value"] for r in rows
            if ".top1_" in r["metric"] or ".sub" in r["metric"]}


def measure(name: str, rounds: int, block: int, reps: int, budget_s: float) -> dict:
    cfg, model, opt, x, y, probe = _setup(name)
    col = MetricsCollector(model, cfg.metrics, probe_batch=probe)
    every = cfg.train.metrics_every
    counter = [0]
    t_warm = _steps(model, opt, x, y, col, 2, True, counter)  # warm-up (allocator, kernels)
    block = max(1, min(block, round(budget_s / t_warm)))  # steps per timed block
    plain, with_ab, ab_times = [], [], []
    for _ in range(rounds):  # interleaved, so machine-load drift hits both alike
        plain.append(_steps(model, opt, x, y, col, block, False, counter))
        with_ab.append(_steps(model, opt, x, y, col, block, True, counter, ab_times))
    t_plain, t_ab = statistics.median(plain), statistics.median(with_ab)
    t_ab_call = statistics.median(ab_times)
    col.collect(counter[0], exact_svd=True)  # warm call: first-use costs, warm-start state
    t_exact, t_cheap = [], []
    for _ in range(reps):
        for exact, acc in ((True, t_exact), (False, t_cheap)):
            t0 = time.perf_counter()
            col.collect(counter[0], exact_svd=exact)
            acc.append(time.perf_counter() - t0)
    te, tc = statistics.median(t_exact), statistics.median(t_cheap)
    ab_frac = t_ab_call / t_plain  # direct; the step-time difference is the noisier check
    frac_exact = ab_frac + te / (every * t_plain)
    frac_mixed = ab_frac + (0.9 * tc + 0.1 * te) / (every * t_plain)
    # --- cheap vs exact: warm start from an exact collect `block` steps earlier -------------
    col.collect(counter[0], exact_svd=True)
    _steps(model, opt, x, y, col, max(2, block), True, counter)
    cheap_rows, _ = col.collect(counter[0], exact_svd=False)
    exact_rows, _ = col.collect(counter[0], exact_svd=True)
    ce, ee = _pair_rows(cheap_rows), _pair_rows(exact_rows)
    errs = {k: abs(ce[k] - ee[k]) for k in ee if k in ce}
    gap = {(r["module"], r["layer"]): r["value"] for r in exact_rows if r["metric"] == "w.s1_s2"}
    ok = [e for (m, mod, layer), e in errs.items() if m.startswith("w.")
          and min(gap.get((mod, layer), 0), gap.get((mod, layer + 1), 0)) >= 1.05]
    n_params = sum(p.numel() for p in model.parameters())
    return {"preset": name, "params": n_params, "metrics_every": every, "t_step_s": t_plain,
            "after_backward_frac": ab_frac, "step_diff_frac": (t_ab - t_plain) / t_plain,
            "t_collect_exact_s": te, "t_collect_cheap_s": tc,
            "frac_exact": frac_exact, "frac_mixed": frac_mixed, "rows": len(exact_rows),
            "cheap_vs_exact_max_err": max(errs.values()) if errs else float("nan"),
            "cheap_vs_exact_gap_ok_max_err": max(ok) if ok else float("nan"),
            "gap_ok_rows": len(ok), "compared_rows": len(errs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=["gpt-tiny", "mlp-mnist"])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (2 shared CPU cores)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block", type=int, default=8, help="most steps per timed block")
    ap.add_argument("--budget", type=float, default=1.5, help="seconds per timed block")
    ap.add_argument("--reps", type=int, default=2, help="timed collects per path")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    results = [measure(p, args.rounds, args.block, args.reps, args.budget)
               for p in args.presets]
    cols = ["preset", "params", "metrics_every", "t_step_s", "after_backward_frac",
            "step_diff_frac", "t_collect_exact_s", "t_collect_cheap_s", "frac_exact", "frac_mixed",
            "cheap_vs_exact_max_err", "cheap_vs_exact_gap_ok_max_err"]
    print(" | ".join(cols))
    for r in results:
        print(" | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    head = results[0]
    summary = {
        "metrics_overhead_fraction": head["frac_exact"],
        "metrics_overhead_fraction_mixed": head["frac_mixed"],
        "headline_preset": head["preset"],
        "cheap_vs_exact_max_err": max(r["cheap_vs_exact_max_err"] for r in results),
        "cheap_vs_exact_gap_ok_max_err": max(r["cheap_vs_exact_gap_ok_max_err"] for r in results),
        "per_preset": {r["preset"]: {k: r[k] for k in cols[1:]} for r in results},
        "threads": args.threads, "load_avg_1m": os.getloadavg()[0],
        "wall_s": time.perf_counter() - t0, "torch": torch.__version__,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
