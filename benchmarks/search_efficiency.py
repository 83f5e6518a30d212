"""How much compute does search-p need to match the full grid? (issue 5, target <= 1/3)

On one small real p-search (gpt-debug with SpheretNorm, char Shakespeare, real training on
local Ray), run both:
- the full grid: p grid x lr grid x seeds, every trial at the full budget, no early stopping;
- ``search_p``: Optuna TPE over log p in [0.25, 64] + inf and log lr (the grid's lr range),
  ASHA, then the top-k confirmation.

Compute is counted in trial-steps (training steps summed over trials; a diverged or ASHA-
stopped trial counts the steps it ran). The grid's answer is its best arm (mean final val loss
over seeds); the search "comes within 1%" at the first completed stage-1 trial whose final val
loss is <= 1.01 x that. Its compute up to then counts every stage-1 trial that had STARTED by
the time that trial finished, in full (an upper bound under concurrency; the lower bound,
trials ENDED by then, is reported too). Default: 5 p x 3 lr x 2 seeds of 40 steps (1,200
grid trial-steps) against 12 search trials (measured: about 8 min on the shared 2-core machine,
when Ray starts promptly); ``--quick``: 3 p x 2 lr x 2 seeds of 24 steps against 6 trials.

Prints a table, then as the last line one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.spec.yaml_reader import spec_from_dict  # noqa: E402
from orchestrator.store.parquet import read_trials  # noqa: E402
from orchestrator.sweep.search_p import search_p  # noqa: E402
from orchestrator.sweep.tuner import run_sweep  # noqa: E402

FULL = {"p": [0.25, 1.0, 4.0, 16.0, "inf"], "lr": [1e-3, 3e-3, 1e-2], "seeds": 2, "steps": 40,
        "eval_every": 10, "trials": 12}
QUICK = {"p": [0.5, 4.0, "inf"], "lr": [2e-3, 1e-2], "seeds": 2, "steps": 24, "eval_every": 8,
         "trials": 6}


def _common(cfg: dict, name: str) -> dict:
    return {"name": name, "workload": {"preset": "gpt-debug",
                                       "overrides": {"model.residual.family": "spheret"}},
            "budget": {"steps": cfg["steps"], "eval_every": cfg["eval_every"],
                       "metrics_every": 0},
            "resources": {"workers_per_trial": 1, "cpus_per_worker": 1}}


def grid_spec(cfg: dict):
    d = _common(cfg, "effgrid")
    d.update(space={"model.residual.p": {"grid": cfg["p"]}, "optim.lr": {"grid": cfg["lr"]}},
             seeds=cfg["seeds"], search={"algorithm": "grid", "max_concurrent": 2})
    return spec_from_dict(d)


def search_spec(cfg: dict):
    d = _common(cfg, "effsearch")
    d.update(space={"model.residual.p": {"loguniform": [0.25, 64], "also": ["inf"]},
                    "optim.lr": {"loguniform": [min(cfg["lr"]), max(cfg["lr"])]}},
             seeds=[0], search={"algorithm": "optuna-tpe", "num_samples": cfg["trials"],
                                "max_concurrent": 2, "seed": 0},
             scheduler={"type": "asha", "grace_period": cfg["eval_every"],
                        "reduction_factor": 3, "max_t": cfg["steps"]})
    return spec_from_dict(d)


def _connect(tries: int = 3) -> None:
    """Start local Ray once for both runs; Ray gives a new raylet only 30 s to register, which a
    loaded 2-core machine can miss, so retry."""
    import ray

    from cluster.local import connect

    for i in range(tries):
        try:
            connect()
            return
        except Exception:  # noqa: BLE001 - Ray raises a bare Exception on this timeout
            ray.shutdown()
            if i == tries - 1:
                raise
            time.sleep(10)


def _steps(df) -> int:
    return int(df["last_step"].fillna(0).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the reduced grid and search")
    ap.add_argument("--out", default=None, help="folder for the runs (default: a temp dir)")
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--confirm-seeds", type=int, default=2)
    args = ap.parse_args()
    cfg = QUICK if args.quick else FULL
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    out = Path(args.out or tempfile.mkdtemp(prefix="geosweep-eff-"))
    quiet = lambda s: None  # noqa: E731 - Tune progress lines would bury the table

    _connect()
    t0 = time.time()
    g = run_sweep(grid_spec(cfg), out, printer=quiet)
    t_grid = time.time() - t0
    gt = read_trials(g.paths.parquet_root, sweep="effgrid")
    ok = gt[gt["status"] == "completed"]
    arms = ok.groupby("arm")["final_val_loss"].mean().sort_values()
    grid_best, grid_arm = float(arms.iloc[0]), str(arms.index[0])
    grid_steps = _steps(gt)

    t1 = time.time()
    res = search_p(search_spec(cfg), out, top_k=args.top_k, confirm_seeds=args.confirm_seeds,
                   printer=quiet)
    t_search = time.time() - t1
    st = read_trials(str(out / "effsearch" / "parquet"), sweep="effsearch")
    thr = 1.01 * grid_best
    done = st[st["status"] == "completed"].sort_values("ended_at")
    hits = done[done["final_val_loss"] <= thr]
    stage1_steps = _steps(st)
    if len(hits):
        t_hit = float(hits["ended_at"].iloc[0])
        to_1pct = _steps(st[st["started_at"] <= t_hit])
        to_1pct_lower = _steps(st[st["ended_at"] <= t_hit])
    else:
        to_1pct = to_1pct_lower = None
    search_best = float(done["final_val_loss"].min()) if len(done) else math.nan
    confirm_steps = res.trial_steps["confirm"]

    rows = [("grid", f"{len(cfg['p'])} p x {len(cfg['lr'])} lr x {cfg['seeds']} seeds",
             len(gt), grid_steps, grid_best, t_grid),
            ("search-p stage 1", f"TPE + ASHA, {cfg['trials']} trials", len(st), stage1_steps,
             search_best, t_search),
            ("search-p confirm", f"top {args.top_k} x {args.confirm_seeds} seeds",
             len(res.confirm), confirm_steps, res.best["mean"] if res.best else math.nan, math.nan)]
    print(f"\nsearch efficiency ({'quick' if args.quick else 'full'} mode, {cfg['steps']} steps "
          f"per full trial, gpt-debug spheret; runs in {out})")
    print(f"{'run':<18} {'what':<28} {'trials':>6} {'trial-steps':>11} {'best val':>9} "
          f"{'wall s':>7}")
    for name, what, n, steps, best, wall in rows:
        print(f"{name:<18} {what:<28} {n:>6} {steps:>11} {best:>9.4f} {wall:>7.0f}")
    frac = None if to_1pct is None else to_1pct / grid_steps
    print(f"grid best arm: {grid_arm} ({grid_best:.4f}); 1% threshold {thr:.4f}")
    if to_1pct is None:
        print("search-p stage 1 did not come within 1% of the grid's best")
    else:
        print(f"search-p within 1% after {to_1pct} trial-steps (>= {to_1pct_lower} if only ended "
              f"trials count): {frac:.3f} of the grid; with confirmation "
              f"{(stage1_steps + confirm_steps) / grid_steps:.3f} (whole search)")
    b = res.best or {}
    print(json.dumps({
        "mode": "quick" if args.quick else "full",
        "search_compute_fraction": None if frac is None else round(frac, 4),
        "grid_trial_steps": grid_steps,
        "search_trial_steps_to_1pct": to_1pct,
        "search_trial_steps_to_1pct_lower": to_1pct_lower,
        "search_stage1_trial_steps": stage1_steps,
        "search_confirm_trial_steps": confirm_steps,
        "whole_search_fraction": round((stage1_steps + confirm_steps) / grid_steps, 4),
        "grid_best": round(grid_best, 5), "grid_best_arm": grid_arm,
        "search_best": round(search_best, 5),
        "search_best_p_confirmed": "inf" if b.get("p") == math.inf else b.get("p"),
        "search_best_confirmed_mean": b.get("mean"),
        "grid_wall_s": round(t_grid, 1), "search_wall_s": round(t_search, 1),
    }))


if __name__ == "__main__":
    main()
