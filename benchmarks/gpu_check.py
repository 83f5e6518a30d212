"""The GPU path's device check (issue 31): four checks, each under its own time budget, in
<= 8 minutes on one H200; a table per check, a summary, and one JSON line last.

(a) sweep vs back to back: a real ``geosweep run`` of search_spaces/gpu_smoke.yaml (8 trials
    packed 4 per GPU, each in its own Tune trial process) against the same trainings run one
    after another in this process: wall ratio, per-trial overhead (trial wall - training time,
    from the sweep's records; target <= 2 s), the GPU each trial ran on.
(b) compiled vs eager, per residual family (benchmarks/compile_check.py): loss and gradient
    differences over a few AdamW steps, fp32 with TF32 off (tolerance: fp32 rounding), then
    bf16 autocast for Pre-LN and SpheretNorm p=1 (where the compiled gradients once differed).
(c) tokens/s and MFU per family, eager and compiled, B=16 and 32 (gpt2-small, T=1024, bf16;
    benchmarks/gpu_throughput.py's timing), with the memory estimate that packing plans with
    (orchestrator/sweep/gpu_fit.py) next to the measured peak. Targets: compiled Pre-LN MFU >=
    0.45 at B=16 and >= 0.50 at B=32; SpheretNorm p=1 >= 0.85x Pre-LN's tokens/s eager, >=
    0.95x compiled.
(d) optimizer step time: AdamW, Muon, and Manifold Muon (assignments hetero and all_stiefel,
    ``optim.manifold.dual_mode`` paper and fast), 10 timed steps each, / Muon, with peak memory
    (target: Muon <= 1.15x AdamW). Rows whose config key this checkout lacks are skipped with a
    note.

``--cpu`` runs every check dry on the CPU at tiny sizes (the CI test runs it so it cannot rot):
figures from it say nothing about a GPU. A row that fails prints an error row; a check past its
budget stops (SIGALRM) and keeps its finished rows.

    python benchmarks/gpu_check.py            # on a CUDA machine (benchmarks/gpu_check.sh)
    python benchmarks/gpu_check.py --cpu      # dry, tiny sizes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import gpu_check_sweep
import gpu_checks as checks
import torch

ROOT = Path(__file__).resolve().parents[1]
CHECKS = {"a": gpu_check_sweep.check_a, "b": checks.check_b, "c": checks.check_c,
          "d": checks.check_d}
TITLES = {"a": "geosweep run gpu_smoke vs the same trainings back to back",
          "b": "compiled vs eager gradients per family",
          "c": "tokens/s and MFU per family, eager and compiled",
          "d": "AdamW, Muon, Manifold Muon step time / Muon"}

# Sizes and budgets (s). gpu: what the issue asks for; cpu: the same code at tiny sizes.
PROFILES = {
    "gpu": dict(preset="gpt2-small", batches=(16, 32), dtype="bf16", steps=10, warmup=3,
                muon_steps=10, peak_tflops=989.0, compiled_first=("pre_ln", "spheret_p1"),
                compile_more=True, compile_reserve=45.0,
                b_model=dict(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=512),
                b_batch=8, b_steps=3, b_rows=[
                    ("spheret_p1", "bf16"), ("spheret_p1", "float32"), ("pre_ln", "bf16"),
                    ("pre_ln", "float32"), ("geonorm", "float32"), ("spheret_p2", "float32"),
                    ("post_ln", "float32"), ("peri_ln", "float32"), ("pre_dyt", "float32"),
                    ("keel", "float32")],
                a_sets={}, budgets=dict(a=160, b=50, c=160, d=80)),
    "cpu": dict(preset="gpt-debug", batches=(2, 4), dtype="fp32", steps=2, warmup=1,
                muon_steps=2, peak_tflops=0.0, compiled_first=("pre_ln",), compile_more=False,
                compile_reserve=10.0, b_model={}, b_batch=4, b_steps=2,
                b_rows=[("spheret_p1", "float32")],
                a_sets={"workload": {"preset": "gpt-debug"},
                        "space": {"model.residual.family": {"grid": ["pre_ln", "spheret"]},
                                  "model.residual.p": {"grid": [1.0], "when": {
                                      "model.residual.family": ["spheret"]}}},
                        "seeds": [0], "search": {"algorithm": "grid", "max_concurrent": 2},
                        "budget": {"steps": 6, "eval_every": 3, "metrics_every": 0},
                        "resources": {"cpus_per_worker": 1, "gpus_per_worker": 0}},
                budgets=dict(a=150, b=60, c=60, d=40)),
}


class OutOfTime(Exception):
    """SIGALRM: the check ran past its budget."""


def _run_check(key: str, fn, ctx: checks.Ctx, grace: float) -> list[checks.Result]:
    """Run one check under its budget; its finished rows survive a stop or an error."""
    budget = ctx.profile["budgets"][key]
    ctx.start_check(budget)
    rows: list[checks.Result] = []

    def on_alarm(signum, frame):
        raise OutOfTime(f"stopped {grace:.0f} s after its {budget:.0f} s budget")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(max(1, int(budget + grace)))
    try:
        fn(ctx, rows)
    except (Exception, OutOfTime) as e:  # noqa: BLE001 - one check's failure is its own
        stopped = isinstance(e, OutOfTime)
        msg = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        if not stopped:
            traceback.print_exc(limit=4, file=sys.stdout)
        pending = [r for r in rows if r.status == "running"]
        for r in pending:
            r.status, r.note = ("stopped" if stopped else "error"), msg
        if not pending:
            rows.append(checks.Result(key, "(check)", "stopped" if stopped else "error",
                                      note=msg))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        with contextlib.suppress(Exception):
            checks.cleanup(ctx.device)
    return rows


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="dry run on the CPU at tiny sizes")
    ap.add_argument("--only", default="abcd", help="which checks, e.g. 'bc' (default: abcd)")
    ap.add_argument("--grace", type=float, default=20.0,
                    help="a check still running this long after its budget is stopped")
    ap.add_argument("--json-out", default="", help="also write the JSON line to this file")
    ap.add_argument("--out", default="", help="folder for the sweep of check (a)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    mode = "cpu" if args.cpu else "gpu"
    device = torch.device("cpu" if args.cpu else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: CUDA is not available (torch {torch.__version__}); use --cpu for "
              "the dry run", flush=True)
        print(json.dumps({"error": "cuda unavailable", "torch": torch.__version__}))
        return 1
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    ctx = checks.Ctx(mode, device, PROFILES[mode], out=args.out)
    print(f"gpu_check ({mode}): {name}; torch {torch.__version__}; commit {_commit() or '?'}; "
          f"budgets {ctx.profile['budgets']} s", flush=True)
    results: dict[str, list[checks.Result]] = {}
    for key, fn in CHECKS.items():
        if key not in args.only:
            continue
        print(f"\n== ({key}) {TITLES[key]} ==", flush=True)
        results[key] = _run_check(key, fn, ctx, args.grace)
        print(f"({key}) done in {time.perf_counter() - ctx.check_t0:.0f} s", flush=True)

    elapsed = time.perf_counter() - t0
    print("\n== summary ==")
    for key, rows in results.items():
        print(checks.table(key, rows))
    targets = checks.targets(results, dry=args.cpu)
    for t in targets:
        print(f"target {t['name']}: {t['value']} (target {t['target']}): {t['verdict']}")
    print(f"elapsed {elapsed:.0f} s", flush=True)
    out = {"mode": mode, "device": name, "torch": torch.__version__, "commit": _commit(),
           "elapsed_s": round(elapsed, 1), "budgets_s": ctx.profile["budgets"],
           "targets": targets,
           "checks": {k: [r.as_dict() for r in rows] for k, rows in results.items()}}
    line = json.dumps(out, default=str)
    if args.json_out:
        Path(args.json_out).write_text(line + "\n")
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
