"""Residual families: parameter validation and each sublayer against its formula (SCIENCE 2.6)."""

import math

import pytest
import torch
import torch.nn.functional as F

from workloads.config import ConfigError
from workloads.residual import (
    RESIDUALS,
    GeoNormParams,
    KeelParams,
    PreLNParams,
    SpheretParams,
    family_params,
    make_stream,
)

D, L = 32, 3


def _branch(seed):
    """A fixed random nonlinear branch (B, T, D) -> (B, T, D)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(D, D, generator=g, dtype=torch.float64) / math.sqrt(D)
    return lambda x: torch.tanh(x @ w.T) * 3.0


def _x(seed=0):
    return torch.randn(2, 5, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _stream(res, norm="layernorm", bias=False):
    s = make_stream(res, D, L, norm, bias).double()
    if hasattr(s, "s"):  # redo the fp32 init in fp64 so the formulas hold to 1e-10
        with torch.no_grad():
            s.s.fill_(math.log(math.e - 1.0))
            s.g.fill_(math.sqrt(D))
    return s


def _ln(x):
    return F.layer_norm(x, (D,), eps=1e-5)


def _rms(x, eps=1e-6):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


# --- parameters ---------------------------------------------------------------------------


def test_family_params_defaults_and_coercion():
    assert family_params({"family": "pre_ln"}) == PreLNParams()
    sp = family_params({"family": "spheret"})
    assert sp == SpheretParams(p=1.0, decay="sublayer", radius="learnable", inner_norm="none",
                               guard=False)
    assert family_params({"family": "spheret", "p": "inf"}).p == math.inf
    assert family_params({"family": "spheret", "p": float("inf")}).p == math.inf
    assert family_params({"family": "spheret", "p": 2}).p == 2.0
    assert isinstance(family_params({"family": "geonorm", "guard": True}), GeoNormParams)
    assert family_params({"family": "keel", "alpha": "2L"}) == KeelParams(alpha="2L")
    assert family_params({"family": "peri_ln", "embed_ln": True}).embed_ln is True


@pytest.mark.parametrize("bad, match", [
    ({"family": "layer_norm"}, r"model\.residual\.family: 'layer_norm' is not one of pre_ln, "),
    ({"p": 1.0}, r"model\.residual\.family: None"),
    ({"family": ["spheret"]}, r"model\.residual\.family: \['spheret'\] is not one of"),
    ({"family": "pre_ln", "p": 1.0}, r"model\.residual\.p: not a parameter .*valid: \(none\)"),
    ({"family": "geonorm", "p": 1.0}, r"model\.residual\.p: not a parameter .*valid: decay"),
    ({"family": "spheret", "q": 1.0}, r"model\.residual\.q: .*valid: decay, radius"),
    ({"family": "spheret", "p": 0}, r"model\.residual\.p: must be > 0"),
    ({"family": "spheret", "p": -2.0}, r"model\.residual\.p: must be > 0"),
    ({"family": "spheret", "p": "one"}, r"model\.residual\.p: expected a number"),
    ({"family": "spheret", "decay": "layer"}, r"model\.residual\.decay: 'layer' is not one of"),
    ({"family": "spheret", "guard": 1}, r"model\.residual\.guard: expected true/false"),
    ({"family": "keel", "alpha": 0}, r"model\.residual\.alpha: must be 'L', '2L' or a number"),
    ("spheret", r"model\.residual: expected a mapping"),
])
def test_family_params_errors_are_one_line(bad, match):
    with pytest.raises(ConfigError, match=match) as e:
        family_params(bad)
    assert "\n" not in str(e.value)


def test_make_stream_rejects_unknown_norm():
    with pytest.raises(ConfigError, match="norm: 'batchnorm' is not one of layernorm, rmsnorm"):
        make_stream({"family": "pre_ln"}, D, L, "batchnorm")


# --- wiring per family --------------------------------------------------------------------


def _run(stream, x0, branches):
    h = stream.enter(x0)
    for k, f in enumerate(branches):
        h = stream.sublayer(k, h, f)
    return h, stream.exit(h)


def _ref(family, x0, branches, alpha_keel=L):
    """Independent re-statement of each family's update at init (gains 1, biases 0)."""
    h = x0
    if family == "pre_dyt":
        h = math.sqrt(D) * x0
    if family in ("spheret", "geonorm"):
        h = math.sqrt(D) * x0 / (x0.norm(dim=-1, keepdim=True) + 1e-6)
    for k, f in enumerate(branches):
        if family == "pre_ln":
            h = h + f(_ln(h))
        elif family == "post_ln":
            h = _ln(h + f(h))
        elif family == "peri_ln":
            h = h + _ln(f(_ln(h)))
        elif family == "pre_dyt":
            h = h + f(torch.tanh((1.0 if k % 2 == 0 else 0.5) * h))
        elif family == "keel":
            h = _rms(alpha_keel * h + f(_rms(h)))
        else:
            u = f(h)
            r = h.norm(dim=-1, keepdim=True)
            z = u - (u * h).sum(-1, keepdim=True) / r**2 * h
            xi = z / math.sqrt(k + 1)
            if family == "spheret":  # p = 1: metric projection
                h = r * (h + xi) / (h + xi).norm(dim=-1, keepdim=True)
            else:  # exponential map
                n = xi.norm(dim=-1, keepdim=True)
                h = torch.cos(n / r) * h + torch.sin(n / r) * r * xi / n
    out = torch.tanh(0.5 * h) if family == "pre_dyt" else _ln(h)
    return h, out


