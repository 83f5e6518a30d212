"""Step time of the GPT workload: forward + backward + AdamW step, measured side by side.

For each shape (default: 4x128 and the gpt-debug preset), compares, interleaved in one process
(rounds alternate the variants; a ratio is the median over rounds of that round's ratio;
the clock is this process's CPU time by default, so other programs on a shared machine do not
count; one torch thread by default):
- geosweep Pre-LN vs a plain self-contained nanoGPT reference of the same shape (below),
- every residual family vs Pre-LN,
- spheret p=1 with the default step (``spheret_p1``: the compiled CPU kernels of
  ``sphere_native``, step and ScaleNorm entry, when they are built, else the eager forms; which
  one is reported as ``default_is_native``, decided before this script builds anything) vs the
  eager fused Function and eager entry (``spheret_p1_eager``; ``spheret_p2_eager`` and
  ``geonorm_eager`` likewise for p = 2 and p = inf, whose default arms take the kernel too),
  the autograd reference (``spheret_p1_ref``: ``sphere.sphere_step``, ~20 autograd nodes per
  sublayer) and the kernels themselves (``spheret_p1_native``; built here if need be, the build
  or load time reported as ``native_build_s``; left out if that fails),
- achieved FLOP/s (6 N tokens + attention) vs a large ``torch.mm`` on the same machine.
With ``--compile`` every variant is ``torch.compile``d and its compile time (first step minus
a median step) is reported too.

Targets (issues 2, 16): Pre-LN <= 1.05x the reference; spheret p=1 <= 1.10x Pre-LN, eager, at
4x128 and at gpt-debug. Prints a table per shape; the very last line is one JSON object: the
first shape's figures under plain keys (as before), every shape's under "shapes", and
"spheret_p1_vs_preln@<shape>" (the default step), "spheret_p1_eager_vs_preln@<shape>" and
"spheret_p1_native_vs_preln@<shape>" for each shape.

    python benchmarks/step_time.py [--shapes 4x128,gpt-debug --rounds 7 --threads 1]
    python benchmarks/step_time.py --shapes 4x128 --layers 4 --width 128 --block 64 --batch 8
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from workloads.config import PRESETS, GPTConfig
from workloads.geometry import sphere_native
from workloads.geometry.sphere import sphere_step
from workloads.geometry.sphere_fused import sphere_step_eager, sphere_step_fused
from workloads.models import build_model

# --- [reference] a plain nanoGPT, written here so it shares no code with geosweep ----------


class _RefAttention(nn.Module):
    def __init__(self, d: int, nh: int):
        super().__init__()
        self.nh = nh
        self.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class _RefBlock(nn.Module):
    def __init__(self, d: int, nh: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, bias=False)
        self.attn = _RefAttention(d, nh)
        self.ln_2 = nn.LayerNorm(d, bias=False)
        self.c_fc = nn.Linear(d, 4 * d, bias=False)
        self.c_proj = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class ReferenceGPT(nn.Module):
    def __init__(self, vocab: int, block: int, n_layer: int, d: int, nh: int):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.blocks = nn.ModuleList(_RefBlock(d, nh) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# --- timing ----------------------------------------------------------------------------------

FAMILIES = [("pre_ln", {}), ("post_ln", {}), ("peri_ln", {}), ("pre_dyt", {}), ("keel", {}),
            ("geonorm", {}), ("spheret_p1", {"p": 1.0}), ("spheret_p2", {"p": 2.0}),
            ("spheret_p0.5", {"p": 0.5}), ("spheret_p1_ref", {"p": 1.0}),
            ("spheret_p1_eager", {"p": 1.0}), ("spheret_p1_native", {"p": 1.0}),
            ("spheret_p2_eager", {"p": 2.0}), ("geonorm_eager", {})]
RATIO_KEYS = ["spheret_p1", "spheret_p1_eager", "spheret_p1_ref", "spheret_p1_native",
              "spheret_p2", "spheret_p2_eager", "spheret_p0.5", "geonorm", "geonorm_eager",
              "post_ln", "peri_ln", "pre_dyt", "keel"]


def _native_step(h, u, alpha, p):
    # The compiled kernel whether or not it is the default here.
    if sphere_native.usable(h, u):
        return sphere_native.sphere_step_native(h, u, alpha, p)  # alpha: 0-d a_k
    return sphere_step_fused(h, u, alpha, p)


def _native_entry(x, g, eps):
    # The ScaleNorm kernel whether or not it is the default here.
    if x.dtype in (torch.float32, torch.float64) and g.dtype == x.dtype:
        return sphere_native._state["sn"](x, g, eps)
    return sphere_native.scale_norm_eager(x, g, eps)


def _stepper(model: nn.Module, x, y):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

    def step():
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _mm_flops(clock, n: int = 1024, reps: int = 10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t = clock()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (clock() - t)


def _shape(name: str, args) -> dict:
    """'LxD' (heads/block/batch/vocab from the flags) or a GPT preset name (its own batch)."""
    if name in PRESETS:
        cfg = PRESETS[name]()
        m = cfg.model
        vocab = m.vocab_size or (65 if cfg.data.tokenizer == "char" else 50304)
        return dict(L=m.n_layer, d=m.n_embd, nh=m.n_head, T=m.block_size,
                    B=cfg.train.batch_size, V=vocab)
    try:
        L, d = (int(v) for v in name.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shapes: {name!r} is neither LxD (e.g. 4x128) nor one of "
                         f"{', '.join(PRESETS)}") from None
    return dict(L=L, d=d, nh=args.heads, T=args.block, B=args.batch, V=args.vocab)


def _variants(s: dict, only: str) -> dict[str, nn.Module]:
    L, d, nh, T, V = s["L"], s["d"], s["nh"], s["T"], s["V"]
    variants: dict[str, nn.Module] = {"reference": ReferenceGPT(V, T, L, d, nh)}
    keep = set(only.split(",")) | {"reference", "pre_ln"} if only else None
    for label, extra in FAMILIES:
        if label.endswith("_native") and keep is not None and label not in keep:
            continue  # not asked for: do not build the kernel
        base = label.removesuffix("_eager")
        fam = "spheret" if base.startswith("spheret") else base
        cfg = GPTConfig(n_layer=L, n_head=nh, n_embd=d, block_size=T, vocab_size=V,
                        residual={"family": fam, **extra})
        model = build_model(cfg, vocab_size=V)
        if label.endswith("_ref"):
            model.stream.step_fn = sphere_step  # the autograd reference retraction
        if label.endswith("_eager"):  # never the kernel: the step and the ScaleNorm entry
            model.stream.step_fn = sphere_step_eager
            model.stream.entry_fn = sphere_native.scale_norm_eager
        if label.endswith("_native"):
            if not sphere_native.load():  # builds the kernel on first use (cached per machine)
                print("spheret_p1_native: kernel unavailable, arm left out")
                continue
            model.stream.step_fn = _native_step
            model.stream.entry_fn = _native_entry
        variants[label] = model
    if keep is not None:
        variants = {k: v for k, v in variants.items() if k in keep}
    return variants


def measure(name: str, s: dict, args) -> dict:
    """Median seconds per step of every variant at shape s, interleaved; prints a table."""
    torch.manual_seed(0)
    L, d, nh, T, B, V = s["L"], s["d"], s["nh"], s["T"], s["B"], s["V"]
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B, T))
    variants = _variants(s, args.only)
    run_models = {k: torch.compile(m) if args.compile else m for k, m in variants.items()}
    steppers = {k: _stepper(run_models[k], x, y) for k in variants}
    first: dict[str, float] = {}
    for k, st in steppers.items():  # warm-up (the first step compiles under --compile)
        t = time.perf_counter()
        st()
        first[k] = time.perf_counter() - t
        st()

    clock = time.process_time if args.clock == "process" else time.perf_counter
    samples: dict[str, list[float]] = {k: [] for k in steppers}
    for _ in range(args.rounds):
        for k, st in steppers.items():  # interleaved: machine noise hits every variant alike
            t = clock()
            for _ in range(args.steps):
                st()
            samples[k].append((clock() - t) / args.steps)
    med = {k: statistics.median(v) for k, v in samples.items()}
    # Ratios: the median over rounds of each round's ratio (neighbours in time share the load).
    rel = {k: statistics.median(a / b for a, b in zip(v, samples["pre_ln"]))
           for k, v in samples.items()}
    rel_ref = statistics.median(a / b for a, b in zip(samples["pre_ln"], samples["reference"]))
    compile_s = {k: max(0.0, first[k] - med[k]) for k in med} if args.compile else {}

    pre = variants["pre_ln"]
    n_params = sum(p.numel() for p in pre.parameters())
    n_params -= pre.wpe.weight.numel() if hasattr(pre, "wpe") else 0
    flops_per_step = 6 * n_params * B * T + 12 * L * d * T * B * T  # PaLM appendix B estimate

    print(f"[{name}] GPT {L}x{d}, heads {nh}, T={T}, B={B}, vocab {V}; {args.rounds} "
          f"interleaved rounds x {args.steps} steps; {args.clock} clock; compile={args.compile}; "
          f"ratios are medians of per-round ratios")
    hdr = f"{'variant':<16}{'ms/step':>10}{'vs pre_ln':>11}{'vs reference':>14}"
    print(hdr + (f"{'compile s':>11}" if compile_s else ""))
    for k, v in med.items():
        row = f"{k:<16}{v * 1e3:>10.2f}{rel[k]:>11.3f}{v / med['reference']:>14.3f}"
        print(row + (f"{compile_s[k]:>11.1f}" if compile_s else ""), flush=True)

    out = {"preln_vs_reference": rel_ref}
    for k in RATIO_KEYS:
        out[f"{k}_vs_preln"] = rel.get(k, math.nan)
    out["preln_ms_per_step"] = med["pre_ln"] * 1e3
    out["achieved_flops"] = flops_per_step / med["pre_ln"]
    if compile_s:
        out["compile_s_preln"] = compile_s["pre_ln"]
        out["compile_s_spheret_p1"] = compile_s.get("spheret_p1", math.nan)
        out["compile_s_total"] = sum(compile_s.values())
    return out


def _clean(d: dict) -> dict:
    return {k: (_clean(v) if isinstance(v, dict) else round(v, 4) if math.isfinite(v) else None)
            for k, v in d.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4x128,gpt-debug",
                    help="comma-separated LxD (with the flags below) or GPT preset names")
    ap.add_argument("--layers", type=int, default=0, help="(old form) same as --shapes LxD")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5, help="steps per timing sample")
    ap.add_argument("--compile", action="store_true", help="torch.compile every variant")
    ap.add_argument("--only", default="", help="comma-separated variants (default: all)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (0: torch's default; 1 keeps --clock process honest)")
    ap.add_argument("--clock", choices=("process", "wall"), default="process",
                    help="process: this process's CPU time, which leaves out the time other "
                         "programs on a shared machine take (default); wall: elapsed time")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [f"{args.layers}x{args.width}"] if args.layers else args.shapes.split(",")
    # Before the native arm can build the kernel: what a training run here would get.
    default_native = sphere_native.active()
    print(f"default spheret p=1 step: {'the compiled kernel' if default_native else 'eager'} "
          f"(GEOSWEEP_SPHERE_NATIVE mode {sphere_native.mode()})")
    shapes = {n: measure(n, _shape(n, args), args) for n in names}

    mm = _mm_flops(time.process_time if args.clock == "process" else time.perf_counter)
    first = shapes[names[0]]
    print(f"[{names[0]}] achieved {first['achieved_flops'] / 1e9:.2f} GFLOP/s vs torch.mm "
          f"{mm / 1e9:.2f} GFLOP/s (ratio {first['achieved_flops'] / mm:.3f}); "
          f"torch threads {torch.get_num_threads()}")
    out = {"compile": float(args.compile)}
    out.update({k: v for k, v in first.items() if k != "achieved_flops"})
    out["mfu_vs_mm"] = first["achieved_flops"] / mm
    out["native_build_s"] = sphere_native.build_seconds() or math.nan
    out["default_is_native"] = float(default_native)
    for n, f in shapes.items():
        out[f"spheret_p1_vs_preln@{n}"] = f["spheret_p1_vs_preln"]
        out[f"spheret_p1_eager_vs_preln@{n}"] = f["spheret_p1_eager_vs_preln"]
        out[f"spheret_p1_native_vs_preln@{n}"] = f["spheret_p1_native_vs_preln"]
    out["shapes"] = {n: {k: v for k, v in f.items() if k != "achieved_flops"}
                     for n, f in shapes.items()}
    print(json.dumps(_clean(out)))


if __name__ == "__main__":
    main()
