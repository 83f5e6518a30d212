"""Step time of the GPT workload: forward + backward + AdamW step, measured side by side.

Compares, interleaved in one process (rounds alternate the variants, medians are taken):
- geosweep Pre-LN vs a plain self-contained nanoGPT reference of the same shape (below),
- every residual family vs Pre-LN,
- achieved FLOP/s (6 N tokens + attention) vs a large ``torch.mm`` on the same machine.

Targets (issue 2): Pre-LN <= 1.05x the reference, spheret p=1 <= 1.10x Pre-LN.
Prints a table; the very last line is one JSON object with the figures.

    python benchmarks/step_time.py [--layers 4 --width 128 --block 64 --batch 8 --rounds 7]
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

from workloads.config import GPTConfig
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


def _stepper(model: nn.Module, x, y):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

    def step():
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _mm_flops(n: int = 1024, reps: int = 10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5, help="steps per timing sample")
    ap.add_argument("--compile", action="store_true", help="torch.compile every variant")
    ap.add_argument("--only", default="", help="comma-separated variants (default: all)")
    args = ap.parse_args()
    torch.manual_seed(0)

    L, d, nh, T, B, V = args.layers, args.width, args.heads, args.block, args.batch, args.vocab
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B, T))
    variants: dict[str, nn.Module] = {"reference": ReferenceGPT(V, T, L, d, nh)}
    families = [("pre_ln", {}), ("post_ln", {}), ("peri_ln", {}), ("pre_dyt", {}), ("keel", {}),
                ("geonorm", {}), ("spheret_p1", {"p": 1.0}), ("spheret_p2", {"p": 2.0}),
                ("spheret_p0.5", {"p": 0.5})]
    for label, extra in families:
        fam = label.split("_p")[0] if label.startswith("spheret") else label
        cfg = GPTConfig(n_layer=L, n_head=nh, n_embd=d, block_size=T, vocab_size=V,
                        residual={"family": fam, **extra})
        variants[label] = build_model(cfg, vocab_size=V)
    if args.only:
        keep = set(args.only.split(",")) | {"reference", "pre_ln"}
        variants = {k: v for k, v in variants.items() if k in keep}
    run_models = {k: torch.compile(m) if args.compile else m for k, m in variants.items()}
    steppers = {k: _stepper(run_models[k], x, y) for k in variants}
    for s in steppers.values():  # warm-up
        s()
        s()

    samples: dict[str, list[float]] = {k: [] for k in steppers}
    for _ in range(args.rounds):
        for k, s in steppers.items():  # interleaved: machine noise hits every variant alike
            t = time.perf_counter()
            for _ in range(args.steps):
                s()
            samples[k].append((time.perf_counter() - t) / args.steps)
    med = {k: statistics.median(v) for k, v in samples.items()}

    n_params = sum(p.numel() for p in variants["pre_ln"].parameters())
    n_params -= variants["pre_ln"].wpe.weight.numel() if hasattr(variants["pre_ln"], "wpe") else 0
    flops_per_step = 6 * n_params * B * T + 12 * L * d * T * B * T  # PaLM appendix B estimate
    mm = _mm_flops()
    achieved = flops_per_step / med["pre_ln"]

    print(f"GPT {L}x{d}, heads {nh}, T={T}, B={B}, vocab {V}; {args.rounds} interleaved rounds "
          f"x {args.steps} steps; torch threads {torch.get_num_threads()}; "
          f"compile={args.compile}")
    print(f"{'variant':<14}{'ms/step':>10}{'vs pre_ln':>11}{'vs reference':>14}")
    for k, v in med.items():  # noqa: B007
        print(f"{k:<14}{v * 1e3:>10.2f}{v / med['pre_ln']:>11.3f}{v / med['reference']:>14.3f}")
    print(f"achieved {achieved / 1e9:.2f} GFLOP/s vs torch.mm {mm / 1e9:.2f} GFLOP/s "
          f"(ratio {achieved / mm:.3f})")
    def ratio(k: str) -> float:
        return med[k] / med["pre_ln"] if k in med else math.nan

    out = {
        "compile": float(args.compile),
        "preln_vs_reference": med["pre_ln"] / med["reference"],
        "spheret_p1_vs_preln": ratio("spheret_p1"),
        "spheret_p2_vs_preln": ratio("spheret_p2"),
        "spheret_p0.5_vs_preln": ratio("spheret_p0.5"),
        "geonorm_vs_preln": ratio("geonorm"),
        "post_ln_vs_preln": ratio("post_ln"),
        "peri_ln_vs_preln": ratio("peri_ln"),
        "pre_dyt_vs_preln": ratio("pre_dyt"),
        "keel_vs_preln": ratio("keel"),
        "mfu_vs_mm": achieved / mm,
        "preln_ms_per_step": med["pre_ln"] * 1e3,
    }
    print(json.dumps({k: (round(v, 4) if math.isfinite(v) else None) for k, v in out.items()}))


if __name__ == "__main__":
    main()
