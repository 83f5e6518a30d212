"""Geometric-continuity metrics of docs/science.md §4.3-4.4: pure functions on (stacks of) matrices.

Weights use the ``nn.Linear`` layout W (m x n, out x in), ``W = U diag(S) V^T``; ``u`` lives in
output space, ``v`` in input space. Every function accepts a leading batch of layers
(..., m, n), works under ``no_grad`` in the input's dtype (fp64 stays fp64; half precisions are
upcast to fp32) and returns tensors, so callers decide when to synchronise.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "as_float",
    "top_singular",
    "top1_continuity",
    "center_both",
    "subspace_overlap",
    "gram_alignment",
    "gram_alignment_adjacent",
    "cosine_frobenius",
    "relative_change",
    "random_baseline_top1",
    "random_baseline_subspace",
    "subspace_iteration",
    "top_k_warm",
    "lowrank_top",
    "ritz_residual",
]

_EPS = 1e-30


def as_float(W: torch.Tensor) -> torch.Tensor:
    """Detached fp32 (or fp64 when given fp64); never compare bf16 directly (SCIENCE 4.4.4)."""
    W = W.detach()
    return W if W.dtype in (torch.float32, torch.float64) else W.float()


@torch.no_grad()
def top_singular(W: torch.Tensor, k: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact top-k singular triplets of a stack W (..., m, n) in one batched SVD.

    Returns U (..., m, k), S (..., k) descending, V (..., n, k).
    """
    W = as_float(W)
    U, S, Vh = torch.linalg.svd(W, full_matrices=False)
    return U[..., :k], S[..., :k], Vh[..., :k, :].mT


@torch.no_grad()
def top1_continuity(V_a: torch.Tensor, V_b: torch.Tensor) -> torch.Tensor:
    """M1: |cos| between vectors (..., n) (or (..., n, 1) columns); sign-invariant."""
    if V_a.dim() >= 2 and V_a.shape[-1] == 1:
        V_a, V_b = V_a[..., 0], V_b[..., 0]
    V_a, V_b = as_float(V_a), as_float(V_b)
    num = (V_a * V_b).sum(-1).abs()
    return num / (V_a.norm(dim=-1) * V_b.norm(dim=-1)).clamp_min(_EPS)


@torch.no_grad()
def center_both(W: torch.Tensor) -> torch.Tensor:
    """P_m W P_n for a stack (..., m, n), P = I - 11^T / dim: the all-ones direction removed
    from both sides (docs/science.md §4.5, the all-ones-blind M1 [DESIGN]).

    Its singular vectors are orthogonal to the all-ones vector on each side (or it is the zero
    matrix), so a shared non-negative mean direction (ReLU outputs) cannot make two layers'
    top vectors agree. Equal to double centring: subtract row and column means, add back the
    grand mean.
    """
    W = as_float(W)
    r = W.mean(-1, keepdim=True)  # (..., m, 1) row means
    c = W.mean(-2, keepdim=True)  # (..., 1, n) column means
    return W - r - c + W.mean((-2, -1), keepdim=True)


@torch.no_grad()
def subspace_overlap(Vk_a: torch.Tensor, Vk_b: torch.Tensor) -> torch.Tensor:
    """M2: ||V_a^T V_b||_F^2 / k for orthonormal column blocks (..., n, k); in [0, 1]."""
    Vk_a, Vk_b = as_float(Vk_a), as_float(Vk_b)
    k = Vk_a.shape[-1]
    return (Vk_a.mT @ Vk_b).pow(2).sum((-2, -1)) / k


