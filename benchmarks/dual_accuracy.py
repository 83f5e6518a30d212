"""How close each Manifold Muon direction mode comes to the exact direction, on real gradients.

Trains gpt-debug and gpt-tiny on the shipped Shakespeare text with Manifold Muon (all_stiefel
and all_dgram, fast mode, matched init) and captures, at a few steps, every bucket's tall
(W, G~) pair exactly as the optimizer hands it to the direction solver. Each pair is then
solved cold by every mode (``fast``, ``paper``, ``exact`` with their default tol and pass cap)
and by a reference: the ``exact`` mode (fp64) with 400 passes at tol 1e-10. Per preset,
constraint and shape (tall / square) it prints:

- the true residual ||P(W^T A + A^T W)||_F / n of each mode's A, recomputed in fp64 against W
  (and whether it equals what the solver reported);
- the direction error ||A - A_ref||_F / ||A_ref||_F and the objective gap
  1 - <G, A> / <G, A_ref> (the linear objective the direction maximises);
- as the floor of working precision, the same error for plain Muon's own msign of G (Polar
  Express in fp32, as on CPU) against the fp64 SVD polar factor;
- the floors of an fp32 direction with the multiplier exact: the reference's X* rounded to
  fp32 and its polar factor taken through the Gram, as ``fast`` does (``gram32``), or by an
  fp32 SVD of the tall X* (``tall32``); no fp32 solver can beat the second.

    python benchmarks/dual_accuracy.py [--steps-debug 200] [--steps-tiny 60] [--threads 1]

Prints the table; the last line is one JSON object: ``direction_error_fast`` (max over the
tall matrices, where the optimum is regular), ``direction_error_fast_square``,
``true_residual_rel_mismatch_max`` (max over modes and matrices of |reported - true| /
max(true, 1e-6): the reported residual is the true one to the dtype's round-off), per row the
figures, and the reference's own residual.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import workloads.optim.muon as muon_mod
from workloads.config import preset
from workloads.geometry.dual import DualOptions, solve_direction
from workloads.geometry.dual_newton import eig_gram
from workloads.geometry.manifolds import get_manifold
from workloads.geometry.msign import msign
from workloads.models import build_model
from workloads.optim import build_optimizers
from workloads.train import build_data

MODES = ("fast", "paper", "exact")
REF = DualOptions(mode="exact", steps=400, tol=1e-10)
F64 = torch.float64


def capture(name: str, assignment: str, steps: int, at: set[int]) -> list[dict]:
    """Train ``name`` with ``assignment`` (fast mode) and keep the solver's inputs at ``at``."""
    wl = preset(name)
    wl.optim.name, wl.optim.manifold.assignment = "muon", assignment
    wl.optim.manifold.init_match = True
    torch.manual_seed(0)
    data = build_data(wl)
    model = build_model(wl.model, vocab_size=data.vocab_size)
    opts = build_optimizers(model, wl.optim)
    got: list[dict] = []
    step = {"now": 0}
    inner = muon_mod.manifold_muon_step

    def spy(W, G, lr, constraint, *a, **k):
        if step["now"] in at:
            Wt, Gt = (W.mT, G.mT) if W.shape[-2] < W.shape[-1] else (W, G)
            got.append({"step": step["now"], "constraint": constraint, "W": Wt.clone(),
                        "G": Gt.clone()})
        return inner(W, G, lr, constraint, *a, **k)

    muon_mod.manifold_muon_step = spy
    try:
        for s in range(1, steps + 1):
            step["now"] = s
            x, y = data.batcher.next()
            _, loss = model(x, y)
            loss.backward()
            opts.set_lr(wl.optim.lr)
            opts.step()
            opts.zero_grad()
    finally:
        muon_mod.manifold_muon_step = inner
    return got


def rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).norm(dim=(-2, -1)) / b.norm(dim=(-2, -1))


def evaluate(item: dict) -> dict:
    """Every mode and the reference on one captured bucket; per-matrix figures."""
    m = get_manifold(item["constraint"])
    W, G = item["W"], item["G"]
    W64, G64 = W.to(F64), G.to(F64)
    ref = solve_direction(G64, W64, m.projector, REF)
    out = {"ref_res": ref.residual.tolist()}
    obj_ref = (G64 * ref.A).sum(dim=(-2, -1))
    for mode in MODES:
        t0 = time.process_time()
        r = solve_direction(G if mode != "exact" else G64, W if mode != "exact" else W64,
                            m.projector, DualOptions(mode=mode))
        dt = time.process_time() - t0
        A = r.A.to(F64)
        WA = W64.mT @ A
        true = torch.linalg.matrix_norm(m.projector(WA + WA.mT)) / W.shape[-1]
        out[mode] = {
            "res": true.tolist(), "reported": r.residual.to(F64).tolist(),
            "err": rel(A, ref.A).tolist(),
            "gap": (1.0 - (G64 * A).sum(dim=(-2, -1)) / obj_ref).tolist(),
            "passes": r.passes.tolist(), "cpu_s": dt,
        }
    # plain Muon's own msign (fp32 Polar Express on CPU) against the exact polar factor
    out["muon_msign_err"] = rel(msign(G, method="polar_express").to(F64),
                                msign(G64, method="svd")).tolist()
    out.update(floors(G64, W64, ref, out))
    return out


