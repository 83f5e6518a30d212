"""N^{-1/2} of a symmetric positive definite n x n Gram near I; docs/science.md §3.2.

Used where a polar factor X (X^T X)^{-1/2} is wanted and X is close to orthonormal columns: the
retraction after a Manifold Muon step (||N - I|| ~ eta^2) and a square Stiefel W re-orthogonalised
to fp64 (||N - I|| ~ fp32 round-off). There the coupled Newton-Schulz iteration is quadratic from
Z = I and needs 1-4 n x n products per iteration; farther away one fp64 eigh is cheaper (measured:
from a cold start with cond(X) = 5 Newton-Schulz needs 12 iterations, 4.5x an eigh's time).
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


def inv_sqrt_near(N: torch.Tensor, tol: float = 0.0) -> torch.Tensor:
    """(N)^{-1/2} for symmetric positive definite N (..., n, n), in N's dtype.

    ``tol`` (default: 4 eps of the dtype) is the accuracy the Newton-Schulz branch iterates to;
    when some ||N - I||_F is not below ``NEAR`` (or not finite) the whole batch takes one eigh,
    with eigenvalues below n eps lambda_max (a rank-deficient N) mapped to 0.
    """
    n = N.shape[-1]
    eye = torch.eye(n, dtype=N.dtype, device=N.device)
    err = float(torch.linalg.matrix_norm(N - eye).max())  # >= ||N - I||_2; one host sync
    eps = max(tol, 4 * torch.finfo(N.dtype).eps)
    if err < NEAR:
        # Y_k -> N^{1/2}, Z_k -> N^{-1/2}; Y and Z are polynomials in N, so they commute
        Y, Z = N, eye.expand_as(N)
        for _ in range(ns_iterations(err, eps)):
            T = 1.5 * eye - 0.5 * (Z @ Y)
            Y, Z = Y @ T, T @ Z
        return 0.5 * (Z + Z.mT)
    e, V = torch.linalg.eigh(0.5 * (N + N.mT))
    e = e.clamp_min(0.0)
    floor = e[..., -1:] * (n * torch.finfo(N.dtype).eps)
    inv = torch.where(e > floor, e.clamp_min(torch.finfo(N.dtype).tiny).rsqrt(), 0.0)
    return (V * inv.unsqueeze(-2)) @ V.mT