@pytest.mark.parametrize("family", list(RESIDUALS))
def test_family_matches_its_formula(family):
    branches = [_branch(k) for k in range(2 * L)]
    x0 = _x()
    h, out = _run(_stream({"family": family}), x0, branches)
    h_ref, out_ref = _ref(family, x0, branches)
    assert torch.allclose(h, h_ref, atol=1e-10), (h - h_ref).abs().max()
    assert torch.allclose(out, out_ref, atol=1e-10)


def test_keel_alpha_2l_and_rmsnorm_variant():
    branches = [_branch(k) for k in range(2 * L)]
    x0 = _x()
    h, _ = _run(_stream({"family": "keel", "alpha": "2L"}, norm="rmsnorm"), x0, branches)
    assert torch.allclose(h, _ref("keel", x0, branches, alpha_keel=2 * L)[0], atol=1e-10)
    _, out = _run(_stream({"family": "pre_ln"}, norm="rmsnorm"), x0, branches)
    h_ref, _ = _ref("pre_ln", x0, branches)  # reference uses LN for the pre-norm: differ
    assert not torch.allclose(out, _ln(h_ref), atol=1e-3)
    assert torch.allclose(out.pow(2).mean(-1), torch.ones(2, 5, dtype=out.dtype), atol=1e-5)


def test_peri_ln_embedding_norm_and_bias():
    s = _stream({"family": "peri_ln", "embed_ln": True}, bias=True)
    x0 = _x() * 5 + 3
    assert torch.allclose(s.enter(x0), _ln(x0), atol=1e-10)
    names = {n for n, _ in s.named_parameters()}
    assert {"ln_emb.weight", "ln_emb.bias", "ln_in.0.bias", "ln_out.5.weight"} <= names


@pytest.mark.parametrize("decay, lam", [
    ("sublayer", [1 / math.sqrt(k) for k in range(1, 7)]),
    ("block", [1.0, 1.0, 2**-0.5, 2**-0.5, 3**-0.5, 3**-0.5]),
    ("none", [1.0] * 6),
])
def test_spheret_step_decay(decay, lam):
    s = _stream({"family": "spheret", "decay": decay})
    assert torch.allclose(s.step_sizes(), torch.tensor(lam, dtype=torch.float64), atol=1e-7)


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, math.inf])
def test_spheret_keeps_radius_and_records_stats(p):
    s = _stream({"family": "spheret", "p": p, "inner_norm": "rmsnorm"})
    with torch.no_grad():
        s.g.fill_(3.0)
    s.record_stats = True
    branches = [_branch(k) for k in range(2 * L)]
    h, _ = _run(s, _x(), branches)
    assert torch.allclose(h.norm(dim=-1), torch.full((2, 5), 3.0, dtype=h.dtype), atol=1e-10)
    st = s.stats()
    assert st["radius"] == 3.0 and st["norm_err"] < 1e-12
    assert abs(st["a/3"] - 0.5) < 1e-7
    assert all(math.isfinite(v) for v in st.values())
    assert 0 < st["theta_mean/0"] and st["theta_mean/0"] <= st["beta_mean/0"] + 1e-12
    assert {f"theta_p95/{k}" for k in range(2 * L)} <= set(st)


def test_spheret_radius_fixed_and_guard():
    s = _stream({"family": "spheret", "radius": "fixed", "guard": True})
    assert "g" not in dict(s.named_parameters()) and "g" in dict(s.named_buffers())
    s2 = _stream({"family": "spheret"})
    assert dict(s2.named_parameters())["g"].requires_grad
    branches = [_branch(k) for k in range(2 * L)]
    x0 = _x()
    assert torch.allclose(_run(s, x0, branches)[0], _run(s2, x0, branches)[0], atol=1e-10)


def test_stats_are_cheap_and_off_by_default():
    s = _stream({"family": "pre_ln"})
    _run(s, _x(), [_branch(k) for k in range(2 * L)])
    assert s.stats() == {}
    s.record_stats = True
    h, _ = _run(s, _x(), [_branch(k) for k in range(2 * L)])
    assert abs(s.stats()[f"h_norm/{2 * L - 1}"] - h.norm(dim=-1).mean().item()) < 1e-9
    sp = _stream({"family": "spheret", "decay": "none"})
    _run(sp, _x(), [_branch(k) for k in range(2 * L)])
    want = {"radius": math.sqrt(D), **{f"a/{k}": 1.0 for k in range(2 * L)}}
    assert sp.stats().keys() == want.keys()
    assert all(abs(sp.stats()[k] - v) < 1e-9 for k, v in want.items())


