"""Step cost of Muon and Manifold Muon against AdamW on the gpt-debug and gpt-tiny shapes.

Arms: ``adamw`` (everything on AdamW), ``muon`` (Paper B's unconstrained Muon), ``stiefel``
(all_stiefel), ``dgram_svd`` / ``dgram_polar`` (all_dgram with the paper's SVD retraction or
the colnorm-polar one); ``stiefel_tol1e4`` / ``dgram_svd_tol1e4`` are those arms at the issue's
own target residual, ``dual_tol`` 1e-4 (docs/science.md §3.2: why not fp32 there). Only
``optimizers.step()`` is timed, on fixed random gradients (full rank: the dual converges in ~3
passes here, in ~10 on real training gradients; benchmarks/manifold_train_step.py times those);
arms are interleaved round by round (rotating order) so machine load hits them alike; medians
are kept.

    python benchmarks/optimizer_step.py [--rounds 3] [--inner 1] [--threads 1] [--device cpu]

Prints a table, then as the last line one JSON object of ratios against AdamW (gpt-tiny at
top level, every preset under ``by_preset``; e.g. ``stiefel_vs_adamw``) and
``dual_residual_final`` / ``dual_passes_max``: the worst final dual residual ||H||_F / n and
pass count over the manifold arms' matrices at their last step (and per arm, e.g.
``stiefel_dual_residual_final``); a tol-1e-4 arm's figures carry the suffix ``_tol1e4`` (e.g.
``stiefel_vs_adamw_tol1e4``, ``stiefel_dual_residual_final_tol1e4``). Uses the real GPT when
``workloads.models.gpt`` imports, else a stand-in with the same trainable shapes.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

from workloads.config import GPTConfig, OptimConfig, gpt_debug, gpt_tiny
from workloads.optim import build_optimizers

VOCAB = 65  # char-level Shakespeare

ARMS: dict[str, dict] = {
    "adamw": {"name": "adamw"},
    "muon": {"name": "muon", "assignment": "unconstrained"},
    "stiefel": {"name": "muon", "assignment": "all_stiefel"},
    "dgram_svd": {"name": "muon", "assignment": "all_dgram", "retraction": "paper_svd_sorted"},
    "dgram_polar": {"name": "muon", "assignment": "all_dgram", "retraction": "colnorm_polar"},
    "stiefel_tol1e4": {"name": "muon", "assignment": "all_stiefel", "dual_tol": 1e-4},
    "dgram_svd_tol1e4": {"name": "muon", "assignment": "all_dgram",
                         "retraction": "paper_svd_sorted", "dual_tol": 1e-4},
}
TOL_SUFFIX = "_tol1e4"


def figure_key(arm: str, figure: str) -> str:
    """``stiefel_tol1e4`` + ``vs_adamw`` -> ``stiefel_vs_adamw_tol1e4``; plain arms as before."""
    if arm.endswith(TOL_SUFFIX):
        return f"{arm.removesuffix(TOL_SUFFIX)}_{figure}{TOL_SUFFIX}"
    return f"{arm}_{figure}"


@dataclass
class _Role:
    name: str
    param: nn.Parameter
    role: str
    layer: int
    kind: str


class ShapeGPT(nn.Module):
    """Stand-in with GPT's trainable shapes and matrix_roles() (docs/contracts.md)."""

    def __init__(self, c: GPTConfig, vocab: int):
        super().__init__()
        d, f = c.n_embd, c.ffn_hidden or 4 * c.n_embd
        self.wte = nn.Parameter(torch.randn(vocab, d) * 0.02)  # tied with lm_head
        self.wpe = nn.Parameter(torch.randn(c.block_size, d) * 0.02)
        self.mats = nn.ParameterDict()
        for i in range(c.n_layer):
            for key, shape in (("attn_c_attn", (3 * d, d)), ("attn_c_proj", (d, d)),
                               ("mlp_c_fc", (f, d)), ("mlp_c_proj", (d, f))):
                self.mats[f"{i}_{key}"] = nn.Parameter(torch.randn(*shape) * 0.02)
        self.gains = nn.ParameterList(nn.Parameter(torch.ones(d)) for _ in range(2 * c.n_layer + 1))
        self.n_layer = c.n_layer

    def matrix_roles(self) -> list[_Role]:
        roles = [_Role("wte", self.wte, "in", -1, "io")]
        for i in range(self.n_layer):
            for key, role, kind in (("attn_c_attn", "qkv", "attention"),
                                    ("attn_c_proj", "o", "attention"),
                                    ("mlp_c_fc", "fc", "mlp"), ("mlp_c_proj", "proj", "mlp")):
                roles.append(_Role(f"mats.{i}_{key}", self.mats[f"{i}_{key}"], role, i, kind))
        return roles


