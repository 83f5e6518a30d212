"""A direction the solver left above its tolerance, made feasible: the nearest tangent
direction to it (Frobenius), scaled into the unit ball; docs/science.md §3.2.5.

Why: square DGram's optimum is not a polar factor (X is singular there, docs/science.md
§3.2.1), so the smoothing path stops a rung short and the direction it forms stays ~1e-4..2e-4
from tangency (``fast``; 1e-5..3e-5 for ``exact``), with ||A||_2 up to 1 + 1e-6 from the fp32
products. Both are constraint violations of the step the optimizer applies. Restoring
feasibility after the solve costs a few n x n products and one spectral norm per matrix left
open, against the ~20 Newton passes that do not close the gap.

The constraint is linear in A: C(A) = P(W^T A + A^T W), with adjoint C*(Psi) = 2 W Psi for a
symmetric Psi = P(Psi). The nearest A' with C(A') = 0 is therefore A' = A - W Psi with

    P(M Psi + Psi M) = H = P(W^T A + A^T W),   M = W^T W,

an operator that is symmetric positive definite on P's symmetric range when M is. It is solved
by conjugate gradients preconditioned with its diagonal, d_i + d_j (d = diag M): exact in one
iteration when M is diagonal (Stiefel and DGram on their manifolds), a few more for a W off
it. Then A'' = A' / max(1, ||A'||_2): the condition is linear, so scaling keeps A' tangent
and puts it back in the unit ball. A' moves A by ||W Psi||_F, of the size of the residual it
removes, so the objective changes by as little (measured on captured square DGram batches:
the objective gap to the fp64 optimum and the direction error unchanged to 3 digits).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["restore_feasibility"]

Projector = Callable[[torch.Tensor], torch.Tensor]
CG_ITERS = 25  # a W on its manifold needs 1; an off-manifold W's operator is well conditioned
CG_RTOL = 1e-12  # relative to ||H||, in fp64 (fp32: its own eps)


def _sym(X: torch.Tensor) -> torch.Tensor:
    return 0.5 * (X + X.mT)


def _normal_step(M: torch.Tensor, H: torch.Tensor, P: Projector) -> torch.Tensor:
    """Psi = P(Psi), symmetric, with P(M Psi + Psi M) = H (batched preconditioned CG)."""
    d = torch.diagonal(M, dim1=-2, dim2=-1)
    den = (d.unsqueeze(-1) + d.unsqueeze(-2)).clamp_min(torch.finfo(M.dtype).tiny)

    def op(X: torch.Tensor) -> torch.Tensor:
        MX = M @ X
        return P(MX + MX.mT)  # M X + X M for symmetric X

    def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * b).sum((-2, -1), keepdim=True)

    rtol = max(CG_RTOL, 10 * torch.finfo(M.dtype).eps)
    stop = (rtol * torch.linalg.matrix_norm(H, keepdim=True)) ** 2
    X = P(H / den)
    R = H - op(X)
    Z = P(R / den)
    D, rz = Z, dot(R, Z)
    for _ in range(CG_ITERS):
        if not bool((dot(R, R) > stop).any()):
            break
        OD = op(D)
        a = rz / dot(D, OD).clamp_min(torch.finfo(M.dtype).tiny)
        X, R = X + a * D, R - a * OD
        Z = P(R / den)
        rz_new = dot(R, Z)
        D, rz = Z + (rz_new / rz.clamp_min(torch.finfo(M.dtype).tiny)) * D, rz_new
    return _sym(X)


def restore_feasibility(W: torch.Tensor, A: torch.Tensor, P: Projector, dtype: torch.dtype
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A'', s)`` for tall W, A (..., m, n): A'' = A' / max(1, s), A' the nearest direction
    to A with P(W^T A' + A'^T W) = 0 and s = ||A'||_2 (module docstring); the n x n work in
    ``dtype``, A'' in A's."""
    Wd, Ad = W.to(dtype), A.to(dtype)
    WA = Wd.mT @ Ad
    Psi = _normal_step(Wd.mT @ Wd, P(WA + WA.mT), P)
    Ap = Ad - Wd @ Psi
    s = torch.linalg.matrix_norm(Ap, ord=2)
    return (Ap / s.clamp_min(1.0)[..., None, None]).to(A.dtype), s
