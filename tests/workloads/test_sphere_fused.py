"""The fused SpheretNorm step (one autograd node, closed-form backward) against the reference
``sphere.sphere_step`` and its autograd, in fp64 (gradcheck) and under bf16 autocast.

The eager Function is tested through ``sphere_step_eager``, so these tests do not depend on
whether the compiled kernel is built on this machine (test_sphere_native.py tests it)."""

import math

import pytest
import torch
from sphere_cases import check_degenerate_update, inputs

from workloads.geometry.sphere import TAU, sphere_coefficients, sphere_step
from workloads.geometry.sphere_fused import coefficient_derivatives, sphere_step_eager

PS = [0.5, 1.0, 2.0, 3.0, 3.7, 8.0, math.inf]


def _inputs(scale, seed=0, shape=(2, 3, 8), dtype=torch.float64):
    return inputs(scale, seed, shape, dtype)


def _grads(fn, h, u, a, p, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(h.shape, generator=g, dtype=h.dtype)
    wb = torch.randn(h.shape[:-1] + (1,), generator=g, dtype=h.dtype)
    out, b = fn(h, u, a, p)
    grads = torch.autograd.grad((out * w).sum() + (b * wb).sum(), (h, u, a))
    return (out, b) + grads


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("scale", [1e-5, 0.05, 1.0, 5.0])  # 1e-5: beta^2 < tau (Taylor branch)
def test_values_and_grads_match_the_reference(p, scale):
    h, u, a = _inputs(scale)
    ref = _grads(sphere_step, h, u, a, p)
    got = _grads(sphere_step_eager, h, u, a, p)
    for name, x, y in zip(("out", "beta2", "dh", "du", "da"), got, ref):
        err = ((x - y).abs().max() / y.abs().max().clamp_min(1e-300)).item()
        assert err < 1e-12, (name, err)


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 3.0, 8.0, math.inf])
@pytest.mark.parametrize("scale", [1e-4, 1.0])
def test_gradcheck_fp64(p, scale):
    h, u, a = _inputs(scale, shape=(2, 2, 5))
    assert torch.autograd.gradcheck(lambda *t: sphere_step_eager(*t, p), (h, u, a))


def test_gradcheck_near_tau_and_at_tiny_steps():
    """beta^2 just below and above tau, and a ~ 1e-7: the Taylor branch and its seam."""
    for p in (0.5, 3.7, math.inf):
        tau = TAU * min(1.0, p * p)
        for f in (0.5, 2.0):
            h, u, a = _inputs(1.0, seed=3, shape=(1, 6))
            with torch.no_grad():
                z = u - (u * h).sum() / (h * h).sum() * h
                a.copy_(math.sqrt(f * tau) * h.norm() / z.norm())
            _, b = sphere_step_eager(h, u, a, p)
            assert (b.item() < tau) == (f < 1)
            assert torch.autograd.gradcheck(lambda *t, p=p: sphere_step_eager(*t, p), (h, u, a))
    h, u, a = _inputs(1.0, seed=4)
    a = torch.tensor(1e-7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: sphere_step_eager(*t, 1.0), (h, u, a))


@pytest.mark.parametrize("p", PS)
def test_coefficient_derivatives_match_autograd(p):
    tau = TAU * min(1.0, p * p)
    b = torch.tensor([0.0, tau / 3, tau * 3, 0.01, 0.7, 4.0, 50.0], dtype=torch.float64,
                     requires_grad=True)
    c, s = sphere_coefficients(b, p)
    dc_ref = torch.autograd.grad(c.sum(), b, retain_graph=True)[0]
    ds_ref = torch.autograd.grad(s.sum(), b)[0]
    dc, ds = coefficient_derivatives(b.detach(), c.detach(), s.detach(), p)
    assert torch.allclose(dc, dc_ref, rtol=1e-9, atol=1e-12)
    assert torch.allclose(ds, ds_ref, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("p", [1.0, 2.0, math.inf])
@pytest.mark.parametrize("case", ["parallel", "zero"])
def test_degenerate_updates_give_h_and_finite_grads(p, case):
    check_degenerate_update(sphere_step_eager, p, case)


def test_bf16_autocast_fp32_inside_and_dtypes_kept():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64)
    h = torch.randn(4, 8, 64, requires_grad=True)
    a = torch.tensor(0.5, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        u = lin(torch.randn(4, 8, 64))
        assert u.dtype == torch.bfloat16
        out, b = sphere_step_eager(h, u, a, 1.0)
        ref, bref = sphere_step(h, u, a, 1.0)
    assert out.dtype == torch.float32 and b.dtype == torch.float32
    assert (out - ref).abs().max() < 1e-5 and (b - bref).abs().max() < 1e-5
    assert ((out.double().norm(dim=-1) / h.double().norm(dim=-1)) - 1).abs().max() < 1e-6
    out.sum().backward()
    assert lin.weight.grad.dtype == torch.float32 and h.grad.dtype == torch.float32
    assert torch.isfinite(lin.weight.grad).all()
    hb = h.detach().bfloat16().requires_grad_(True)
    ub = u.detach().requires_grad_(True)
    outb, _ = sphere_step_eager(hb, ub, 0.5, 2.0)
    outb.float().sum().backward()
    assert outb.dtype == hb.grad.dtype == ub.grad.dtype == torch.bfloat16


def test_python_float_alpha_and_non_scalar_alpha_fallback():
    h, u, _ = _inputs(1.0)
    out, _ = sphere_step_eager(h, u, 0.3, 2.0)
    ref, _ = sphere_step(h, u, 0.3, 2.0)
    assert torch.allclose(out, ref, atol=1e-14)
    a = torch.full((2, 3, 1), 0.3, dtype=torch.float64)  # per-token steps: the reference path
    out, _ = sphere_step_eager(h, u, a, 2.0)
    assert torch.allclose(out, ref, atol=1e-14)
    with pytest.raises(ValueError, match="p: must be"):
        sphere_step_eager(h, u, 0.3, 0.0)


def test_compiled_stream_uses_the_reference_step(monkeypatch):
    """torch.compile traces sphere.sphere_step, not the custom Function (miscompiled on CUDA)."""
    from workloads import residual as R
    from workloads.geometry import sphere

    calls = []

    def spy(*a, **k):
        calls.append(1)
        return sphere.sphere_step(*a, **k)

    monkeypatch.setattr(R, "sphere_step", spy)
    stream = R.make_stream({"family": "spheret", "p": 1.0}, 8, 1)
    h = stream.enter(torch.randn(2, 3, 8))
    stream.sublayer(0, h, lambda x: x.flip(-1))
    assert calls == []  # eager: the fused Function
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    stream.sublayer(0, h, lambda x: x.flip(-1))
    assert calls == [1]
