"""Training throughput of every residual family and optimizer on one GPU (tokens/s and MFU).

Builds a GPT preset (default ``gpt2-small``, 124M, T=1024) and times full training steps
(forward + backward + grad clip + optimizer step, as ``workloads.train`` does them) on synthetic
token batches: random ids, no dataset, nothing downloaded. Rows:
- every residual family with AdamW, eager and under ``torch.compile``;
- Pre-LN with plain Muon and Manifold Muon (assignments ``hetero`` and ``all_stiefel``), eager
  and with the model compiled (the optimizer step stays eager).
spheret p=inf is not a row of its own: it is the same code as geonorm (GeoNorm = SpheretNorm at
p=inf).

MFU = tokens/s x (6 N + 12 L T d) / peak, nanoGPT's estimate_mfu (N without the position
embedding); the peak is --peak-tflops (default 989, the H100/H200 SXM dense bf16 datasheet
figure). Muon's own FLOPs (msign, duals) are not counted: its MFU is the model's alone.

Robust by design: each row runs in try/except (a failure prints an error row and the script
goes on); a global time budget (--budget, env GPU_THROUGHPUT_BUDGET_S, default 480 s) skips the
rows left when it runs out and names them; compile rows start only with --compile-reserve
seconds left. One line per row as it finishes, a table at the end, and as the very last line one
JSON object with every figure.

    python benchmarks/gpu_throughput.py                       # CUDA, gpt2-small, B=16
    python benchmarks/gpu_throughput.py --device cpu --preset gpt-debug --steps 2 --no-compile
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field, replace

import torch

from workloads.config import PRESETS, OptimConfig, WorkloadConfig, apply_overrides
from workloads.models import build_model
from workloads.optim import build_optimizers

FAMILIES: list[tuple[str, dict]] = [
    ("pre_ln", {"family": "pre_ln"}),
    ("post_ln", {"family": "post_ln"}),
    ("peri_ln", {"family": "peri_ln"}),
    ("pre_dyt", {"family": "pre_dyt"}),
    ("keel", {"family": "keel"}),
    ("geonorm", {"family": "geonorm"}),
    ("spheret_p1", {"family": "spheret", "p": 1.0}),
    ("spheret_p2", {"family": "spheret", "p": 2.0}),
]
MUONS: list[tuple[str, dict]] = [
    ("muon", {"name": "muon"}),
    ("mmuon_hetero", {"name": "muon", "assignment": "hetero"}),
    ("mmuon_all_stiefel", {"name": "muon", "assignment": "all_stiefel"}),
]


class OutOfTime(Exception):
    """Raised by SIGALRM when a row runs past the budget's hard stop."""


@dataclass
class Row:
    label: str
    residual: dict
    optim: dict = field(default_factory=dict)
    compile: bool = False
    status: str = "pending"
    tokens_per_s: float = math.nan
    ms_per_step: float = math.nan
    mfu: float = math.nan
    compile_s: float = math.nan
    first_step_s: float = math.nan
    peak_mem_gb: float = math.nan
    n_params: int = 0
    steps: int = 0
    loss: float = math.nan
    error: str = ""

    @property
    def name(self) -> str:
        return f"{self.label}{'+compile' if self.compile else ''}"


def _rows(args) -> list[Row]:
    """Eager families first (cheap; the baselines), then the compiled rows that matter most,
    the Muon rows, the other compiled families, and the Muon rows with a compiled model: what
    the budget cuts is what matters least."""
    fams = {lbl: Row(lbl, res) for lbl, res in FAMILIES}
    muons = [Row(f"pre_ln/{lbl}", {"family": "pre_ln"}, opt) for lbl, opt in MUONS]
    rows = list(fams.values())
    if not args.no_compile:
        rows += [replace(fams[k], compile=True) for k in ("pre_ln", "spheret_p1", "geonorm")]
    rows += muons
    if not args.no_compile:
        rows += [replace(fams[k], compile=True)
                 for k in ("spheret_p2", "post_ln", "peri_ln", "pre_dyt", "keel")]
        rows += [replace(r, compile=True) for r in muons]
    if args.only:
        keep = set(args.only.split(","))
        rows = [r for r in rows if r.label in keep or r.name in keep]
    return rows


def _optim_cfg(spec: dict) -> OptimConfig:
    """``spec``: {"name", "assignment", "set": {dotted optim.* overrides}}; an unknown key in
    "set" raises ConfigError (workloads.config.apply_overrides)."""
    cfg = OptimConfig(lr=6e-4, warmup_steps=0)
    if spec.get("name") == "muon":
        cfg = replace(cfg, name="muon")
        if "assignment" in spec:
            cfg.manifold = replace(cfg.manifold, assignment=spec["assignment"])
    if spec.get("set"):
        cfg = apply_overrides(WorkloadConfig(optim=cfg), spec["set"]).optim
    return cfg


