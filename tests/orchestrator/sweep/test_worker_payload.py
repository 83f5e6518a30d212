"""The Tune payload of a worker report (make_payload): the sentinel of "no finite eval yet" is
not sent as data (issue 33 §7: MLflow showed val/best_loss = 1.797e308)."""

from __future__ import annotations

import math

from orchestrator.spec.divergence_rules import DivergenceRules
from orchestrator.sweep.worker import OBJECTIVE, make_payload
from workloads.report import Divergence, Report

CTX = {"node": "n", "params": {"optim.lr": 1.0}, "arm": "optim.lr=1", "seed": 0}


def test_no_infinite_best_loss_in_the_payload():
    rep = Report(step=3, scalars={"train/loss": math.nan, "val/best_loss": math.inf},
                 divergence=Divergence("nonfinite_loss", 3, "nan"))
    out = make_payload(rep, CTX, "val/loss", 4.0, DivergenceRules(), {})
    assert "val/best_loss" not in out
    assert out[OBJECTIVE] == 4.0  # the penalty: the initial loss
    ok = make_payload(Report(step=4, scalars={"val/loss": 2.5, "val/best_loss": 2.5}), CTX,
                      "val/loss", 4.0, DivergenceRules(), {})
    assert ok["val/best_loss"] == 2.5 and ok[OBJECTIVE] == 2.5
