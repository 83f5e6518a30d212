"""workloads/model_size.py: the config-only parameter count never overcounts (a refusal based
on it must never be wrong) and is close for the models that matter (transformers)."""

from __future__ import annotations

import dataclasses

import pytest

from workloads.config import preset
from workloads.model_size import approx_params, min_train_bytes
from workloads.models import build_model


@pytest.mark.parametrize("name, vocab, close", [
    ("gpt-debug", 65, 0.99), ("gpt-tiny", 50304, 0.999), ("llama-tiny", 50304, 0.99),
    ("mlp-debug", None, 0.9), ("mlp-mnist", None, 0.9),
])
def test_count_is_a_close_undercount_of_the_built_model(name, vocab, close):
    m = preset(name).model
    if vocab is not None:
        m = dataclasses.replace(m, vocab_size=vocab)
    real = sum(p.numel() for p in build_model(m, vocab_size=vocab).parameters())
    assert close * real <= approx_params(m) <= real


def test_train_bytes_count_the_optimizer_state():
    cfg = preset("gpt-debug")
    n = approx_params(cfg.model)
    assert min_train_bytes(cfg) == 16 * n  # AdamW: weight, grad, 2 moments in fp32
    sgd = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, name="sgd"))
    assert min_train_bytes(sgd) == 12 * n