def floors(G64: torch.Tensor, W64: torch.Tensor, ref, out: dict) -> dict:
    """What fp32 can do with the reference's own multiplier: its X* = G/||G|| + 2 W L* rounded
    to fp32, then msign(X*) (a) as fast computes it, in Gram space (one fp32 eigh of X*^T X*,
    eigenvalues below n eps e_max dropped: singular values below ~sqrt(n eps) sigma_max are
    lost) and (b) from the tall X* itself (fp32 SVD: resolves ~eps sigma_max). Their errors
    against the reference are the floors of an fp32 direction on the two routes, with the
    multiplier exact."""
    scale = G64.norm(dim=(-2, -1), keepdim=True)
    X = (G64 / scale + 2.0 * W64 @ ref.L).float()
    e, V = eig_gram(X.mT @ X)
    inv = torch.where(e > 0, e.clamp_min(1e-38).rsqrt(), 0.0)
    A_gram = X @ ((V * inv.unsqueeze(-2)) @ V.mT)
    U, _, Vh = torch.linalg.svd(X, full_matrices=False)
    return {"floor_gram32": rel(A_gram.to(F64), ref.A).tolist(),
            "floor_tall32": rel((U @ Vh).to(F64), ref.A).tolist()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps-debug", type=int, default=200)
    ap.add_argument("--steps-tiny", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    plan = [("gpt-debug", args.steps_debug), ("gpt-tiny", args.steps_tiny)]
    rows: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for name, steps in plan:
        at = {1, max(2, steps // 2), steps}
        for assignment in ("all_stiefel", "all_dgram"):
            for item in capture(name, assignment, steps, at):
                W = item["W"]
                kind = "square" if W.shape[-2] == W.shape[-1] else "tall"
                key = (name, item["constraint"], kind)
                ev = evaluate(item)
                row = rows.setdefault(key, {})
                row.setdefault("ref_res", []).extend(ev["ref_res"])
                for f in ("muon_msign_err", "floor_gram32", "floor_tall32"):
                    row.setdefault(f, []).extend(ev[f])
                for mode in MODES:
                    for f in ("res", "reported", "err", "gap", "passes"):
                        row.setdefault(f"{mode}_{f}", []).extend(ev[mode][f])
    print(f"torch {torch.__version__}, threads {args.threads}; reference: exact mode, 400 "
          f"passes, tol 1e-10; each mode cold, its default tol and pass cap")
    head = (f"{'preset':<10}{'manifold':<8}{'shape':<7}{'n':>4}{'ref res':>9}{'muon':>9}"
            f"{'gram32':>9}{'tall32':>9}  "
            + "".join(f"{m + ' res':>10}{m + ' err':>10}{m + ' gap':>10}{'pass':>5}"
                      for m in MODES))
    print(head)
    js: dict[str, float] = {}
    mismatch = 0.0
    for (name, c, kind), row in rows.items():
        n = len(row["ref_res"])
        line = (f"{name:<10}{c:<8}{kind:<7}{n:>4}{max(row['ref_res']):>9.1e}"
                f"{statistics.median(row['muon_msign_err']):>9.1e}"
                f"{statistics.median(row['floor_gram32']):>9.1e}"
                f"{statistics.median(row['floor_tall32']):>9.1e}  ")
        for mode in MODES:
            res, err, gap = row[f"{mode}_res"], row[f"{mode}_err"], row[f"{mode}_gap"]
            line += (f"{max(res):>10.1e}{max(err):>10.1e}{max(gap):>10.1e}"
                     f"{max(row[f'{mode}_passes']):>5}")
            tag = f"{name}_{c}_{kind}_{mode}"
            js[f"{tag}_res_max"], js[f"{tag}_err_max"] = max(res), max(err)
            js[f"{tag}_err_median"], js[f"{tag}_gap_max"] = statistics.median(err), max(gap)
            # |reported - true| beyond the round-off of the working dtype's own residual
            # computation (fp32 W^T A: ~1e-7 of its entries, which are O(1) at unit columns)
            mismatch = max(mismatch, max(abs(a - b) / max(b, 1e-6)
                                         for a, b in zip(row[f"{mode}_reported"], res)))
        for f in ("muon_msign_err", "floor_gram32", "floor_tall32"):
            js[f"{name}_{c}_{kind}_{f}_median"] = statistics.median(row[f])
        print(line)
    print("(res: true residual; err: direction error vs the reference; gap: objective gap; "
          "muon: median error of plain Muon's fp32 msign of G vs the SVD polar factor; "
          "gram32 / tall32: median error of msign of the reference's own X* rounded to fp32, "
          "in Gram space as fast computes it / by an fp32 SVD of the tall X*)")
    tall = [v for k, v in js.items() if "_tall_fast_err_max" in k]
    square = [v for k, v in js.items() if "_square_fast_err_max" in k]
    print(f"total {time.perf_counter() - t0:.0f} s")
    print(json.dumps({"direction_error_fast": max(tall, default=0.0),
                      "direction_error_fast_square": max(square, default=0.0),
                      "true_residual_rel_mismatch_max": mismatch,
                      **{k: float(f"{v:.3g}") for k, v in js.items()}}))


if __name__ == "__main__":
    main()
