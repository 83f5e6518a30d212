"""workloads.validate: choice lists from the registries, the assignment/optimizer rule, and the
one reader of infinity (workloads.config.parse_p)."""

import math

import pytest

from workloads.config import ConfigError, apply_overrides, parse_p, parse_value, preset
from workloads.geometry.msign import MSIGN_METHODS
from workloads.models.mlp import ACTIVATIONS
from workloads.residual import family_params
from workloads.validate import choices, validate


@pytest.mark.parametrize("text", ["inf", "+inf", ".inf", "Infinity", " +INFINITY "])
def test_parse_p_reads_every_inf_spelling(text):
    assert parse_p(text) == math.inf
    assert parse_value(text) == math.inf


@pytest.mark.parametrize("value", ["-inf", "infinite", 2, 0.5, "pre_ln", None])
def test_parse_p_leaves_other_values(value):
    assert parse_p(value) == value


def test_choice_lists_come_from_the_registries():
    assert choices(preset("gpt-debug"))["optim.muon.msign"] == tuple(MSIGN_METHODS)
    assert choices(preset("mlp-debug"))["model.activation"] == tuple(ACTIVATIONS)
    assert "model.activation" not in choices(preset("gpt-debug"))


@pytest.mark.parametrize("assignment", ["hetero", {"blocks.*.attn.*": "stiefel"}])
def test_assignment_without_muon_is_refused_in_one_line(assignment):
    cfg = apply_overrides(preset("gpt-debug"), {"optim.manifold.assignment": assignment})
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    msg = str(e.value)
    assert msg.startswith("optim.manifold.assignment: ") and "optim.name muon" in msg
    assert "\n" not in msg
    validate(apply_overrides(cfg, {"optim.name": "muon"}))  # with Manifold Muon it is used


def test_default_assignment_is_fine_with_adamw():
    assert validate(preset("gpt-debug")).optim.name == "adamw"


def test_spheret_p_inf_spelled_in_the_residual_dict():
    cfg = apply_overrides(preset("gpt-debug"),
                          {"model.residual": {"family": "spheret", "p": ".inf"}})
    validate(cfg)
    assert family_params(cfg.model.residual).p == math.inf  # the family reads it with parse_p
    bad = apply_overrides(preset("gpt-debug"), {"model.residual": {"family": "spheret", "p": 0}})
    with pytest.raises(ConfigError, match=r"^model\.residual\.p: must be > 0 \(or inf\), got 0"):
        validate(bad)