def _gram_inner_in(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """<A^T A, B^T B> for (..., m, n) without forming the larger Gram: O(mn min(m, n))."""
    m, n = A.shape[-2], A.shape[-1]
    if m <= n:
        return (B @ A.mT).pow(2).sum((-2, -1))  # ||B A^T||_F^2, (m x m)
    return ((A.mT @ A) * (B.mT @ B)).sum((-2, -1))  # explicit (n x n) Grams


def _gram_sqnorm(A: torch.Tensor) -> torch.Tensor:
    """||A^T A||_F^2 = ||A A^T||_F^2 via the smaller Gram."""
    G = A @ A.mT if A.shape[-2] <= A.shape[-1] else A.mT @ A
    return G.pow(2).sum((-2, -1))


@torch.no_grad()
def gram_alignment(
    Wa: torch.Tensor, Wb: torch.Tensor, side: str = "in", centred: bool = False
) -> torch.Tensor:
    """M3: normalised Frobenius inner product of Gram matrices; matmuls only, no SVD.

    side="in" compares W^T W (n x n, the v side); side="out" compares W W^T (m x m, the u side).
    ``centred`` subtracts the isotropic part tr(G)/dim * I from each Gram, whose random baseline
    is ~0 (the raw version's is ~m/(m+n) for Gaussian matrices, SCIENCE 4.3 caveat); it uses
    <Ga~, Gb~> = <Ga, Gb> - tr Ga tr Gb / dim and ||G~||^2 = ||G||^2 - (tr G)^2 / dim.
    """
    if side not in ("in", "out"):
        raise ValueError(f"side: {side!r} is not one of in, out")
    Wa, Wb = as_float(Wa), as_float(Wb)
    if side == "out":
        Wa, Wb = Wa.mT, Wb.mT
    inner = _gram_inner_in(Wa, Wb)
    na, nb = _gram_sqnorm(Wa), _gram_sqnorm(Wb)
    if centred:
        dim = Wa.shape[-1]
        ta, tb = Wa.pow(2).sum((-2, -1)), Wb.pow(2).sum((-2, -1))  # tr(W^T W) = ||W||_F^2
        inner = inner - ta * tb / dim
        na, nb = na - ta * ta / dim, nb - tb * tb / dim
    return inner / (na.clamp_min(0) * nb.clamp_min(0)).sqrt().clamp_min(_EPS)


@torch.no_grad()
def gram_alignment_adjacent(W: torch.Tensor) -> dict[str, torch.Tensor]:
    """M3 for every consecutive pair of a stack (L, m, n): keys in, out, in_c, out_c -> (L-1,).

    Equal to ``gram_alignment(W[:-1], W[1:], side, centred)`` but each layer's Gram is formed
    once, and only in the small dimension s = min(m, n): with T the tall form (rows >= cols),
    <G_a, G_b> on the small side is <T_a^T T_a, T_b^T T_b> and on the large side ||T_a^T T_b||^2.
    """
    W = as_float(W)
    m, n = W.shape[-2], W.shape[-1]
    T = W if m >= n else W.mT  # (L, big, small)
    G = T.mT @ T  # (L, s, s)
    gsq = G.pow(2).sum((-2, -1))  # ||G||_F^2, the same on both sides
    tr = T.pow(2).sum((-2, -1))  # tr G = ||W||_F^2
    small = (G[:-1] * G[1:]).sum((-2, -1))
    large = (T[:-1].mT @ T[1:]).pow(2).sum((-2, -1))
    inner = {"in": small, "out": large} if m >= n else {"in": large, "out": small}
    dims = {"in": n, "out": m}
    out = {}
    for side, x in inner.items():
        out[side] = x / (gsq[:-1] * gsq[1:]).sqrt().clamp_min(_EPS)
        d = dims[side]
        xc = x - tr[:-1] * tr[1:] / d
        na, nb = gsq[:-1] - tr[:-1] ** 2 / d, gsq[1:] - tr[1:] ** 2 / d
        out[f"{side}_c"] = xc / (na.clamp_min(0) * nb.clamp_min(0)).sqrt().clamp_min(_EPS)
    return out


@torch.no_grad()
def cosine_frobenius(Ga: torch.Tensor, Gb: torch.Tensor) -> torch.Tensor:
    """M5: signed <Ga, Gb>_F / (||Ga||_F ||Gb||_F) over the last two dims (gradient coherence)."""
    Ga, Gb = as_float(Ga), as_float(Gb)
    num = (Ga * Gb).sum((-2, -1))
    return num / (Ga.norm(dim=(-2, -1)) * Gb.norm(dim=(-2, -1))).clamp_min(_EPS)


@torch.no_grad()
def relative_change(
    W: torch.Tensor, W0: torch.Tensor, spectral: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """M6: (||W - W0||_F / ||W0||_F, ||W - W0||_2 / ||W0||_2); the second is None if not asked."""
    W, W0 = as_float(W), as_float(W0)
    D = W - W0
    fro = D.norm(dim=(-2, -1)) / W0.norm(dim=(-2, -1)).clamp_min(_EPS)
    if not spectral:
        return fro, None
    spec = torch.linalg.matrix_norm(D, ord=2) / torch.linalg.matrix_norm(W0, ord=2).clamp_min(_EPS)
    return fro, spec


def random_baseline_top1(n: int, exact: bool = False) -> float:
    """E|cos| of two independent uniform unit vectors in R^n: ~sqrt(2/(pi n)) (SCIENCE 4.3 M1).

    ``exact`` gives Gamma(n/2) / (sqrt(pi) Gamma((n+1)/2)), which the approximation matches to
    about 1/(4n) relative.
    """
    if exact:
        return math.exp(math.lgamma(n / 2) - math.lgamma((n + 1) / 2)) / math.sqrt(math.pi)
    return math.sqrt(2.0 / (math.pi * n))


def random_baseline_subspace(k: int, n: int) -> float:
    """E psi_k for independent uniform k-dim subspaces of R^n (M2): k / n."""
    return k / n


# --- cheap top-k (SCIENCE 4.4.3) ---------------------------------------------------------


@torch.no_grad()
def ritz_residual(W: torch.Tensor, V: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """||W^T W v_i - s_i^2 v_i|| / s_i^2 per column: (..., n, k), (..., k) -> (..., k)."""
    W, V, S = as_float(W), as_float(V), as_float(S)
    s2 = S.pow(2)
    R = W.mT @ (W @ V) - V * s2.unsqueeze(-2)
    return R.norm(dim=-2) / s2.clamp_min(_EPS)


def _rayleigh_ritz(V: torch.Tensor, Z: torch.Tensor, k: int):
    """Ritz pairs of W^T W in span(V) (orthonormal), given Z = W^T W V: sorted descending."""
    H = V.mT @ Z
    evals, evecs = torch.linalg.eigh(0.5 * (H + H.mT))  # ascending
    evals, evecs = evals.flip(-1), evecs.flip(-1)
    Vr, Zr = V @ evecs, Z @ evecs
    s2 = evals[..., :k].clamp_min(0)
    res = (Zr[..., :k] - Vr[..., :k] * s2.unsqueeze(-2)).norm(dim=-2) / s2.clamp_min(_EPS)
    return Vr, Zr, res


@torch.no_grad()
def subspace_iteration(
    W: torch.Tensor,
    k: int,
    V0: torch.Tensor | None = None,
    oversample: int = 4,
    max_iters: int = 30,
    tol: float = 1e-4,
    check_every: int = 3,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Warm-started block power iteration on W^T W: V <- qr(W^T (W V)), with Rayleigh-Ritz.

    W (..., m, n); q = min(k + oversample, m, n) columns are iterated (vector i converges like
    (s_{q+1}/s_i)^2 per step). ``V0`` (..., n, q) is the previous call's ``Vq`` (the warm start);
    ``None`` starts from a Gaussian block. Every ``check_every`` iterations (and at the end) a
    Rayleigh-Ritz step sorts the block and measures the Ritz residual
    ||W^T W v_i - s_i^2 v_i|| / s_i^2 of the top k; it stops once the largest is below ``tol``.

    Returns U (..., m, k), S (..., k), V (..., n, k), Vq (..., n, q) for the next warm start,
    and the Ritz residuals (..., k).
    """
    W = as_float(W)
    m, n = W.shape[-2], W.shape[-1]
    q = max(k, min(k + oversample, m, n))
    batch = W.shape[:-2]
    if V0 is None or V0.shape != (*batch, n, q):
        V0 = torch.randn(*batch, n, q, generator=generator, dtype=W.dtype).to(W.device)
    V = torch.linalg.qr(V0.to(W.dtype))[0]
    for it in range(1, max_iters + 1):
        Z = W.mT @ (W @ V)  # (..., n, q)
        if it % check_every == 0 or it == max_iters:
            Vr, Zr, res = _rayleigh_ritz(V, Z, k)
            if res.max().item() < tol or it == max_iters:
                V = Vr
                break
        V = torch.linalg.qr(Z)[0]
    Vk = V[..., :k]
    WV = W @ Vk
    S = WV.norm(dim=-2)
    U = WV / S.unsqueeze(-2).clamp_min(_EPS)
    return U, S, Vk, V, res


@torch.no_grad()
def lowrank_top(
    W: torch.Tensor, k: int, oversample: int = 8, niter: int = 4
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Randomised top-k via ``torch.svd_lowrank(W, q=k+8, niter=4)``: U (..., m, k), S, V."""
    W = as_float(W)
    q = min(k + oversample, W.shape[-2], W.shape[-1])
    U, S, V = torch.svd_lowrank(W, q=q, niter=niter)
    return U[..., :k], S[..., :k], V[..., :k]


@torch.no_grad()
def top_k_warm(X: torch.Tensor, k: int, exact: bool, warm: dict[str, torch.Tensor], key: str,
               generator: torch.Generator | None = None, warm_iters: int = 30
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Top-k singular triplets of a stack X (..., m, n) that stay warm between collects.

    ``exact``: one batched SVD, whose k + 4 right vectors are kept in ``warm[key]`` as the next
    cheap call's start. Else ``subspace_iteration`` from ``warm[key]`` (``warm_iters``
    iterations when a start exists, 30 from cold), its subspace kept the same way. Returns
    U, S, V with k columns and the Ritz residual (None on the exact path).
    """
    m, n = X.shape[-2:]
    if exact:
        U, S, V = top_singular(X, min(k + 4, m, n))
        warm[key] = V
        return U[..., :k], S[..., :k], V[..., :k], None
    U, S, V, warm[key], res = subspace_iteration(
        X, k, warm.get(key), max_iters=warm_iters if key in warm else 30, check_every=2,
        generator=generator)
    return U, S, V, res
