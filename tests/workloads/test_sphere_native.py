"""The compiled SpheretNorm kernel (``sphere_native``, ``sphere_step.cpp``) against the reference
``sphere.sphere_step`` and its autograd in fp64 for every kind of p, its fallbacks, its switch
and its determinism.

The first test of a machine builds the kernel unless ``.ci/install`` has (a C++ compiler,
~30-60 s; cached afterwards). Tests that change the switch do it on a copy of the module's
state, so the order of tests does not matter."""

import math
import subprocess
import sys
import warnings

import pytest
import torch
from sphere_cases import check_degenerate_update, inputs

from workloads.geometry import sphere_native
from workloads.geometry.sphere import sphere_step
from workloads.geometry.sphere_fused import sphere_step_eager, sphere_step_fused

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def native():
    if not sphere_native.load():
        pytest.skip("no C++ toolchain to build the SpheretNorm kernel")
    return lambda h, u, a, p=1.0: sphere_native.sphere_step_native(h, u, a, p)


@pytest.fixture
def enabled(native, monkeypatch):
    monkeypatch.setitem(sphere_native._state, "mode", "on")
    return native


def _fresh(monkeypatch, mode):
    """A process that has not looked for the kernel yet, in the given mode."""
    st = {"mode": mode, "ops": None, "failed": False, "build_s": None, "checked": False}
    monkeypatch.setattr(sphere_native, "_state", st)
    return st


def _inputs(scale, seed=0, shape=(2, 3, 13), dtype=torch.float64):
    return inputs(scale, seed, shape, dtype)


def _grads(fn, h, u, a, seed=1, with_b=True):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(h.shape, generator=g, dtype=torch.float64)  # the same draws for any dtype
    wb = torch.randn(h.shape[:-1] + (1,), generator=g, dtype=torch.float64)
    out, b = fn(h, u, a)
    w, wb = w.to(out.dtype), wb.to(b.dtype)
    loss = (out * w).sum() + ((b * wb).sum() if with_b else 0)
    return (out, b) + torch.autograd.grad(loss, (h, u, a))


def _rel(x, y):
    return ((x - y).abs().max() / y.abs().max().clamp_min(1e-300)).item()


# Every branch of the coefficients: p = 1 and 2 (closed forms), 3, 4, 8 (rational), 0.5, 3.7,
# 9 and inf (trig above tau, Taylor below: scale 1e-5 puts beta^2 below tau).
PS = [0.5, 1.0, 2.0, 3.0, 3.7, 4.0, 8.0, 9.0, math.inf]


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("shape", [(2, 3, 13), (5, 64), (7, 3)])
@pytest.mark.parametrize("scale", [1e-5, 0.05, 1.0, 5.0])
@pytest.mark.parametrize("with_b", [True, False])  # dL/dbeta^2 given, or not (the usual case)
def test_values_and_grads_match_the_reference_fp64(native, p, shape, scale, with_b):
    h, u, a = _inputs(scale, shape=shape)
    ref = _grads(lambda *t: sphere_step(*t, p), h, u, a, with_b=with_b)
    got = _grads(lambda *t: native(*t, p), h, u, a, with_b=with_b)
    for name, x, y in zip(("out", "beta2", "dh", "du", "da"), got, ref):
        assert x.shape == y.shape and x.dtype == y.dtype, name
        assert _rel(x, y) < 1e-12, (name, _rel(x, y))


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 3.0, 3.7, math.inf])
@pytest.mark.parametrize("scale", [1e-4, 1.0])
def test_gradcheck_fp64(native, p, scale):
    h, u, a = _inputs(scale, shape=(2, 2, 5))
    assert torch.autograd.gradcheck(lambda *t: native(*t, p), (h, u, a))


