"""The matrix sign (polar factor) ``msign(X) = U V^T``; docs/science.md §3.1.

Three backends, chosen by name (``MSIGN_METHODS``):

- ``polar_express``: the Polar Express iteration (arXiv 2505.16932) with the per-step coefficient
  table and the 1.01 safety scaling used by Paper B and the Thinking Machines code;
- ``ns5``: Keller Jordan's quintic Newton-Schulz (singular values land in ~[0.7, 1.2], not 1);
- ``svd``: the exact polar factor from ``torch.linalg.svd`` (the reference);
- ``gram``: the exact polar factor X (X^T X)^{-1/2} from one fp64 eigh of the small Gram (on
  CPU far cheaper than 12 Polar Express steps on the tall matrix, or its SVD, when one side is
  small; columns are normalised first, so the Gram is as well conditioned as X's directions).

The iterations run in bf16 on CUDA (as both reference codes do) and in fp32 on CPU; an fp64
input on CPU stays fp64 so tests can compare against an fp64 SVD.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = [
    "MSIGN_METHODS",
    "POLAR_EXPRESS_COEFFS",
    "NS5_COEFFS",
    "msign",
    "msign_polar_express",
    "msign_ns5",
    "msign_svd",
    "msign_gram",
    "polar_gram",
]

# (a, b, c) of p(x) = a x + b x^3 + c x^5 per step; steps after the 8th reuse the last triple.
_PE_RAW = [
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
]
# Safety scaling p(x) -> p(x / 1.01) on every triple but the last, which must keep p(1) = 1.
POLAR_EXPRESS_COEFFS: list[tuple[float, float, float]] = [
    (a / 1.01, b / 1.01**3, c / 1.01**5) for a, b, c in _PE_RAW[:-1]
] + [_PE_RAW[-1]]
NS5_COEFFS = (3.4445, -4.7750, 2.0315)

# Paper B runs 10 Polar Express steps in bf16. In fp32/fp64 two more steps of the last triple
# (15/8 x - 10/8 x^3 + 3/8 x^5, third-order convergent at 1) bring ill-conditioned inputs
# (cond ~3e3, a square 768 x 768 Gaussian) from 2e-2 to <1e-3 relative error against the SVD.
_PE_STEPS_BF16 = 10
_PE_STEPS_FULL = 12
_NS5_STEPS = 5


def _work_dtype(X: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    if X.is_cuda:
        return torch.bfloat16
    return torch.float64 if X.dtype == torch.float64 else torch.float32


def _wide(X: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Transpose so rows <= cols: the Gram X X^T is then the smaller square."""
    transposed = X.shape[-2] > X.shape[-1]
    return (X.mT if transposed else X), transposed


def msign_polar_express(
    X: torch.Tensor, steps: int | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Polar Express: X <- (a I + (b I + c S) S) X with S = X X^T; X: (..., m, n)."""
    wd = _work_dtype(X, dtype)
    if steps is None:
        steps = _PE_STEPS_BF16 if wd in (torch.bfloat16, torch.float16) else _PE_STEPS_FULL
    x, transposed = _wide(X.to(wd))
    # 1.01 ||X||_F >= 1.01 sigma_max, so every singular value starts inside (0, 1).
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * 1.01)
    for k in range(steps):
        a, b, c = POLAR_EXPRESS_COEFFS[min(k, len(POLAR_EXPRESS_COEFFS) - 1)]
        s = x @ x.mT  # (..., r, r), r = min(m, n)
        y = c * s
        y.diagonal(dim1=-2, dim2=-1).add_(b)
        y = y @ s
        y.diagonal(dim1=-2, dim2=-1).add_(a)
        x = y @ x
    if transposed:
        x = x.mT
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0).to(X.dtype)


def msign_ns5(
    X: torch.Tensor, steps: int | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Keller Jordan's NS5: X <- a X + (b A + c A^2) X with A = X X^T; X: (..., m, n)."""
    steps = _NS5_STEPS if steps is None else steps
    a, b, c = NS5_COEFFS
    x, transposed = _wide(X.to(_work_dtype(X, dtype)))
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        s = x @ x.mT
        x = a * x + (b * s + c * s @ s) @ x
    if transposed:
        x = x.mT
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0).to(X.dtype)