def _flops_per_token(model: torch.nn.Module, L: int, T: int, d: int) -> tuple[int, float]:
    n = sum(p.numel() for p in model.parameters())
    wpe = getattr(model, "wpe", None)
    n -= wpe.weight.numel() if wpe is not None else 0
    return n, 6 * n + 12 * L * T * d


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_row(row: Row, args, device: torch.device, mcfg, batch: int) -> None:
    """Time one configuration in place on ``row``; raises on failure."""
    torch.manual_seed(0)
    cfg = replace(mcfg, residual=dict(row.residual))
    model = build_model(cfg, vocab_size=mcfg.vocab_size).to(device)
    opts = build_optimizers(model, _optim_cfg(row.optim))
    row.n_params, fpt = _flops_per_token(model, cfg.n_layer, cfg.block_size, cfg.n_embd)
    run_model = torch.compile(model) if row.compile else model
    params = [p for p in model.parameters() if p.requires_grad]
    V, T = cfg.vocab_size, cfg.block_size
    g = torch.Generator(device=device).manual_seed(0)
    batches = [(torch.randint(0, V, (batch, T), device=device, generator=g),
                torch.randint(0, V, (batch, T), device=device, generator=g)) for _ in range(4)]
    use_bf16 = args.dtype == "bf16"

    def step(i: int) -> torch.Tensor:
        x, y = batches[i % len(batches)]
        ctx = (torch.autocast(device_type=device.type, dtype=torch.bfloat16) if use_bf16
               else contextlib.nullcontext())
        with ctx:
            _, loss = run_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opts.step()
        opts.zero_grad()
        return loss.detach()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t = time.perf_counter()
    step(0)  # compiles under torch.compile
    _sync(device)
    row.first_step_s = time.perf_counter() - t
    # Manifold Muon steps cost seconds (dual ascent, SVD retractions): fewer of them
    n_steps = min(args.steps, args.muon_steps) if row.optim else args.steps
    for i in range(1, args.warmup):
        step(i)
    _sync(device)
    t = time.perf_counter()
    for i in range(n_steps):
        loss = step(i)
    _sync(device)
    dt = (time.perf_counter() - t) / n_steps
    row.steps = n_steps
    row.ms_per_step = dt * 1e3
    row.tokens_per_s = batch * T / dt
    row.loss = float(loss)
    if args.peak_tflops > 0:
        row.mfu = row.tokens_per_s * fpt / (args.peak_tflops * 1e12)
    if row.compile:
        row.compile_s = max(0.0, row.first_step_s - dt)
    if device.type == "cuda":
        row.peak_mem_gb = torch.cuda.max_memory_allocated(device) / 1e9
    if not math.isfinite(row.loss):
        raise FloatingPointError(f"loss is {row.loss} after {args.warmup + n_steps} steps")
    row.status = "ok"