@pytest.mark.parametrize("p", [0.5, 3.7, math.inf])
@pytest.mark.parametrize("f", [0.5, 2.0])
def test_gradcheck_at_the_taylor_seam(native, p, f):
    """beta^2 just below and above tau: the kernel takes the same branch as the reference."""
    tau = 1e-6 * min(1.0, p * p)
    h, u, a = _inputs(1.0, seed=3, shape=(1, 6))
    with torch.no_grad():
        z = u - (u * h).sum() / (h * h).sum() * h
        a.copy_(math.sqrt(f * tau) * h.norm() / z.norm())
    _, b = native(h, u, a, p)
    assert (b.item() < tau) == (f < 1)
    assert torch.autograd.gradcheck(lambda *t: native(*t, p), (h, u, a))


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 3.0, math.inf])
def test_fused_step_with_the_kernel_enabled_matches_the_reference(enabled, p):
    """Enabled, sphere_step_fused takes the kernel for every p; every p stays exact."""
    h, u, a = _inputs(1.0)
    ref = _grads(lambda *t: sphere_step(*t, p), h, u, a)
    got = _grads(lambda *t: sphere_step_fused(*t, p), h, u, a)
    for name, x, y in zip(("out", "beta2", "dh", "du", "da"), got, ref):
        assert _rel(x, y) < 1e-12, (p, name, _rel(x, y))
    node = sphere_step_fused(h, u, a, p)[0].grad_fn.name()
    assert "NativeSphereStep" in node, node


@pytest.mark.parametrize("p", [1.0, 0.5, math.inf])
def test_fp32_and_bf16_inputs(native, p):
    h, u, a = _inputs(1.0, shape=(4, 8, 64))
    ref = _grads(lambda *t: native(*t, p), h, u, a)
    h32, u32, a32 = (t.detach().float().requires_grad_(True) for t in (h, u, a))
    got = _grads(lambda *t: native(*t, p), h32, u32, a32)
    for x, y in zip(got, ref):
        assert x.dtype == torch.float32 and _rel(x.double(), y) < 1e-5
    hb, ub = (t.detach().bfloat16().requires_grad_(True) for t in (h, u))
    out, b = native(hb, ub, a32)
    assert out.dtype == torch.bfloat16 and b.dtype == torch.float32
    out.float().sum().backward()
    assert hb.grad.dtype == ub.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("p", [1.0, 2.0, 3.7, math.inf])
@pytest.mark.parametrize("case", ["parallel", "zero"])
def test_degenerate_updates_give_h_and_finite_grads(native, case, p):
    check_degenerate_update(native, p, case)


def test_non_contiguous_inputs_partial_grads_and_no_grad_modes(native):
    h, u, a = _inputs(1.0, shape=(4, 6, 10))
    ht, ut = h.transpose(0, 1), u.transpose(0, 1)  # (6, 4, 10), not contiguous
    ref = _grads(lambda *t: sphere_step(*t, 1.0), ht, ut, a)
    got = _grads(native, ht, ut, a)
    for x, y in zip(got, ref):
        assert _rel(x, y) < 1e-12
    u2 = u.detach().requires_grad_(True)  # only u needs a gradient
    out, _ = native(h.detach(), u2, a.detach())
    (gu,) = torch.autograd.grad(out.sum(), u2)
    assert torch.isfinite(gu).all()
    with torch.no_grad():
        out_ng, _ = native(h, u, a)
    with torch.inference_mode():
        out_inf, _ = native(h.detach(), u.detach(), a.detach())
    assert out_ng.grad_fn is None and torch.equal(out_ng, out_inf)


def test_bad_p_is_refused(native):
    h, u, a = _inputs(1.0)
    for p in (0.0, -1.0, math.nan):
        with pytest.raises(RuntimeError, match="p must be > 0"):
            native(h, u, a, p)


def test_double_backward_is_refused(native):
    h, u, a = _inputs(1.0)
    out, _ = native(h, u, a)
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.grad(out.sum(), h, create_graph=True)


def test_same_bits_for_any_thread_count(native):
    """Rows are independent and dL/da is summed in row order: 1 and 2 threads agree bitwise."""
    h, u, a = _inputs(1.0, shape=(4096, 64), dtype=torch.float32)  # several rows per thread
    before = torch.get_num_threads()
    try:
        res = []
        for n in (1, 2):
            torch.set_num_threads(n)
            res.append(_grads(native, h, u, a))
    finally:
        torch.set_num_threads(before)
    for x, y in zip(*res):
        assert torch.equal(x, y)