def make_model(c: GPTConfig) -> tuple[nn.Module, str]:
    try:
        from workloads.models import build_model

        return build_model(c, vocab_size=VOCAB), "workloads.models GPT"
    except ImportError:
        return ShapeGPT(c, VOCAB), "stand-in (same shapes)"


def optim_cfg(base: OptimConfig, arm: dict) -> OptimConfig:
    cfg = copy.deepcopy(base)
    cfg.name = arm["name"]
    cfg.manifold.assignment = arm.get("assignment", "unconstrained")
    cfg.manifold.dgram_retraction = arm.get("retraction", "paper_svd_sorted")
    cfg.manifold.dual_tol = arm.get("dual_tol", cfg.manifold.dual_tol)
    return cfg


def bench_preset(preset, rounds: int, inner: int, device: torch.device) -> tuple[dict, str]:
    torch.manual_seed(0)
    wl = preset()
    base, source = make_model(wl.model)
    base = base.to(device)
    grads = {n: torch.randn_like(p) * 1e-2 for n, p in base.named_parameters()}
    setups = {}
    for arm, spec in ARMS.items():
        model = copy.deepcopy(base)
        opts = build_optimizers(model, optim_cfg(wl.optim, spec))
        for n, p in model.named_parameters():
            p.grad = grads[n].clone()
        opts.step()  # warm-up: allocates state, first-call overheads
        setups[arm] = opts
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    names = list(ARMS)
    for r in range(rounds):
        for arm in names[r % len(names):] + names[: r % len(names)]:
            sync()
            t0 = time.perf_counter()
            for _ in range(inner):
                setups[arm].step()
            sync()
            times[arm].append((time.perf_counter() - t0) / inner)
    med = {arm: statistics.median(ts) for arm, ts in times.items()}
    # the dual's final residual ||H||_F / n and passes, worst over the manifold arms' matrices,
    # and per arm (a ratio is only meaningful next to its own arm's residual)
    health = {arm: list(setups[arm].health().values()) for arm in ARMS}
    # (the top-level worst is over the default-tol arms: the tol-1e-4 ones report their own)
    default = [r for arm, rs in health.items() if not arm.endswith(TOL_SUFFIX) for r in rs]
    for arm, rows in [("", default)] + list(health.items()):
        if rows or not arm:
            for fig, col in (("dual_residual_final", "dual_residual"),
                             ("dual_passes_max", "dual_passes")):
                key = figure_key(arm, fig) if arm else fig
                med[key] = max((r[col] for r in rows), default=0.0)
    return med, source


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inner", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    ratios: dict[str, dict[str, float]] = {}
    t_start = time.perf_counter()
    print(f"torch {torch.__version__}, device {device}, threads {args.threads}, rounds "
          f"{args.rounds} x {args.inner} steps, dual_steps {OptimConfig().manifold.dual_steps}, "
          f"dual {OptimConfig().manifold.dual_method} tol {OptimConfig().manifold.dual_tol}")
    print(f"{'preset':<10} {'arm':<12} {'ms/step':>10} {'x adamw':>8}")
    for label, preset in (("gpt-debug", gpt_debug), ("gpt-tiny", gpt_tiny)):
        med, source = bench_preset(preset, args.rounds, args.inner, device)
        ratios[label] = {figure_key(arm, "vs_adamw"): med[arm] / med["adamw"] for arm in ARMS
                         if arm != "adamw"}
        for key in [k for k in med if k not in ARMS]:
            ratios[label][key] = med.pop(key)
        for arm, t in med.items():
            print(f"{label:<10} {arm:<12} {1e3 * t:>10.2f} {t / med['adamw']:>8.1f}")
        print(f"{'':<10} model: {source}")
    print(f"total {time.perf_counter() - t_start:.0f} s")
    rounded = {p: {k: float(f"{v:.3g}") for k, v in r.items()} for p, r in ratios.items()}
    print(json.dumps({"preset": "gpt-tiny", **rounded["gpt-tiny"], "by_preset": rounded}))


if __name__ == "__main__":
    main()
