"""StepSignals (workloads/metrics/signals.py) and how the loop feeds them to the monitor."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.spec.divergence_rules import DivergenceRules
from orchestrator.sweep.divergence import DivergenceMonitor
from workloads.config import PRESETS, apply_overrides
from workloads.metrics.collect import MetricsCollector
from workloads.metrics.signals import StepSignals
from workloads.models import build_model
from workloads.train import build_data, run
from workloads.validate import validate


def _cfg(preset: str, **over):
    return validate(apply_overrides(PRESETS[preset](), {"train.metrics_every": 0, **over}))


def _gpt():
    cfg = PRESETS["gpt-debug"]()
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab_size=65)
    probe = torch.randint(0, 65, (4, cfg.model.block_size))
    return cfg, model, probe


def test_max_logit_and_sigma_match_the_metrics_collector():
    cfg, model, probe = _gpt()
    with torch.no_grad():  # larger W_Q so the logits are not all ~0
        for b in model.blocks:
            b.attn.c_attn.weight.mul_(3.0)
    got = StepSignals(model, probe).extras({"max_logit", "sigma_max_q"})
    col = MetricsCollector(model, cfg.metrics, probe_batch=probe)
    _, scalars = col.collect(1, exact_svd=True)
    assert got["max_logit"] == pytest.approx(scalars["inst/max_logit"], rel=1e-6)
    assert got["sigma_max_q"] == pytest.approx(scalars["inst/sigma_max_q"], rel=1e-5)
    assert model.training  # the probe forward restores the mode


def test_update_ratio_and_param_max():
    _, model, _ = _gpt()
    sig = StepSignals(model)
    sig.before_step({"update_ratio"})
    with torch.no_grad():
        w = model.blocks[0].attn.c_proj.weight
        w.mul_(1.5)  # ||dW|| / ||W|| = 0.5 for this matrix, 0 for the others
    assert sig.extras({"update_ratio"})["update_ratio"] == pytest.approx(0.5, rel=1e-6)
    assert sig.extras({"update_ratio"}) == {}  # no snapshot: nothing to compare
    with torch.no_grad():
        w[0, 0] = 1e30
    assert sig.param_max() == pytest.approx(1e30, rel=1e-6)  # huge but finite: not inf
    with torch.no_grad():
        w[0, 1] = math.nan
    assert math.isnan(sig.param_max())


def test_mlp_has_no_attention_signals():
    cfg = PRESETS["mlp-debug"]()
    model = build_model(cfg.model, vocab_size=None)
    out = StepSignals(model, torch.zeros(2, 784)).extras({"max_logit", "sigma_max_q"})
    assert out == {}


class _Spy(DivergenceMonitor):
    def __init__(self, rules):
        super().__init__(rules)
        self.infos = []

    def check(self, info):
        self.infos.append(info)
        return super().check(info)


def test_loop_fills_extras_only_at_the_monitor_cadence():
    spy = _Spy(DivergenceRules(max_logit=1e6, signal_every=4))
    cfg = _cfg("gpt-debug", **{"train.steps": 9})
    res = run(cfg, monitor=spy)
    assert res.divergence is None
    asked = [i.step for i in spy.infos if "max_logit" in i.extras]
    assert asked == [1, 4, 8]
    assert all(0 < i.extras["max_logit"] < 1e3 for i in spy.infos if i.extras)
    assert all(math.isfinite(i.param_max) for i in spy.infos)
    vocab = build_data(cfg).vocab_size
    assert spy.infos[0].chance_loss == pytest.approx(math.log(vocab))


def test_max_logit_rule_fires_in_a_real_run():
    res = run(_cfg("gpt-debug", **{"train.steps": 20}),
              monitor=DivergenceMonitor(DivergenceRules(max_logit=1e-3)))
    d = res.divergence
    assert (d.reason, d.step) == ("logit_bound", 1) and d.value > 1e-3


def test_final_loss_rule_in_a_real_run():
    # every per-step rule off: lr 30 without clipping ends far above ln(65); the last eval
    # classifies it (or a non-finite value stops it earlier: diverged either way)
    rules = DivergenceRules(grad_norm_max=None, loss_margin_vs_initial=None,
                            loss_factor_vs_best=None)
    res = run(_cfg("gpt-debug", **{"optim.lr": 30.0, "optim.grad_clip": 0.0}),
              monitor=DivergenceMonitor(rules))
    d = res.divergence
    assert d is not None and d.reason in ("final_loss", "nonfinite_loss", "nonfinite_grad",
                                          "nonfinite_param")
    if d.reason == "final_loss":
        assert d.step == 30 and d.value == res.final_val_loss > 100.0
