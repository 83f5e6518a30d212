"""Paper C's gradient continuity and controls (docs/science.md §4.3 M1/M5/M7, §4.5).

- ``probe_gradients``: G_l = dL/dW_l on a few *fixed* probe batches, without touching ``.grad``
  (``torch.autograd.grad``), so it can run at step 0 and at every metrics step.
- ``vector_rows``: from top-1 singular vectors stacked as (P, L, dim) (P probes, or P = 1 for
  the weights), M1 at layer distances d (``{src}.dist_top1_{side}``, ``next_layer = layer + d``),
  the all-ones control (``{src}.ones_{side}``) and, for the probes, M1 at d = 1
  (``gp.top1_{side}``); each value is averaged over the P probes.

Every |cos| here has the random baseline sqrt(2 / (pi dim)) of two independent uniform unit
vectors (also for a fixed direction such as all-ones against a uniform vector).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from workloads.metrics import continuity as C

__all__ = ["DISTANCES", "pairs_at", "ones_alignment", "probe_gradients", "vector_rows"]

DISTANCES = (1, 2, 5, 10)  # layer distances of the decay control (real continuity decays)

Out = tuple[str, str, list[int], int, Tensor]  # (metric, module, layers, offset, values)


def pairs_at(layers: Sequence[int], d: int) -> tuple[list[int], list[int]]:
    """Stack indices (i, j) with layers[j] == layers[i] + d."""
    pos = {lay: i for i, lay in enumerate(layers)}
    a = [i for i, lay in enumerate(layers) if lay + d in pos]
    return a, [pos[layers[i] + d] for i in a]


@torch.no_grad()
def ones_alignment(Y: Tensor) -> Tensor:
    """|<y, 1/sqrt(n)>| / ||y|| over the last dim: the all-ones control of §4.5. Non-negative
    inputs (ReLU outputs) pull top singular vectors towards it, which mimics continuity."""
    Y = C.as_float(Y)
    n = Y.shape[-1]
    return Y.sum(-1).abs() / (math.sqrt(n) * Y.norm(dim=-1).clamp_min(1e-30))


def probe_gradients(model: nn.Module, params: Sequence[nn.Parameter],
                    batches: Sequence[tuple[Tensor, Tensor]]) -> tuple[list[list], Tensor]:
    """Per batch, dL/dp for every p of ``params`` (None where unused) and the losses (P,).

    The model runs in eval mode (no dropout) and its mode is restored; ``.grad`` is untouched.
    """
    was_training = model.training
    grads, losses = [], []
    try:
        model.eval()
        for x, y in batches:
            with torch.enable_grad():
                _, loss = model(x, y)
                gs = torch.autograd.grad(loss, list(params), allow_unused=True)
            grads.append([None if g is None else g.detach() for g in gs])
            losses.append(loss.detach().float())
    finally:
        model.train(was_training)
    return grads, torch.stack(losses)


@torch.no_grad()
def vector_rows(src: str, module: str, layers: Sequence[int], vecs: dict[str, Tensor],
                adjacent: bool, ones: bool = True) -> list[Out]:
    """Rows from top-1 vectors ``vecs[side]`` of shape (P, L, dim), side in v, u.

    ``adjacent`` adds ``{src}.top1_{side}`` (M1 at d = 1; the weight rows already have it);
    ``ones`` the all-ones control (off for vectors that are orthogonal to it by construction).
    """
    out: list[Out] = []
    for side, Y in vecs.items():
        if adjacent:
            a, b = pairs_at(layers, 1)
            if a:
                out.append((f"{src}.top1_{side}", module, [layers[i] for i in a], 1,
                            C.top1_continuity(Y[:, a], Y[:, b]).mean(0)))
        for d in DISTANCES:
            a, b = pairs_at(layers, d)
            if a:
                out.append((f"{src}.dist_top1_{side}", module, [layers[i] for i in a], d,
                            C.top1_continuity(Y[:, a], Y[:, b]).mean(0)))
        if ones:
            out.append((f"{src}.ones_{side}", module, list(layers), 0,
                        ones_alignment(Y).mean(0)))
    return out