def test_inputs_the_kernel_does_not_take_fall_back_to_eager(enabled):
    h, u, a = _inputs(1.0)
    assert not sphere_native.usable(h.to("meta"), u.to("meta"))
    assert not sphere_native.usable(h, u.float())
    out, _ = sphere_step_fused(h.detach().to("meta"), u.detach().to("meta"), 0.5, 1.0)
    assert out.device.type == "meta"  # the eager step (shape counting)
    out, _ = sphere_step_fused(h.float(), u, a, 1.0)  # mixed dtypes: eager, still right
    assert "NativeSphereStep" not in out.grad_fn.name()


def test_a_failed_build_warns_once_and_leaves_the_eager_step(monkeypatch):
    def broken():
        raise OSError("no compiler")

    monkeypatch.setattr(sphere_native, "_build", broken)
    monkeypatch.setattr(sphere_native, "is_built", lambda: False)
    _fresh(monkeypatch, "on")
    h, u, a = _inputs(1.0)
    with pytest.warns(RuntimeWarning, match="no compiler"):
        assert not sphere_native.active()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: no second warning
        out, _ = sphere_step_fused(h, u, a, 1.0)
    assert torch.allclose(out, sphere_step(h, u, a, 1.0)[0], atol=1e-14)


def test_enable_and_the_environment_switch(native, monkeypatch):
    monkeypatch.setitem(sphere_native._state, "mode", "off")
    assert not sphere_native.active()
    assert sphere_native.enable() and sphere_native.active()
    assert not sphere_native.enable(False)
    assert sphere_native.build_seconds() is not None


@pytest.mark.parametrize(("value", "mode"),
                         [("1", "on"), ("0", "off"), ("", "auto"), ("yes", "auto")])
def test_environment_switch_values(monkeypatch, value, mode):
    monkeypatch.setenv("GEOSWEEP_SPHERE_NATIVE", value)
    if value == "yes":
        with pytest.warns(RuntimeWarning, match="is not 0 or 1"):
            assert sphere_native._from_env() == mode
    else:
        assert sphere_native._from_env() == mode


def test_default_mode_takes_a_finished_build_and_off_never(native, monkeypatch):
    """Built (the fixture saw to it): the default step is the kernel, within rounding of the
    eager step; '0' gives the eager step."""
    assert sphere_native.is_built()
    h, u, a = _inputs(1.0, shape=(4, 8, 64))
    _fresh(monkeypatch, "auto")
    got = _grads(lambda *t: sphere_step_fused(*t, 1.0), h, u, a)
    assert "NativeSphereStep" in sphere_step_fused(h, u, a, 1.0)[0].grad_fn.name()
    ref = _grads(lambda *t: sphere_step_eager(*t, 1.0), h, u, a)
    for x, y in zip(got, ref):
        assert _rel(x, y) < 1e-12
    _fresh(monkeypatch, "off")
    assert "NativeSphereStep" not in sphere_step_fused(h, u, a, 1.0)[0].grad_fn.name()


def test_default_mode_never_builds_and_looks_once(monkeypatch):
    """Not built: the eager step, no build, and a build that appears later (another process)
    does not switch this process half-way through a run."""
    def no_build():
        raise AssertionError("the default mode must not build")

    built = {"v": False}
    monkeypatch.setattr(sphere_native, "_build", no_build)
    monkeypatch.setattr(sphere_native, "is_built", lambda: built["v"])
    _fresh(monkeypatch, "auto")
    h, u, a = _inputs(1.0)
    assert not sphere_native.active()
    built["v"] = True
    assert not sphere_native.active()
    assert "NativeSphereStep" not in sphere_step_fused(h, u, a, 1.0)[0].grad_fn.name()


