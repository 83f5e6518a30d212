"""Step cost of Manifold Muon per direction mode against plain Muon on gpt-debug and gpt-tiny.

Arms: ``adamw`` (everything on AdamW), ``muon`` (Paper B's unconstrained Muon), and for each
mode of ``optim.manifold.dual_mode`` (``fast``, ``paper``, ``exact``, each with its own tol and
pass cap) the assignments ``stiefel`` (all_stiefel), ``hetero`` (Stiefel attention, DGram MLP)
and ``dgram`` (all_dgram). Only ``optimizers.step()`` is timed, on fixed random gradients
(full rank; benchmarks/manifold_train_step.py times real, near rank-deficient ones), after one
untimed step (the first, cold solve; the timed ones warm-start where the mode does); arms are
interleaved round by round (rotating order) so machine load hits them alike; medians are kept.
After timing, every manifold matrix's direction is solved once more by its arm's mode and by
an fp64 reference (exact mode, 400 passes, tol 1e-10) on the same W and gradient, for the
direction error ||A - A_ref||_F / ||A_ref||_F and the true residual.

    python benchmarks/optimizer_step.py [--rounds 3] [--inner 1] [--threads 1] [--device cpu]

Prints a table, then as the last line one JSON object (gpt-tiny at top level, every preset
under ``by_preset``): ``<assignment>_vs_muon_<mode>`` (e.g. ``stiefel_vs_muon_fast``,
``hetero_vs_muon_fast``, ``dgram_vs_muon_fast``), ``muon_vs_adamw``,
``true_residual_max_<mode>`` and ``true_residual_max`` (over the fast arms: what the timed
steps logged, the true residual of the directions applied), ``direction_error_<mode>`` and
``direction_error_fast`` (max over the matrices of the fast arms), and the passes.
Uses the real GPT when ``workloads.models.gpt`` imports, else a stand-in with the same shapes.
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
from workloads.geometry.dual import DualOptions, solve_direction
from workloads.geometry.manifolds import get_manifold
from workloads.optim import build_optimizers

VOCAB = 65  # char-level Shakespeare

MODES = ("fast", "paper", "exact")
ASSIGNMENTS = {"stiefel": "all_stiefel", "hetero": "hetero", "dgram": "all_dgram"}
ARMS: dict[str, dict] = {
    "adamw": {"name": "adamw"},
    "muon": {"name": "muon", "assignment": "unconstrained"},
    **{f"{short}_{mode}": {"name": "muon", "assignment": full, "mode": mode}
       for mode in MODES for short, full in ASSIGNMENTS.items()},
}
REF = DualOptions(mode="exact", steps=400, tol=1e-10)


def figure_key(arm: str, figure: str) -> str:
    """``stiefel_fast`` + ``vs_muon`` -> ``stiefel_vs_muon_fast``; plain arms as they are."""
    for mode in MODES:
        if arm.endswith(f"_{mode}"):
            return f"{arm.removesuffix('_' + mode)}_{figure}_{mode}"
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
    cfg.manifold.dual_mode = arm.get("mode", "fast")
    return cfg


def direction_errors(model: nn.Module, opts, mode: str) -> list[tuple[float, float]]:
    """(direction error, true residual) of every manifold matrix's direction, solved by
    ``mode`` from its W and gradient, against the fp64 reference."""
    out = []
    for name, p in model.named_parameters():
        m = opts.managed.get(name)
        if m is None or m.constraint == "none":
            continue
        W, G = (p.detach().mT, p.grad.mT) if m.transposed else (p.detach(), p.grad)
        man = get_manifold(m.constraint)
        ref = solve_direction(G.double(), W.double(), man.projector, REF)
        dt = torch.float64 if mode == "exact" else torch.float32
        r = solve_direction(G.to(dt), W.to(dt), man.projector, DualOptions(mode=mode))
        A = r.A.double()
        err = float((A - ref.A).norm() / ref.A.norm())
        WA = W.double().mT @ A
        res = float(torch.linalg.matrix_norm(man.projector(WA + WA.mT)) / W.shape[-1])
        out.append((err, res))
    return out


def bench_preset(preset, rounds: int, inner: int, device: torch.device) -> tuple[dict, str]:
    torch.manual_seed(0)
    wl = preset()
    base, source = make_model(wl.model)
    base = base.to(device)
    grads = {n: torch.randn_like(p) * 1e-2 for n, p in base.named_parameters()}
    setups, models = {}, {}
    for arm, spec in ARMS.items():
        model = copy.deepcopy(base)
        opts = build_optimizers(model, optim_cfg(wl.optim, spec))
        for n, p in model.named_parameters():
            p.grad = grads[n].clone()
        opts.step()  # warm-up: allocates state, first-call overheads, the cold solve
        setups[arm], models[arm] = opts, model
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
    # what the timed steps logged (the true residual of the directions applied) and passes
    for arm in ARMS:
        rows = list(setups[arm].health().values())
        if rows:
            med[figure_key(arm, "true_residual_max")] = max(r["dual_residual"] for r in rows)
            med[figure_key(arm, "dual_passes_max")] = max(r["dual_passes"] for r in rows)
    for mode in MODES:
        errs = [e for short in ASSIGNMENTS for e in direction_errors(
            models[f"{short}_{mode}"], setups[f"{short}_{mode}"], mode)]
        med[f"direction_error_{mode}"] = max(e for e, _ in errs)
        med[f"true_residual_max_{mode}"] = max(
            med[figure_key(f"{short}_{mode}", "true_residual_max")] for short in ASSIGNMENTS)
    med["true_residual_max"] = med["true_residual_max_fast"]
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
          f"{args.rounds} x {args.inner} steps; each mode with its own tol and pass cap")
    print(f"{'preset':<10} {'arm':<14} {'ms/step':>10} {'x muon':>8} {'true res':>10} "
          f"{'passes':>7}")
    for label, preset in (("gpt-debug", gpt_debug), ("gpt-tiny", gpt_tiny)):
        med, source = bench_preset(preset, args.rounds, args.inner, device)
        r: dict[str, float] = {"muon_vs_adamw": med["muon"] / med["adamw"]}
        for arm in ARMS:
            if arm not in ("adamw", "muon"):
                r[figure_key(arm, "vs_muon")] = med[arm] / med["muon"]
        for key in [k for k in med if k not in ARMS]:
            r[key] = med[key]
        ratios[label] = r
        for arm in ARMS:
            res = med.get(figure_key(arm, "true_residual_max"), 0.0)
            ps = med.get(figure_key(arm, "dual_passes_max"), 0.0)
            print(f"{label:<10} {arm:<14} {1e3 * med[arm]:>10.2f} "
                  f"{med[arm] / med['muon']:>8.2f} {res:>10.1e} {ps:>7.0f}")
        print(f"{'':<10} direction error vs fp64 reference: "
              + ", ".join(f"{m} {med['direction_error_' + m]:.1e}" for m in MODES))
        print(f"{'':<10} model: {source}")
    print(f"total {time.perf_counter() - t_start:.0f} s")
    rounded = {p: {k: float(f"{v:.3g}") for k, v in r.items()} for p, r in ratios.items()}
    print(json.dumps({"preset": "gpt-tiny", **rounded["gpt-tiny"], "by_preset": rounded}))


if __name__ == "__main__":
    main()
