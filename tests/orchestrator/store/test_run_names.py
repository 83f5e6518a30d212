"""Run names, end statuses and reasons of child runs (orchestrator/store/run_names.py)."""

from __future__ import annotations

import math

import pytest

from orchestrator.store.run_names import END_STATUS, compact, reason, run_name


@pytest.mark.parametrize("v, text", [
    (3e-3, "3e-3"), (1e-4, "1e-4"), (2, "2"), (2.0, "2"), (math.inf, "inf"), (0.25, "0.25"),
    (0.1234567, "0.123"), (1.5e-3, "1.5e-3"), (True, "true"), (128, "128"), (12345.5, "1.23e4"),
])
def test_compact_numbers(v, text):
    assert compact(v) == text


def test_run_name_from_searched_params_and_seed():
    params = {"model.residual.family": "spheret", "model.residual.p": 2.0,
              "optim.lr": 0.003, "train.seed": 0}
    assert run_name(params) == "spheret p=2 lr=3e-3 s0"
    # an ambiguous last part keeps two parts; no params and no seed -> base
    assert run_name({"optim.lr": 1e-3, "optim.muon.lr": 0.02}) == "optim.lr=1e-3 muon.lr=0.02"
    assert run_name({}) == "base"
    assert run_name({"optim.lr": 0.01}, seed=4) == "lr=0.01 s4"
    # the same name whatever order the params come in (Tune's config, Parquet's columns)
    assert run_name({"optim.lr": 0.003, "model.residual.p": 2.0, "train.seed": 0}) == \
        run_name({"train.seed": 0, "model.residual.p": 2.0, "optim.lr": 0.003}) == "p=2 lr=3e-3 s0"


def test_end_status_and_reasons():
    assert END_STATUS == {"completed": "FINISHED", "diverged": "FAILED", "stopped": "FINISHED",
                          "failed": "FAILED"}
    rec = {"divergence_reason": "loss_vs_best", "divergence_step": 17,
           "divergence_detail": "loss 9.1 > 4 x best 2.0", "last_step": 40, "error": "boom"}
    assert reason(rec, "diverged") == "diverged: loss_vs_best at step 17 (loss 9.1 > 4 x best 2.0)"
    assert reason(rec, "stopped") == "stopped early by the scheduler (ASHA) at step 40"
    assert reason(rec, "failed") == "failed: boom"
    assert reason(rec, "completed") is None
