"""All-ones-blind continuity (docs/science.md §4.5 [DESIGN]): M1 of the top singular vectors of
the doubly centred matrices ``P_m X P_n``, for weights (``wc.*``) and probe gradients (``gpc.*``).

Why: a ReLU block adds a non-negative vector to the stream at every layer, so the stream and the
matrices that read and write it share a mean direction, and their top singular vectors lean to
the all-ones vector on both sides. Two layers' top vectors then agree because both point at
all-ones, not because one layer's output is the next one's input. The ``ones_*`` control
detects this; the centred metric removes it: every singular vector of ``P_m X P_n`` is
orthogonal to all-ones, so whatever agreement is left is in the other n - 1 directions.

Rows (the same shapes and names as the uncentred ones, prefix ``wc`` / ``gpc``):
- ``{src}.top1_{v|u}`` adjacent layers (pair rows), ``{src}.dist_top1_{v|u}`` at layer
  distances 1, 2, 5, 10;
- ``{src}.s1_s2`` per layer: the centred matrix's top-1 gap (mean over probes for ``gpc``),
  which the verdicts' top-1-degenerate control reads for these metrics.
There is no all-ones control row: it is 0 by construction. The random baseline of two
independent unit vectors in the (dim - 1)-dimensional complement is sqrt(2 / (pi (dim - 1))),
within 0.2% of ``base.top1`` at dim 256.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from workloads.metrics import continuity as C
from workloads.metrics import probe as P

__all__ = ["CENTRED_SOURCES", "centred_rows"]

CENTRED_SOURCES = {"w": "wc", "gp": "gpc"}  # uncentred source -> centred row prefix

Out = tuple[str, str, list[int], int, Tensor]


@torch.no_grad()
def centred_rows(src: str, module: str, layers: Sequence[int], X: Tensor, exact: bool,
                 warm: dict[str, Tensor], generator: torch.Generator | None = None,
                 warm_iters: int = 30) -> list[Out]:
    """Rows of the centred top-1 continuity of ``X`` (L, m, n) (weights) or (P, L, m, n)
    (one stack per probe batch); ``src`` is ``wc`` or ``gpc``.

    ``exact``: batched SVD; else subspace iteration warm-started from ``warm[key]`` (updated
    in place), as for the uncentred metrics.
    """
    Xc = C.center_both(X)
    if Xc.dim() == 3:
        Xc = Xc[None]  # one "probe" for the weights
    rows: list[Out] = []
    U, S, V, res = C.top_k_warm(Xc, 2, exact, warm, f"{src}.{module}", generator, warm_iters)
    if res is not None:
        rows.append((f"{src}.ritz_res", module, list(layers), 0, res.amax(-1).amax(0)))
    rows += P.vector_rows(src, module, layers, {"v": V[..., 0], "u": U[..., 0]},
                          adjacent=True, ones=False)
    gap = S[..., 0] / S[..., 1].clamp_min(1e-30) if S.shape[-1] > 1 else torch.ones_like(S[..., 0])
    rows.append((f"{src}.s1_s2", module, list(layers), 0, gap.mean(0)))
    return rows