def test_dyt_parameters_and_embed_scale():
    s = _stream({"family": "pre_dyt", "alpha_attn": 2.0, "embed_scale": False})
    assert s.embed_scale is None
    assert [m.alpha.item() for m in s.dyt[:2]] == [2.0, 0.5] and s.ln_f.alpha.item() == 0.5
    x0 = _x()
    assert torch.equal(s.enter(x0), x0)


def test_spheret_step_sizes_once_per_forward_match_per_sublayer():
    """enter() forms every a_k of the forward at once; a sublayer called without enter (or
    after exit) forms its own. Both give the same values and gradients, and exit drops the
    forward's a_k so no later call reuses a freed graph."""
    branches = [_branch(k) for k in range(2 * L)]
    x0 = _x()
    s = _stream({"family": "spheret", "p": 2.0})
    with torch.no_grad():
        s.s.copy_(torch.linspace(-1.0, 1.0, 2 * L, dtype=torch.float64))
    h, out = _run(s, x0, branches)
    assert s._a is None
    (out * out).sum().backward()
    grad_cached = s.s.grad.clone()
    s.s.grad = None
    h2 = s.enter(x0)
    s._a = None  # the per-sublayer form
    for k, f in enumerate(branches):
        h2 = s.sublayer(k, h2, f)
    (s.exit(h2) ** 2).sum().backward()
    assert torch.allclose(h, h2, atol=1e-12)
    assert torch.allclose(grad_cached, s.s.grad, rtol=1e-10, atol=1e-14)
    assert grad_cached.abs().min() > 0


@pytest.mark.parametrize("family", ["spheret", "geonorm"])
@pytest.mark.parametrize("alpha_init", [1.0, 0.05])
def test_alpha_init_sets_the_first_step_sizes(family, alpha_init):
    s = make_stream({"family": family, "alpha_init": alpha_init}, D, L).double()
    lam = torch.tensor([k**-0.5 for k in range(1, 2 * L + 1)], dtype=torch.float64)
    assert torch.allclose(s.step_sizes(), alpha_init * lam, rtol=1e-6)


def test_alpha_lr_mult_is_an_adam_lr_multiplier_for_the_step_sizes_only():
    """Same init, same loss: one Adam step (eps 0: the step is lr x sign(g) whatever the
    gradient's scale) moves m*s, the argument of the softplus, m times as far."""
    moved = {}
    for m in (1.0, 10.0):
        s = make_stream({"family": "spheret", "alpha_init": 0.05, "alpha_lr_mult": m}, D, L)
        s = s.double()
        assert torch.allclose(s.step_sizes()[0], torch.tensor(0.05, dtype=torch.float64))
        opt = torch.optim.Adam([s.s], lr=1e-4, eps=1e-30)
        _, out = _run(s, _x(), [_branch(k) for k in range(2 * L)])
        (out * out).sum().backward()
        before = m * s.s.detach().clone()
        opt.step()
        moved[m] = (m * s.s.detach() - before).abs()
    ratio = moved[10.0] / moved[1.0]
    assert torch.allclose(ratio, torch.full_like(ratio, 10.0), rtol=1e-9)


@pytest.mark.parametrize("bad", [{"alpha_init": 0.0}, {"alpha_init": -1.0},
                                 {"alpha_lr_mult": 0}, {"alpha_init": "inf"}])
def test_alpha_params_refuse_non_positive_or_infinite(bad):
    key = next(iter(bad))
    with pytest.raises(ConfigError, match=rf"model\.residual\.{key}: must be a finite number > 0"):
        family_params({"family": "spheret", **bad})


def test_saturation_control_summarises_beta_and_gives_rows():
    s = _stream({"family": "spheret", "p": 1.0})
    s.record_stats = True
    _run(s, _x(), [_branch(k) for k in range(2 * L)])
    st = s.stats()
    per = [st[f"beta_mean/{k}"] for k in range(2 * L)]
    assert st["beta_mean_max"] == max(per)
    assert st["frac_beta_gt_half_pi_max"] == max(st[f"frac_beta_gt_half_pi/{k}"]
                                                  for k in range(2 * L))
    rows = s.step_rows(40)
    assert len(rows) == 2 * 2 * L and {r["module"] for r in rows} == {"stream"}
    beta = {r["layer"]: r["value"] for r in rows if r["metric"] == "stream.beta_mean"}
    assert [beta[k] for k in range(2 * L)] == pytest.approx(per)
    assert _stream({"family": "spheret"}).step_rows(1) == []  # nothing recorded yet