def test_build_folder_is_keyed_by_source_and_torch(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    d = sphere_native.build_dir()
    assert d.parent == tmp_path and d.name.startswith("geosweep_sphere_step-")
    assert not sphere_native.is_built()  # an empty folder is not a build
    monkeypatch.setattr(sphere_native.torch, "__version__", "0.0.0-other")
    assert sphere_native.build_dir() != d


def test_build_command_reports_a_build_and_a_failure(native, monkeypatch, capsys):
    assert sphere_native._main(["--build"]) == 0
    assert "kernel already built" in capsys.readouterr().out

    def broken():
        raise OSError("no compiler")

    monkeypatch.setattr(sphere_native, "_build", broken)
    monkeypatch.setattr(sphere_native, "is_built", lambda: False)
    _fresh(monkeypatch, "auto")
    assert sphere_native._main(["--build"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "no compiler" in out[0] and "eager step" in out[0]


def test_build_command_without_a_compiler_exits_1_with_one_line(tmp_path):
    """The install step: a failed build is one line and exit 1 (install goes on), never a hang."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CXX": str(tmp_path / "no-cxx"),
           "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    r = subprocess.run([sys.executable, "-m", "workloads.geometry.sphere_native", "--build"],
                       env={**env, "PYTHONPATH": ":".join(sys.path)}, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    assert len(r.stdout.splitlines()) == 1 and "eager step" in r.stdout, r.stdout + r.stderr


def _scale_norm_ref(x, g, eps):
    return x * (g / (x.norm(dim=-1, keepdim=True) + eps))


@pytest.mark.parametrize("shape", [(2, 3, 13), (5, 64), (7, 3)])
@pytest.mark.parametrize("g_grad", [True, False])  # radius learnable, or a fixed buffer
def test_scale_norm_matches_the_eager_form_fp64(enabled, shape, g_grad):
    """SpheretNorm's entry: values and gradients, a zero row included (d||x||/dx = 0 there)."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64)
    x[(0,) * (len(shape) - 1)] = 0.0
    x.requires_grad_(True)
    g = torch.tensor(3.0, dtype=torch.float64, requires_grad=g_grad)
    w = torch.randn(shape, generator=gen, dtype=torch.float64)
    ref = _scale_norm_ref(x, g, 1e-6)
    got = sphere_native.scale_norm(x, g, 1e-6)
    assert "NativeScaleNorm" in got.grad_fn.name()
    inputs = (x, g) if g_grad else (x,)
    for a, b in zip(torch.autograd.grad((got * w).sum(), inputs),
                    torch.autograd.grad((ref * w).sum(), inputs)):
        assert _rel(a, b) < 1e-12
    assert _rel(got, ref) < 1e-12


def test_scale_norm_gradcheck_and_fallbacks(enabled, monkeypatch):
    x = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    g = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: sphere_native.scale_norm(*t, 1e-6), (x, g))
    xb = x.detach().bfloat16()  # not a kernel dtype: the eager form
    assert sphere_native.scale_norm(xb, g.bfloat16(), 1e-6).dtype == torch.bfloat16
    out = sphere_native.scale_norm(x.float(), g, 1e-6)  # mixed dtypes: eager (type promotion)
    assert out.grad_fn is not None and "NativeScaleNorm" not in out.grad_fn.name()
    monkeypatch.setitem(sphere_native._state, "mode", "off")
    out = sphere_native.scale_norm(x, g, 1e-6)
    assert "NativeScaleNorm" not in out.grad_fn.name()
    assert torch.equal(out, _scale_norm_ref(x, g, 1e-6))


def test_scale_norm_same_bits_for_any_thread_count(native):
    x = torch.randn(4096, 64, requires_grad=True)
    g = torch.tensor(8.0, requires_grad=True)
    before = torch.get_num_threads()
    try:
        res = []
        for n in (1, 2):
            torch.set_num_threads(n)
            out = sphere_native._state["sn"](x, g, 1e-6)
            res.append((out,) + torch.autograd.grad((out * out).sum(), (x, g)))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*res):
        assert torch.equal(a, b)


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path):
    """A killed build leaves torch's lock file, on which every later build would wait forever."""
    import os
    import time

    lock = tmp_path / "lock"
    lock.write_text("")
    sphere_native._drop_stale_lock(lock)
    assert lock.exists()  # a build may be running
    old = time.time() - 2 * sphere_native._STALE_LOCK_S
    os.utime(lock, (old, old))
    with pytest.warns(RuntimeWarning, match="stale build lock"):
        sphere_native._drop_stale_lock(lock)
    assert not lock.exists()
    sphere_native._drop_stale_lock(lock)  # none: nothing to do
