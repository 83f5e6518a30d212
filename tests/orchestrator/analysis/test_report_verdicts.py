"""`geosweep report` on a family x lr sweep whose spec declares claims: verdicts.{md,csv} and
the frontier tables are written and linked from report.md."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.analysis.report import write_report

pytestmark = pytest.mark.timeout(180)

SPEC = """name: fr
claims:
  - {id: A1, paper: Paper A, source: paper, text: spheret beats pre_ln at lr 0.01,
     metric: final_val_loss,
     arm: {model.residual.family: spheret, optim.lr: 0.01},
     baseline: {model.residual.family: pre_ln, optim.lr: 0.01},
     direction: lower, effect: 0.05, min_steps: 100, controls: [first_loss], n_classes: 84}
"""


def _sweep(tmp_path):
    root = tmp_path / "fr"
    rows, i = [], 0
    for fam, dies_at in (("pre_ln", 0.1), ("spheret", 1.0)):
        for lr in (1e-3, 1e-2, 1e-1, 1.0):
            for seed in range(3):
                dead = lr >= dies_at
                # seed offsets differ between the families: a spread in the paired differences
                off = 0.01 * (seed if fam == "pre_ln" else (0, 2, 1)[seed])
                loss = math.nan if dead else (2.5 if fam == "pre_ln" else 2.3) + off
                rows.append({"trial": f"t{i:03d}", "arm": f"{fam} lr={lr}", "seed": seed,
                             "status": "diverged" if dead else "completed",
                             "final_val_loss": loss, "model.residual.family": fam,
                             "optim.lr": lr, "last_step": 50 if dead else 200,
                             "train/initial_loss": 4.43})
                i += 1
    for r in rows:
        folder = root / "parquet" / "trials" / "sweep=fr"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pandas(pd.DataFrame([r]), preserve_index=False),
                       folder / f"trial={r['trial']}.parquet")
    (root / "sweep.json").write_text(json.dumps({"name": "fr", "parquet_root": str(
        root / "parquet"), "mlflow_uri": None}))
    (root / "spec.yaml").write_text(SPEC)
    return root


def test_report_writes_verdicts_and_frontier(tmp_path):
    root = _sweep(tmp_path)
    text = write_report(root, log_mlflow=False).read_text()
    out = root / "report"
    v = pd.read_csv(out / "verdicts.csv")
    assert v.loc[0, "direction"] == "confirmed", v.loc[0, "reasons"]
    assert v.loc[0, "size"] == "larger" and v.loc[0, "source"] == "paper"
    # paired by seed: differences -0.2 + 0.01 x (0, 1, -1), SD 0.01, n = 3, df = 2:
    # MDE = (t_.975 + t_.8) x 0.01 / sqrt(3) = (4.3027 + 1.0607) x 0.01 / sqrt(3)
    assert v.loc[0, "design"] == "paired" and v.loc[0, "diff"] == pytest.approx(-0.2)
    assert v.loc[0, "mde"] == pytest.approx((4.3027 + 1.0607) * 0.01 / math.sqrt(3), rel=1e-4)
    # "did it train": the corpus of this spec-less folder is unknown, so ln(84) stands in
    assert v.loc[0, "trained_reference"] == pytest.approx(math.log(84))
    assert v.loc[0, "steps_run"] == 200 and v.loc[0, "first_loss_worst"] == pytest.approx(4.43)
    assert "## Verdicts" in text and "[verdicts.csv](verdicts.csv)" in text
    assert (out / "verdicts.md").read_text().startswith("# Verdicts: fr")
    f = pd.read_csv(out / "frontier.csv").set_index("family")
    assert f.loc["pre_ln", "critical_lr"] == 1e-2 and f.loc["spheret", "critical_lr"] == 0.1
    assert "## Stability frontier" in text and "common lr 0.001" in text
    loss = pd.read_csv(out / "frontier_loss.csv").set_index("family")
    assert loss.loc["spheret", "mean"] == pytest.approx(np.mean([2.3, 2.31, 2.32]))