def msign_svd(
    X: torch.Tensor, steps: int | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Exact polar factor U V^T (thin SVD in fp32, or fp64 for fp64 input); X: (..., m, n)."""
    wd = torch.float64 if X.dtype == torch.float64 or dtype == torch.float64 else torch.float32
    # A matrix with a non-finite entry maps to 0, as the iterations' NaN -> 0 gives.
    finite = torch.isfinite(X).all(dim=-1, keepdim=True).all(dim=-2, keepdim=True)
    U, S, Vh = torch.linalg.svd(torch.where(finite, X, 0).to(wd), full_matrices=False)
    # Zero singular values stay zero (msign(0) = 0).
    tol = S[..., :1] * max(X.shape[-2:]) * torch.finfo(wd).eps
    keep = (S > tol).to(wd) * finite.squeeze(-1).to(wd)
    return torch.nan_to_num((U * keep.unsqueeze(-2)) @ Vh, nan=0.0).to(X.dtype)


def polar_gram(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Polar factor and singular values (ascending) of tall X (..., m, n), m >= n, from one
    fp64 eigh of the n x n Gram; singular values below ~sqrt(n eps) sigma_max map to 0.

    The Gram of the unit-column X~ = X D^{-1} is formed in X's dtype and N = D (X~^T X~) D in
    fp64: a column rescaling (DGram's free column norms) costs no accuracy, only the columns'
    directions' conditioning is squared.
    """
    d = torch.linalg.vector_norm(X, dim=-2, keepdim=True)  # (..., 1, n)
    d = torch.where(d > 0, d, 1.0)
    Xn = X / d
    dd = d.to(torch.float64).mT  # (..., n, 1)
    N = dd * (Xn.mT @ Xn).to(torch.float64) * dd.mT
    e, V = torch.linalg.eigh(0.5 * (N + N.mT))
    e = e.clamp_min(0.0)
    e = torch.where(e > e[..., -1:] * (e.shape[-1] * 1e-15), e, 0.0)
    s = e.sqrt()
    inv = torch.where(s > 0, 1.0 / s.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    R = (V * inv.unsqueeze(-2)) @ V.mT
    return X @ R.to(X.dtype), s


def msign_gram(
    X: torch.Tensor, steps: int | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Exact polar factor from the small side's Gram (``polar_gram``); X: (..., m, n)."""
    wide = X.shape[-2] < X.shape[-1]
    x = X.mT if wide else X  # tall: its Gram is the small square
    finite = torch.isfinite(x).all(dim=-1, keepdim=True).all(dim=-2, keepdim=True)
    P, _ = polar_gram(torch.where(finite, x, 0))
    P = torch.nan_to_num(P, nan=0.0, posinf=0.0, neginf=0.0)
    return (P.mT if wide else P).to(X.dtype)


MSIGN_METHODS: dict[str, Callable[..., torch.Tensor]] = {
    "polar_express": msign_polar_express,
    "ns5": msign_ns5,
    "svd": msign_svd,
    "gram": msign_gram,
}


def msign(
    X: torch.Tensor,
    method: str = "polar_express",
    steps: int | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The polar factor of ``X`` (..., m, n), same shape and dtype as ``X``.

    ``steps=None`` takes the method's default (Polar Express: 10 in bf16, 12 in fp32/fp64;
    NS5: 5). ``dtype=None`` iterates in bf16 on CUDA and fp32 (fp64 for fp64 input) on CPU.
    NaNs (e.g. from an all-zero input) are replaced by 0.
    """
    if method not in MSIGN_METHODS:
        raise ValueError(f"msign method {method!r} is not one of {', '.join(MSIGN_METHODS)}")
    if X.ndim < 2:
        raise ValueError(f"msign needs a (..., m, n) tensor, got shape {tuple(X.shape)}")
    return MSIGN_METHODS[method](X, steps=steps, dtype=dtype)
