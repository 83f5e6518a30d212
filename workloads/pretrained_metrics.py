"""The maths of ``workloads.pretrained.analyse``: per-pair continuity metrics of two layers'
matrices, their top-k singular triplets, the Gram baseline and the shuffled layer order.

Split out of workloads/pretrained.py to keep files small; ``shuffled_order`` is re-exported
there.
"""

from __future__ import annotations

import torch

from workloads.metrics import continuity as C

__all__ = ["shuffled_order"]


def shuffled_order(n: int, seed: int = 0, tries: int = 1000) -> list[int]:
    """A fixed-seed permutation of 0..n-1, preferring one with no originally adjacent pair."""
    g = torch.Generator().manual_seed(seed)
    first = None
    for _ in range(tries):
        perm = torch.randperm(n, generator=g).tolist()
        if perm != list(range(n)):
            first = first or perm
        if all(abs(a - b) != 1 for a, b in zip(perm, perm[1:])):
            return perm
    return first or list(range(n))[::-1]  # n <= 3: no order avoids every adjacent pair


def _top(W: torch.Tensor, k: int, exact_max: int) -> dict[str, torch.Tensor]:
    """Top-k singular triplets U (m, k), S (k,), V (n, k): exact SVD, or block power iteration
    (docs/science.md §4.4.3) when min(m, n) > exact_max."""
    if min(W.shape) <= exact_max:
        U, S, V = C.top_singular(W, k)
    else:
        U, S, V, _, _ = C.subspace_iteration(W, k, generator=torch.Generator().manual_seed(0))
    return {"U": U, "S": S, "V": V}


def _gram_baseline(m: int, n: int, side: str) -> float:
    """M3 for independent Gaussian m x n matrices: ~m/(m+n) on the input side
    (docs/science.md §4.3)."""
    return (m if side == "in" else n) / (m + n)


def _pair_metrics(Wa, ta, Wb, tb, ks) -> list[tuple[str, str, float]]:
    """(metric, side, value) for one pair; sides per RESIDUAL_SIDE of the caller's role."""
    out = []
    # Each Gram formed once, in the small dimension; the (2, m, n) stack is a transient copy.
    gram = C.gram_alignment_adjacent(torch.stack([Wa, Wb]))
    for vec in ("in", "out"):
        X_a, X_b = (ta["V"], tb["V"]) if vec == "in" else (ta["U"], tb["U"])
        out.append(("top1", vec, C.top1_continuity(X_a[:, :1], X_b[:, :1]).item()))
        for k in ks:
            out.append((f"sub{k}", vec, C.subspace_overlap(X_a[:, :k], X_b[:, :k]).item()))
        out.append(("gram", vec, gram[vec].item()))
        out.append(("gram_c", vec, gram[f"{vec}_c"].item()))
    return out
