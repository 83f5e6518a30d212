"""p-SpheretNorm retraction against independent references (docs/science.md §2.7, items 1-4)."""

import math

import pytest
import torch

from workloads.geometry.sphere import (
    TAU,
    retract,
    sphere_coefficients,
    sphere_step,
    tangent,
    theta,
)

D = 64
PS = [0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 3.7, 8.0, 16.0, math.inf]


def _setup(n=12, d=D, dtype=torch.float64, seed=0):
    """h (n, d) with radius ~sqrt(d); xi (n, d) tangent, beta spread over [1e-3, 6]."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=dtype)
    z = tangent(torch.randn(n, d, generator=g, dtype=dtype), h)
    beta = torch.logspace(-3, math.log10(6), n, dtype=dtype).unsqueeze(-1)
    xi = z / z.norm(dim=-1, keepdim=True) * beta * h.norm(dim=-1, keepdim=True)
    return h, xi


def _rotation_ref(h, xi, p):
    """cos(theta) h + sin(theta) r xi/||xi|| with theta = p atan(beta/p): the unit-vector form."""
    r = h.norm(dim=-1, keepdim=True)
    n = xi.norm(dim=-1, keepdim=True)
    beta = n / r
    th = beta if math.isinf(p) else p * torch.atan(beta / p)
    return torch.cos(th) * h + torch.sin(th) * r * xi / n


def _omega(h, xi):
    r2 = (h * h).sum()
    return (torch.outer(xi, h) - torch.outer(h, xi)) / r2  # skew, Omega h = xi


def test_tangent_is_orthogonal_and_idempotent():
    h, _ = _setup()
    u = torch.randn_like(h)
    z = tangent(u, h)
    assert (z * h).sum(-1).abs().max() < 1e-12 * h.norm(dim=-1).max() ** 2
    assert torch.allclose(tangent(z, h), z, atol=1e-13)
    assert torch.allclose(tangent(3.0 * h, h), torch.zeros_like(h), atol=1e-13)


def test_p1_is_metric_projection():
    h, xi = _setup()
    r = h.norm(dim=-1, keepdim=True)
    ref = r * (h + xi) / (h + xi).norm(dim=-1, keepdim=True)
    assert (retract(h, xi, 1.0) - ref).abs().max() < 1e-13


def test_p2_is_cayley_map():
    h, xi = _setup()
    eye = torch.eye(D, dtype=h.dtype)
    out = retract(h, xi, 2.0)
    for i in range(h.shape[0]):
        om = _omega(h[i], xi[i])
        ref = torch.linalg.solve(eye - om / 2, (eye + om / 2) @ h[i])
        assert (out[i] - ref).abs().max() < 1e-12


def test_pinf_is_exponential_map():
    h, xi = _setup()
    out = retract(h, xi, math.inf)
    for i in range(h.shape[0]):
        ref = torch.linalg.matrix_exp(_omega(h[i], xi[i])) @ h[i]
        assert (out[i] - ref).abs().max() < 1e-12


def test_large_p_approaches_geonorm_and_small_p_identity():
    h, xi = _setup()
    # |theta_p - beta| <= beta^3 / (3 p^2): with beta <= 6 and r ~ 8 that is < 6e-10
    gap = (retract(h, xi, 1e6) - retract(h, xi, math.inf)).norm(dim=-1)
    bound = h.norm(dim=-1) * (xi.norm(dim=-1) / h.norm(dim=-1)) ** 3 / 3e12
    assert (gap <= bound * 1.001 + 1e-13).all() and gap.max() < 1e-9
    # theta_p < p pi / 2: the move is at most r p pi / 2 (r ~ 8 here)
    moved = (retract(h, xi, 1e-8) - h).norm(dim=-1) / h.norm(dim=-1)
    assert moved.max() < 1e-8 * math.pi / 2 * (1 + 1e-6)
    assert moved.max() > 1e-9  # it does move, by the saturated angle ~ p pi / 2


@pytest.mark.parametrize("p", PS)
def test_all_p_match_the_rotation_form(p):
    h, xi = _setup()
    assert (retract(h, xi, p) - _rotation_ref(h, xi, p)).abs().max() < 1e-12


def test_theta_is_increasing_in_p_and_saturates():
    beta2 = torch.tensor([0.01, 1.0, 25.0, 1e4], dtype=torch.float64)
    ordered = torch.stack([theta(beta2, p) for p in sorted(PS)])  # (len(PS), 4)
    assert (ordered.diff(dim=0) > 0).all()
    bound = torch.tensor([p * math.pi / 2 for p in sorted(PS)], dtype=torch.float64)
    assert (ordered[:-1, -1] < bound[:-1]).all()  # theta_p < p pi / 2 for finite p


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 3.0, math.inf])
def test_retraction_property(p):
    h, xi = _setup(n=4)
    xi = xi / xi.norm(dim=-1, keepdim=True)  # beta = t / r
    errs = []
    for t in (1e-2, 1e-3, 1e-4):
        errs.append(((retract(h, t * xi, p) - h) / t - xi).norm(dim=-1).max().item())
    assert errs[-1] < 1e-4
    assert errs[1] / errs[0] < 0.2 and errs[2] / errs[1] < 0.2  # error is O(t)


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 4.0, math.inf])
def test_norm_preserved_over_72_sublayers_fp32(p):
    g = torch.Generator().manual_seed(1)
    h = torch.randn(4, 16, 128, generator=g)
    h = h / h.norm(dim=-1, keepdim=True) * math.sqrt(128)
    r = h.norm(dim=-1)
    for k in range(1, 73):
        u = torch.randn(4, 16, 128, generator=g) * (0.1 + 3.0 * torch.rand(1, generator=g))
        h, _ = sphere_step(h, u, k**-0.5, p)
    assert ((h.double().norm(dim=-1) / r.double()) - 1).abs().max() < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.25, 1.0, 2.0, 3.0, 3.7, math.inf])
@pytest.mark.parametrize("case", ["parallel", "zero"])
def test_finite_values_and_grads_at_degenerate_updates(p, case, dtype):
    h = torch.randn(3, 5, 32, dtype=dtype, requires_grad=True)
    u = (2.5 * h.detach() if case == "parallel" else torch.zeros(3, 5, 32, dtype=dtype))
    u.requires_grad_(True)
    a = torch.tensor(0.7, dtype=dtype, requires_grad=True)
    out, beta2 = sphere_step(h, u, a, p)
    assert torch.isfinite(out).all() and torch.allclose(out, h, atol=1e-5)
    (out * torch.randn_like(out)).sum().backward()
    for t in (h, u, a):
        assert torch.isfinite(t.grad).all()


@pytest.mark.parametrize("p", [0.25, 0.5, 3.7, 16.0, math.inf])
def test_values_and_grads_continuous_across_tau(p):
    tau = TAU * min(1.0, p * p)
    b2 = torch.tensor([tau * (1 - 1e-9), tau * (1 + 1e-9)], dtype=torch.float64,
                      requires_grad=True)
    c, s = sphere_coefficients(b2, p)
    gc = torch.autograd.grad(c.sum(), b2, retain_graph=True)[0]
    gs = torch.autograd.grad(s.sum(), b2)[0]
    for v in (c, s, gc, gs):
        assert abs(v[0] - v[1]) < 1e-6
    # the Taylor branch itself agrees with the trig form (values, and d/dbeta2 analytically)
    x = torch.tensor([tau / 2], dtype=torch.float64, requires_grad=True)
    c, s = sphere_coefficients(x, p)
    b = math.sqrt(tau / 2)
    th = b if math.isinf(p) else p * math.atan(b / p)
    assert abs(c.item() - math.cos(th)) < 1e-13 and abs(s.item() - math.sin(th) / b) < 1e-13
    dth_db = 1.0 / (1.0 + (0.0 if math.isinf(p) else b * b / (p * p)))
    dc = -math.sin(th) * dth_db / (2 * b)
    (gx,) = torch.autograd.grad(c.sum(), x)
    assert abs(gx.item() - dc) < 1e-8


def test_retract_grads_continuous_through_tau():
    h, xi = _setup(n=1)
    r = h.norm()
    e = xi / xi.norm()
    w = torch.randn_like(h)
    grads = []
    for f in (1 - 1e-9, 1 + 1e-9):
        x = (e * r * math.sqrt(TAU * f)).requires_grad_(True)
        (retract(h, x, 3.7) * w).sum().backward()
        grads.append(x.grad)
    assert (grads[0] - grads[1]).abs().max() < 1e-6


def test_fp32_under_bf16_autocast():
    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 128)
    h = torch.randn(8, 16, 128)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        u = lin(torch.randn(8, 16, 128))  # bf16 branch output
        assert u.dtype == torch.bfloat16
        out, _ = sphere_step(h, u, 0.5, 1.0)
        out2 = retract(h, 0.5 * tangent(u.float(), h), 2.0)
    assert out.dtype == torch.float32 and out2.dtype == torch.float32
    for o in (out, out2):
        assert ((o.double().norm(dim=-1) / h.double().norm(dim=-1)) - 1).abs().max() < 1e-6
    ref, _ = sphere_step(h.double(), u.double(), 0.5, 1.0)
    assert (out.double() - ref).abs().max() < 1e-5
    # bf16 in, bf16 out, but computed in fp32: equals the rounded fp64 result
    hb, ub = h.bfloat16(), u.detach()
    outb, _ = sphere_step(hb, ub, 0.5, 1.0)
    refb, _ = sphere_step(hb.double(), ub.double(), 0.5, 1.0)
    assert outb.dtype == torch.bfloat16
    assert (outb.double() - refb.bfloat16().double()).abs().max() <= 2 ** -7 * refb.abs().max()


def test_rejects_bad_p():
    for p in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="p: must be"):
            sphere_coefficients(torch.zeros(2), p)