def _cleanup(device: torch.device) -> None:
    with contextlib.suppress(Exception):
        import torch._dynamo

        torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _fmt(v: float, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def _line(r: Row) -> str:
    return (f"{r.name:<28}{r.status:<9}{_fmt(r.tokens_per_s, ',.0f'):>12}"
            f"{_fmt(r.ms_per_step, '.1f'):>10}{_fmt(100 * r.mfu, '.1f'):>7}"
            f"{_fmt(r.compile_s, '.1f'):>10}{_fmt(r.peak_mem_gb, '.1f'):>9}"
            f"{_fmt(r.loss, '.3f'):>8}  {r.error}")


HEADER = (f"{'row':<28}{'status':<9}{'tokens/s':>12}{'ms/step':>10}{'MFU%':>7}"
          f"{'compile s':>10}{'mem GB':>9}{'loss':>8}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="gpt2-small", choices=[k for k in PRESETS
                                                               if k.startswith(("gpt", "llama"))])
    ap.add_argument("--batch", type=int, default=0,
                    help="micro-batch (default: 16 for gpt2-small, else the preset's)")
    ap.add_argument("--block", type=int, default=0, help="sequence length (default: preset's)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per row")
    ap.add_argument("--muon-steps", type=int, default=5, help="timed steps of the Muon rows")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps (the first compiles)")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="",
                    help="bf16 autocast (default on cuda) or fp32 (default on cpu)")
    ap.add_argument("--no-compile", action="store_true", help="eager rows only")
    ap.add_argument("--only", default="", help="comma-separated row labels or names")
    ap.add_argument("--budget", type=float,
                    default=float(os.environ.get("GPU_THROUGHPUT_BUDGET_S", 480)),
                    help="seconds for all rows; rows left when it runs out are skipped")
    ap.add_argument("--compile-reserve", type=float, default=60.0,
                    help="a compile row starts only with this many seconds of budget left")
    ap.add_argument("--grace", type=float, default=90.0,
                    help="a row still running this long after the budget is stopped")
    ap.add_argument("--peak-tflops", type=float, default=-1.0,
                    help="peak for MFU (default 989 on cuda: H100/H200 SXM dense bf16; "
                         "none on cpu)")
    ap.add_argument("--json-out", default="", help="also write the JSON object to this file")
    args = ap.parse_args()
    t_start = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"--device {args.device}: CUDA is not available (torch {torch.__version__})",
              flush=True)
        print(json.dumps({"error": "cuda unavailable", "torch": torch.__version__}))
        return 1
    args.dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    if args.peak_tflops < 0:
        args.peak_tflops = 989.0 if device.type == "cuda" else 0.0
    args.warmup = max(1, args.warmup)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    wcfg = PRESETS[args.preset]()
    mcfg = wcfg.model
    vocab = mcfg.vocab_size or (65 if wcfg.data.tokenizer == "char" else 50304)
    mcfg = replace(mcfg, vocab_size=vocab, block_size=args.block or mcfg.block_size)
    batch = args.batch or (16 if args.preset == "gpt2-small" else wcfg.train.batch_size)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"gpu_throughput: {args.preset} ({mcfg.n_layer}x{mcfg.n_embd}, heads {mcfg.n_head}, "
          f"vocab {vocab}), B={batch}, T={mcfg.block_size} ({batch * mcfg.block_size} tokens/"
          f"step), {args.dtype}, on {gpu}; torch {torch.__version__}", flush=True)
    print(f"data: SYNTHETIC random token ids (no dataset); {args.warmup} warm-up + "
          f"{args.steps} timed steps per row ({min(args.steps, args.muon_steps)} for Muon rows; "
          f"step = fwd + bwd + clip + optimizer); "
          f"MFU peak {args.peak_tflops:g} TFLOP/s"
          f"{' (H100/H200 SXM dense bf16 datasheet)' if args.peak_tflops == 989 else ''}; "
          f"budget {args.budget:.0f} s", flush=True)
    print("spheret p=inf: not a separate row, it is geonorm (same code, p=inf)", flush=True)

    rows = _rows(args)
    deadline = t_start + args.budget

    def on_alarm(signum, frame):
        raise OutOfTime(f"stopped {args.grace:.0f} s after the {args.budget:.0f} s budget")

    use_alarm = hasattr(signal, "SIGALRM")
    if use_alarm:
        signal.signal(signal.SIGALRM, on_alarm)
    print(HEADER, flush=True)
    for r in rows:
        left = deadline - time.perf_counter()
        if left <= 0 or (r.compile and left < args.compile_reserve):
            r.status = "skipped"
            r.error = f"budget: {max(0.0, left):.0f} s left"
            print(_line(r), flush=True)
            continue
        if use_alarm:
            signal.alarm(max(1, int(left + args.grace)))
        try:
            run_row(r, args, device, mcfg, batch)
        except (Exception, OutOfTime) as e:  # noqa: BLE001 - one row's failure is its row's
            r.status = "stopped" if isinstance(e, OutOfTime) else "error"
            r.error = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            traceback.print_exc(limit=3, file=sys.stdout)
        finally:
            if use_alarm:
                signal.alarm(0)
            with contextlib.suppress(Exception):
                _cleanup(device)
        print(_line(r), flush=True)

    elapsed = time.perf_counter() - t_start
    base = {r.compile: r.tokens_per_s for r in rows if r.label == "pre_ln" and r.status == "ok"}
    print("\n== summary (vs_pre_ln: tokens/s of Pre-LN AdamW in the same mode / this row's; "
          ">1 is slower) ==")
    print(HEADER + f"{'vs_pre_ln':>11}")
    for r in rows:
        rel = base.get(r.compile, math.nan) / r.tokens_per_s if r.status == "ok" else math.nan
        print(_line(r).rstrip() + ("" if r.error else f"{_fmt(rel, '.3f'):>11}"))
    skipped = [r.name for r in rows if r.status == "skipped"]
    if skipped:
        print(f"skipped (budget): {', '.join(skipped)}")
    print(f"elapsed {elapsed:.0f} s of a {args.budget:.0f} s budget", flush=True)

    def clean(v):
        return round(v, 5) if isinstance(v, float) and math.isfinite(v) else (
            None if isinstance(v, float) else v)

    out = {
        "preset": args.preset, "device": gpu, "torch": torch.__version__, "dtype": args.dtype,
        "batch": batch, "block": mcfg.block_size, "tokens_per_step": batch * mcfg.block_size,
        "synthetic_data": True, "peak_tflops": args.peak_tflops, "steps": args.steps,
        "warmup": args.warmup, "budget_s": args.budget, "elapsed_s": round(elapsed, 1),
        "skipped": skipped,
        "rows": [{"name": r.name, "label": r.label, "residual": r.residual,
                  "optim": r.optim or {"name": "adamw"}, "compile": r.compile,
                  "status": r.status, "tokens_per_s": clean(r.tokens_per_s),
                  "ms_per_step": clean(r.ms_per_step), "mfu": clean(r.mfu),
                  "compile_s": clean(r.compile_s), "steps": r.steps,
                  "first_step_s": clean(r.first_step_s),
                  "peak_mem_gb": clean(r.peak_mem_gb), "n_params": r.n_params,
                  "loss": clean(r.loss), "error": r.error} for r in rows],
    }
    line = json.dumps(out)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(line + "\n")
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
