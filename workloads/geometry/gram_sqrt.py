"""N^{-1/2} of a symmetric positive definite n x n Gram near I; docs/science.md §3.2.

Used where a polar factor X (X^T X)^{-1/2} is wanted and X is close to orthonormal columns: the
retraction after a Manifold Muon step (||N - I|| ~ eta^2) and a square Stiefel W re-orthogonalised
to fp64 (||N - I|| ~ fp32 round-off). There the coupled Newton-Schulz iteration is quadratic from
Z = I (3 n x n products per iteration), and for the small deviations of those two cases the
binomial series is cheaper still; farther away one eigh is cheaper (measured: from a cold start
with cond(X) = 5 Newton-Schulz needs 12 iterations, 4.5x an fp64 eigh's time).
"""

from __future__ import annotations

import math

import torch

__all__ = ["NEAR", "inv_sqrt_near", "ns_iterations"]

NEAR = 0.5  # ||N - I||_F below this: Newton-Schulz (quadratic: e_k ~ err^(2^k))


def ns_iterations(err: float, eps: float) -> int:
    """Coupled Newton-Schulz iterations from Z = I to reach ``eps`` when ||N - I|| = ``err``."""
    if not err > eps:
        return 0
    return max(1, math.ceil(math.log2(math.log(eps) / math.log(max(err, 1e-300)))) + 1)


def _series_degree(err: float, eps: float, cap: int) -> int | None:
    """Smallest degree d of the binomial series of (1 + x)^{-1/2} whose tail, at most
    err^(d+1) / (1 - err) at |x| = ``err`` (the coefficients are below 1), is below ``eps``;
    None if that exceeds ``cap``."""
    d = 0
    while err ** (d + 1) / (1.0 - err) >= eps:
        d += 1
        if d > cap:
            return None
    return d


def inv_sqrt_near(N: torch.Tensor, tol: float = 0.0) -> torch.Tensor:
    """(N)^{-1/2} for symmetric positive definite N (..., n, n), in N's dtype.

    ``tol`` (default: 4 eps of the dtype) is the accuracy the iterative branches reach. With
    c = tr N / n and E = N / c - I (the isotropic part, e.g. a step's 1 + eta^2, taken out):
    the binomial series c^{-1/2} (I - E/2 + 3/8 E^2 - ...) when it needs fewer products than
    Newton-Schulz (||E|| ~ 1e-3..1e-6, the retraction and fp32 round-off: 1-2 products against
    Newton-Schulz's 6-9), else coupled Newton-Schulz; when some ||E||_F is not below ``NEAR``
    (or not finite) the whole batch takes one eigh, with eigenvalues below n eps lambda_max (a
    rank-deficient N) mapped to 0.
    """
    n = N.shape[-1]
    eye = torch.eye(n, dtype=N.dtype, device=N.device)
    c = (N.diagonal(dim1=-2, dim2=-1).sum(-1) / n).clamp_min(torch.finfo(N.dtype).tiny)
    E = N / c[..., None, None] - eye
    err = float(torch.linalg.matrix_norm(E).max())  # >= ||E||_2; one host sync
    eps = max(tol, 4 * torch.finfo(N.dtype).eps)
    if err < NEAR:
        iters = ns_iterations(err, eps)
        d = _series_degree(err, eps, 3 * iters)
        if d is not None and d <= 1 + 3 * iters:
            # Horner on the binomial coefficients binom(-1/2, k): d - 1 products
            coef = [1.0]
            for k in range(1, d + 1):
                coef.append(coef[-1] * (0.5 - k) / k)
            Z = eye.expand_as(E) if d == 0 else coef[d - 1] * eye + coef[d] * E
            for k in range(d - 2, -1, -1):
                Z = coef[k] * eye + E @ Z
        else:
            # Y_k -> (N/c)^{1/2}, Z_k -> (N/c)^{-1/2}; polynomials in N, so they commute
            Y, Z = E + eye, eye.expand_as(E)
            for _ in range(iters):
                T = 1.5 * eye - 0.5 * (Z @ Y)
                Y, Z = Y @ T, T @ Z
        Z = 0.5 * (Z + Z.mT)
        return Z * c.rsqrt()[..., None, None]
    e, V = torch.linalg.eigh(0.5 * (N + N.mT))
    e = e.clamp_min(0.0)
    floor = e[..., -1:] * (n * torch.finfo(N.dtype).eps)
    inv = torch.where(e > floor, e.clamp_min(torch.finfo(N.dtype).tiny).rsqrt(), 0.0)
    return (V * inv.unsqueeze(-2)) @ V.mT
