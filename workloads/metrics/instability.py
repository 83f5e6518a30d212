"""Attention-instability metrics of docs/science.md §3.5: pure functions on weights and scores.

Scores are pre-softmax logits s_ij = q_i . k_j / sqrt(d_h), shape (B, nh, T, T), without the
causal mask (the contract of ``attn.scores``); the functions here apply it (keys j <= i).
Weights use the ``nn.Linear`` layout (out x in); constraint checks transpose wide to tall first,
as the manifold optimizers do (SCIENCE 3.2, 3.4).
"""

from __future__ import annotations

import math

import torch

from workloads.metrics.continuity import as_float

__all__ = [
    "split_qkv",
    "sigma_max",
    "head_logit_bound",
    "head_logit_bound_rope",
    "causal_probs",
    "logit_stats",
    "saturation_rows",
    "softmax_saturation",
    "attention_entropy",
    "softmax_jacobian_fro",
    "attention_stats",
    "to_tall",
    "stiefel_violation",
    "dgram_violation",
    "column_norm_spread",
]

_EPS = 1e-30


def split_qkv(c_attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPT's fused ``c_attn.weight`` (..., 3d, d), rows [Q; K; V] -> three (..., d, d) views."""
    d3 = c_attn.shape[-2]
    if d3 % 3:
        raise ValueError(f"c_attn: {d3} rows is not a multiple of 3")
    return tuple(c_attn.split(d3 // 3, dim=-2))  # type: ignore[return-value]


@torch.no_grad()
def sigma_max(W: torch.Tensor) -> torch.Tensor:
    """Exact spectral norm of a stack (..., m, n) -> (...)."""
    return torch.linalg.matrix_norm(as_float(W), ord=2)


def _heads(W: torch.Tensor, n_head: int) -> torch.Tensor:
    """(..., d, d) projection -> (..., nh, d_h, d) per-head row blocks."""
    d_out, d_in = W.shape[-2], W.shape[-1]
    if d_out % n_head:
        raise ValueError(f"n_head: {n_head} does not divide the {d_out} projection rows")
    return as_float(W).reshape(*W.shape[:-2], n_head, d_out // n_head, d_in)


@torch.no_grad()
def head_logit_bound(W_q: torch.Tensor, W_k: torch.Tensor, n_head: int) -> torch.Tensor:
    """kappa^h = sigma_max(W_Q^h^T W_K^h) / sqrt(d_h), so |s_ij| <= kappa ||x_i|| ||x_j||.

    (..., d, d) each -> (..., nh). Computed without the d x d product: with W_Q^h^T = Q_a R_a
    and W_K^h^T = Q_b R_b (thin QR), the nonzero singular values are those of R_a R_b^T
    (d_h x d_h). A strict bound only without RoPE and biases; see ``head_logit_bound_rope``.
    """
    A, B = _heads(W_q, n_head), _heads(W_k, n_head)
    d_h = A.shape[-2]
    Ra = torch.linalg.qr(A.mT)[1]
    Rb = torch.linalg.qr(B.mT)[1]
    return torch.linalg.matrix_norm(Ra @ Rb.mT, ord=2) / math.sqrt(d_h)


@torch.no_grad()
def head_logit_bound_rope(W_q: torch.Tensor, W_k: torch.Tensor, n_head: int) -> torch.Tensor:
    """sigma(W_Q^h) sigma(W_K^h) / sqrt(d_h): holds for any rotation of q and k (RoPE)."""
    A, B = _heads(W_q, n_head), _heads(W_k, n_head)
    d_h = A.shape[-2]
    return sigma_max(A) * sigma_max(B) / math.sqrt(d_h)


def _causal(T: int, device: torch.device) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


@torch.no_grad()
def causal_probs(scores: torch.Tensor) -> torch.Tensor:
    """Causal softmax in fp32/fp64: (B, nh, T, T) -> P with P_ij = 0 for j > i."""
    s = as_float(scores)
    mask = _causal(s.shape[-1], s.device)
    return s.masked_fill(~mask, float("-inf")).softmax(-1)


@torch.no_grad()
def logit_stats(scores: torch.Tensor) -> dict[str, torch.Tensor]:
    """Over causal entries j <= i: max |s|, RMS of s, mean row range max_j s_ij - mean_j s_ij."""
    s = as_float(scores)
    T = s.shape[-1]
    mask = _causal(T, s.device)
    count = mask.sum(-1).to(s.dtype)  # (T,) keys per row: i + 1
    sm = s.masked_fill(~mask, 0.0)
    max_abs = sm.abs().amax()
    rms = (sm.pow(2).sum() / (count.sum() * s[..., 0, 0].numel())).sqrt()
    row_max = s.masked_fill(~mask, float("-inf")).amax(-1)
    row_mean = sm.sum(-1) / count
    return {"max_abs": max_abs, "rms": rms, "row_range": (row_max - row_mean).mean()}


def saturation_rows(T: int, min_row: int | None = None) -> int:
    """First query row that counts: 16 when T >= 32, else 1 (row 0 has one key and p_max = 1)."""
    if min_row is not None:
        return min_row
    return 16 if T >= 32 else 1


@torch.no_grad()
def softmax_saturation(
    P: torch.Tensor, thresholds: tuple[float, ...] = (0.9, 0.99), min_row: int | None = None
) -> dict[float, torch.Tensor]:
    """Fraction of rows i >= min_row whose p_max = max_j P_ij exceeds each threshold."""
    i0 = saturation_rows(P.shape[-1], min_row)
    pmax = P[..., i0:, :].amax(-1)
    return {t: (pmax > t).to(P.dtype).mean() for t in thresholds}


@torch.no_grad()
def attention_entropy(P: torch.Tensor) -> torch.Tensor:
    """Per-head normalised entropy: mean over batch and rows i >= 1 of H_i / log(i + 1) -> (nh,).

    1 for uniform causal attention, 0 for one-hot rows.
    """
    T = P.shape[-1]
    H = -torch.special.xlogy(P, P).sum(-1)  # (B, nh, T)
    norm = torch.log(torch.arange(2, T + 1, device=P.device, dtype=P.dtype))  # log(i+1), i >= 1
    return (H[..., 1:] / norm).mean(dim=(0, 2))


@torch.no_grad()
def softmax_jacobian_fro(P: torch.Tensor, min_row: int | None = None) -> torch.Tensor:
    """Mean over rows i >= min_row of ||diag(p) - p p^T||_F.

    ||J||_F^2 = sum p^2 - 2 sum p^3 + (sum p^2)^2; tends to 0 as the softmax saturates.
    """
    i0 = saturation_rows(P.shape[-1], min_row)
    p = P[..., i0:, :]
    s2, s3 = p.pow(2).sum(-1), p.pow(3).sum(-1)
    return (s2 - 2 * s3 + s2 * s2).clamp_min(0).sqrt().mean()


@torch.no_grad()
def attention_stats(scores: torch.Tensor) -> dict[str, torch.Tensor]:
    """All per-layer score statistics of SCIENCE 3.5 items 3-6 as 0-d tensors."""
    out = logit_stats(scores)
    P = causal_probs(scores)
    sat = softmax_saturation(P)
    ent = attention_entropy(P)
    out.update(
        sat_0p9=sat[0.9],
        sat_0p99=sat[0.99],
        entropy_mean=ent.mean(),
        entropy_min=ent.min(),
        jacobian_fro=softmax_jacobian_fro(P),
    )
    return out


# --- constraint health (SCIENCE 3.5 item 1) ----------------------------------------------


def to_tall(W: torch.Tensor) -> torch.Tensor:
    """(..., m, n) -> tall (..., max, min) fp32/fp64: wide matrices are transposed."""
    W = as_float(W)
    return W.mT if W.shape[-2] < W.shape[-1] else W


@torch.no_grad()
def stiefel_violation(W: torch.Tensor) -> torch.Tensor:
    """||W^T W - I||_F / sqrt(n) in tall form (n = the smaller dimension)."""
    W = to_tall(W)
    n = W.shape[-1]
    G = W.mT @ W
    eye = torch.eye(n, dtype=W.dtype, device=W.device)
    return (G - eye).norm(dim=(-2, -1)) / math.sqrt(n)


@torch.no_grad()
def dgram_violation(W: torch.Tensor) -> torch.Tensor:
    """||Off(W^T W)||_F / ||W^T W||_F in tall form: 0 iff the columns are mutually orthogonal."""
    W = to_tall(W)
    G = W.mT @ W
    off = G - torch.diag_embed(G.diagonal(dim1=-2, dim2=-1))
    return off.norm(dim=(-2, -1)) / G.norm(dim=(-2, -1)).clamp_min(_EPS)


@torch.no_grad()
def column_norm_spread(W: torch.Tensor) -> torch.Tensor:
    """max_j d_j / min_j d_j with d_j the column norms in tall form (DGram's free scales)."""
    d = to_tall(W).norm(dim=-2)
    return d.amax(-1) / d.amin(-1).clamp_min(_EPS)
