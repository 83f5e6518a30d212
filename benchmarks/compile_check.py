"""``torch.compile`` against eager, per residual family: the same losses and gradients?

For each family two copies of one GPT (same seed, same init) train side by side on the same
synthetic token batches, one eager and one under ``torch.compile`` (Inductor), with AdamW; at
every step the losses and every parameter's gradient are compared before the optimizer
steps. The figures are relative: ``loss_rel`` = max over steps |loss_c - loss_e| / |loss_e|,
``grad_rel`` = max over steps of ||G_c - G_e|| / ||G_e|| (G: every parameter's gradient, one
vector), ``param_grad_rel`` = max over steps and parameters of ||g_c - g_e|| / ||g_e|| for the
parameters whose gradient is above 1e-4 ||G_e||: one whose gradient is itself rounding noise
(SpheretNorm's radius g, ~1e-6 against ~1: the loss does not depend on it, ln_f normalises)
has no relative error to speak of. fp32 rounding keeps all three near 1e-6;
a miscompiled step shows up as 1e-2 and more (SpheretNorm's compiled custom Function on CUDA
once gave an 8-step loss of 11.55 against 11.32 eager). With ``dtype="bf16"`` the forward
runs under bf16 autocast (the tolerance is then bf16's, ~1e-2).

Used by tests/workloads/test_compile_equivalence.py (CPU, tiny model, fp32) and row (b) of
benchmarks/gpu_check.py (GPU). Nothing here imports Ray.

    python benchmarks/compile_check.py [--device cuda] [--steps 3] [--dtype bf16]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import sys
import time

import torch

from workloads.config import GPTConfig
from workloads.models import build_model

# every registered family, spheret at the p's that take different code (Proj, Cayley, p<1)
FAMILIES: dict[str, dict] = {
    "pre_ln": {"family": "pre_ln"},
    "post_ln": {"family": "post_ln"},
    "peri_ln": {"family": "peri_ln"},
    "pre_dyt": {"family": "pre_dyt"},
    "keel": {"family": "keel"},
    "geonorm": {"family": "geonorm"},
    "spheret_p1": {"family": "spheret", "p": 1.0},
    "spheret_p2": {"family": "spheret", "p": 2.0},
}
# one block (an attention and an MLP sublayer): Inductor's compile time grows with the graph
TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64)


def compare(residual: dict, device: str = "cpu", steps: int = 3, batch: int = 4,
            dtype: str = "float32", model: dict | None = None, lr: float = 3e-3,
            seed: int = 0) -> dict[str, float]:
    """Train eager and compiled copies ``steps`` steps; returns ``loss_rel``, ``grad_rel``,
    ``param_grad_rel``, the last losses, and the compiled copy's first step in seconds (its
    compile)."""
    dev = torch.device(device)
    cfg = GPTConfig(**{**TINY, **(model or {})}, residual=dict(residual))
    torch.manual_seed(seed)
    eager = build_model(cfg, vocab_size=cfg.vocab_size).to(dev)
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin)
    opts = [torch.optim.AdamW(m.parameters(), lr=lr) for m in (eager, twin)]
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    V, T = cfg.vocab_size, cfg.block_size
    batches = [(torch.randint(0, V, (batch, T), generator=g).to(dev),
                torch.randint(0, V, (batch, T), generator=g).to(dev)) for _ in range(steps)]

    def ctx():
        if dtype != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)

    loss_rel = grad_rel = param_rel = 0.0
    losses: tuple[float, float] = (math.nan, math.nan)
    compile_s = math.nan
    for i, (x, y) in enumerate(batches):
        out = []
        for m, run in ((eager, eager), (twin, compiled)):
            t = time.perf_counter()
            with ctx():
                _, loss = run(x, y)
            loss.backward()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            if i == 0 and m is twin:
                compile_s = time.perf_counter() - t
            out.append(float(loss.detach()))
        losses = (out[0], out[1])
        loss_rel = max(loss_rel, abs(out[1] - out[0]) / max(abs(out[0]), 1e-12))
        grads = [(_grad(pe), _grad(pc)) for pe, pc in
                 zip(eager.parameters(), twin.parameters(), strict=True)]
        total = math.sqrt(sum(float(ge.norm()) ** 2 for ge, _ in grads))
        diff = math.sqrt(sum(float((gc - ge).norm()) ** 2 for ge, gc in grads))
        grad_rel = max(grad_rel, diff / max(total, 1e-30))
        for ge, gc in grads:
            if float(ge.norm()) > 1e-4 * total:
                param_rel = max(param_rel, float((gc - ge).norm()) / float(ge.norm()))
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return {"loss_rel": loss_rel, "grad_rel": grad_rel, "param_grad_rel": param_rel,
            "loss_eager": losses[0],
            "loss_compiled": losses[1], "compile_s": compile_s}


def _grad(p: torch.Tensor) -> torch.Tensor:
    return (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dtype", choices=("float32", "bf16"), default="float32")
    ap.add_argument("--only", default="", help="comma-separated families (default: all)")
    args = ap.parse_args()
    keep = set(args.only.split(",")) if args.only else set(FAMILIES)
    rows = {}
    print(f"{'family':<12}{'loss rel':>11}{'grad rel':>11}{'param rel':>11}{'compile s':>11}")
    for name, res in FAMILIES.items():
        if name not in keep:
            continue
        torch._dynamo.reset()
        r = compare(res, args.device, args.steps, dtype=args.dtype)
        rows[name] = r
        print(f"{name:<12}{r['loss_rel']:>11.2e}{r['grad_rel']:>11.2e}"
              f"{r['param_grad_rel']:>11.2e}{r['compile_s']:>11.1f}", flush=True)
    print(json.dumps({"device": args.device, "dtype": args.dtype, "steps": args.steps,
                      "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
