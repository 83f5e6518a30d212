"""Inputs and checks shared by the SpheretNorm step tests (the eager Function in
test_sphere_fused.py, the C++ kernel in test_sphere_native.py): one definition of each case,
run against each implementation."""

from __future__ import annotations

import torch

__all__ = ["inputs", "check_degenerate_update"]


def inputs(scale: float, seed: int = 0, shape=(2, 3, 8), dtype=torch.float64):
    """``(h, u, a)``: a stream, an update of size ``scale`` relative to it, a step of 0.7."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(True)
    u = (scale * torch.randn(*shape, generator=g, dtype=dtype)).requires_grad_(True)
    a = torch.tensor(0.7, dtype=dtype, requires_grad=True)
    return h, u, a


def check_degenerate_update(step, p: float, case: str) -> None:
    """An update parallel to h, or zero, leaves h where it is, with finite gradients."""
    h = torch.randn(3, 5, 32, requires_grad=True)
    u = (2.5 * h.detach() if case == "parallel" else torch.zeros(3, 5, 32)).requires_grad_(True)
    a = torch.tensor(0.7, requires_grad=True)
    out, _ = step(h, u, a, p)
    assert torch.allclose(out, h, atol=1e-5)
    (out * torch.randn_like(out)).sum().backward()
    for t in (h, u, a):
        assert torch.isfinite(t.grad).all()
