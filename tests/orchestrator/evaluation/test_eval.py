"""`geosweep eval`: fixed eval sets, metrics against direct computations, Parquet + MLflow
without duplicates, bad inputs, `report --metric`; one slow end-to-end run on real Ray.

No network: the hub is forced offline (HF_HUB_OFFLINE=1) in every test.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fake_sweep import make_sweep  # the Ray-free sweep folder builder

from orchestrator.cli import main
from orchestrator.evaluation.corpora import EvalInputError, EvalSkip
from orchestrator.evaluation.scoring import EvalSet, evaluate
from orchestrator.evaluation.sets import EvalSources, lambada_batches, windows
from orchestrator.evaluation.sweep_eval import run_eval
from orchestrator.store.eval_table import read_eval
from orchestrator.store.weights import model_from_checkpoint

torch.set_num_threads(1)
DONE = ("abc12_00000", "abc12_00001")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    # one offline switch, whatever the caller's environment has (.ci/run sets both)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return make_sweep(tmp_path_factory.mktemp("eval"))


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("corpora")
    text = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind\n" * 12
    (d / "hamlet.txt").write_text(text)
    pq.write_table(pa.table({"id": [1, 2, 3], "content": ["Now is the winter", "", text]}),
                   d / "docs.parquet")
    pq.write_table(pa.table({"body": ["no text column here"]}), d / "notext.parquet")
    (d / "broken.parquet").write_bytes(b"not parquet at all")
    (d / "euro.txt").write_text("prices in \u20ac only \u20ac\u20ac " * 40)  # not in the char vocab
    return d


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


# --- eval sets -------------------------------------------------------------------------------


def test_windows_are_consecutive_and_fixed():
    ids = np.arange(100)
    got = windows(ids, batch_size=3, block=8, max_batches=2)
    assert [tuple(x.shape) for x, _ in got] == [(3, 8), (3, 8)]
    x = torch.cat([b[0] for b in got])
    y = torch.cat([b[1] for b in got])
    assert torch.equal(x.flatten(), torch.arange(48)) and torch.equal(y, x + 1)
    last = windows(ids, batch_size=5, block=8, max_batches=0)  # all 12 windows, last batch short
    assert [len(b[0]) for b in last] == [5, 5, 2]
    with pytest.raises(EvalSkip, match="shorter than one block"):
        windows(np.arange(8), 2, 8, 1)


def _table_encode(text: str) -> list[int]:
    return [26 if c == " " else ord(c) - ord("a") for c in text]  # a..z -> 0..25, space -> 26


class TableModel(torch.nn.Module):
    """Predicts ``table[x]`` as the next token with probability p (uniform otherwise)."""

    V, p = 27, 0.7

    def __init__(self, table: dict[int, int]):
        super().__init__()
        self.table = table

    def forward(self, x, targets=None):
        nxt = torch.tensor([[self.table.get(int(t), 0) for t in row] for row in x])
        probs = torch.full((*x.shape, self.V), (1 - self.p) / (self.V - 1))
        probs.scatter_(-1, nxt.unsqueeze(-1), self.p)
        return probs.log(), None


def test_lambada_last_word_accuracy_and_loss_against_closed_form():
    b, c, d, sp = 1, 2, 3, 26  # "a" is 0
    model = TableModel({b: sp, sp: c, c: d})  # after "b": " c" then "d"
    texts = ["ab cd", "ab ce", "nospace"]  # right, last token wrong, unusable
    batches = lambada_batches(texts, _table_encode, batch_size=8, block=16, max_batches=1)
    (x, y), = batches
    assert x.shape == (2, 4) and y[0].tolist() == [-1, sp, c, d]  # " cd" scored, "a"->"b" not
    m = evaluate(model, EvalSet("lambada", "last_word", batches))
    right, wrong = -math.log(TableModel.p), -math.log((1 - TableModel.p) / (TableModel.V - 1))
    assert m["acc"] == 0.5 and m["examples"] == 2 and m["tokens"] == 6
    assert m["loss"] == pytest.approx((5 * right + wrong) / 6, rel=1e-6)
    assert m["ppl"] == pytest.approx(math.exp(m["loss"]))
    # a long context is cut from the left: the target stays whole at the end
    (x, y), = lambada_batches(["a" * 40 + " cd"], _table_encode, 4, 8, 1)
    assert x.shape == (1, 8) and y[0].tolist() == [-1] * 5 + [sp, c, d]


def test_own_split_loss_equals_direct_forward_and_is_deterministic(sweep):
    from workloads.data import load_tokens

    model, cfg, _ = model_from_checkpoint(
        next((sweep.root / "ray" / "tune").glob("*abc12_00000*/checkpoint_000001/step-*")))
    es = EvalSources(max_batches=3).own_split(cfg)
    assert es.key == "shakespeare-val" and len(es.batches) == 3
    val = np.asarray(load_tokens(cfg.data).val[: 3 * 8 * 32 + 1], dtype=np.int64)
    assert torch.equal(es.batches[0][0][0], torch.from_numpy(val[:32]))  # from the split start
    m = evaluate(model, es)
    with torch.no_grad():  # independent: the model's own mean loss per full batch
        direct = [float(model(x, y)[1]) for x, y in es.batches]
        acc = np.mean([float((model(x)[0].argmax(-1) == y).float().mean()) for x, y in es.batches])
    assert m["loss"] == pytest.approx(np.mean(direct), rel=1e-6)
    assert m["acc"] == pytest.approx(acc, rel=1e-9) and m["tokens"] == 3 * 8 * 32
    again = evaluate(model, EvalSources(max_batches=3).own_split(cfg))
    assert again == m  # fixed batches: bit-identical


def test_mnist_classifier_metrics_against_direct_computation():
    from workloads.config import preset
    from workloads.models import build_model

    cfg = preset("mlp-debug")
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    es = EvalSources(max_batches=2).own_split(cfg)
    assert es.key == "mnist-test" and es.kind == "classify"
    m = evaluate(model, es)
    x = torch.cat([b[0] for b in es.batches])
    y = torch.cat([b[1] for b in es.batches])
    with torch.no_grad():
        logits = model(x)[0]
    assert m["samples"] == 2 * cfg.train.batch_size
    assert m["loss"] == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-5)
    assert m["acc"] == float((logits.argmax(-1) == y).float().mean())
    assert "ppl" not in m


# --- the command -------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_eval_writes_parquet_and_mlflow_once(sweep, corpora, capsys):
    from mlflow import MlflowClient

    from orchestrator.store.runs import trial_runs

    args = ["eval", str(sweep.root), "--corpus", str(corpora / "hamlet.txt"),
            "--corpus", str(corpora / "docs.parquet"), "--corpus", str(corpora / "euro.txt"),
            "--max-batches", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "abc12_00002: diverged at step 3, no final checkpoint: skipped" in out
    assert "wikitext-2, lambada: skipped (offline: HF_HUB_OFFLINE=1)" in out
    assert "euro.txt skipped (not in the trial's tokenizer" in out
    first = read_eval(sweep.parquet_root, "fake")
    assert sorted(first["trial"].unique()) == list(DONE)
    assert set(first["corpus"]) == {"shakespeare-val", "hamlet", "docs"}
    assert set(first["metric"]) == {"loss", "ppl", "acc", "tokens"}
    assert (first["step"] == 8).all() and first["checkpoint"].str.endswith("step-00000008").all()
    assert main(args) == 0  # again: same numbers, replaced rows, no duplicate MLflow points
    again = read_eval(sweep.parquet_root, "fake")
    key = ["trial", "corpus", "metric"]
    assert len(again) == len(first) == 2 * 3 * 4 and not again.duplicated(key).any()
    a, b = first.sort_values(key), again.sort_values(key)
    assert a["value"].tolist() == b["value"].tolist()
    loss = a[(a.corpus == "hamlet") & (a.metric == "loss")]
    ppl = a[(a.corpus == "hamlet") & (a.metric == "ppl")]
    assert np.allclose(np.exp(loss["value"].to_numpy()), ppl["value"].to_numpy())

    client = MlflowClient(tracking_uri=sweep.uri)
    runs = trial_runs(client, "fake")
    for tid in DONE:
        hist = client.get_metric_history(runs[tid], "eval/hamlet/loss")
        want = a[(a.trial == tid) & (a.corpus == "hamlet") & (a.metric == "loss")]["value"]
        assert [(h.step, h.value) for h in hist] == [(8, pytest.approx(float(want.iloc[0])))]
    assert not client.get_run(runs["abc12_00002"]).data.metrics.get("eval/hamlet/loss")

    # one trial, one corpus: its other rows stay, the other trial's file is untouched
    assert main(["eval", str(sweep.root), "--trial", DONE[0], "--max-batches", "1"]) == 0
    third = read_eval(sweep.parquet_root, "fake")
    assert len(third) == len(first) and not third.duplicated(key).any()
    n_tok = third[(third.trial == DONE[0]) & (third.corpus == "shakespeare-val")
                  & (third.metric == "tokens")]["value"]
    assert n_tok.tolist() == [1 * 8 * 32]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("extra, message", [
    (["--trial", "nope_1"], "--trial: unknown trial 'nope_1'; trials are: abc12_00000"),
    (["--corpus", "missing.txt"], "--corpus: file not found: missing.txt"),
    (["--corpus", "{d}/notext.parquet"], "has no text column (one of text, content, document;"),
    (["--corpus", "{d}/broken.parquet"], "is not a readable Parquet file"),
    (["--corpus", "webtext"], "is not one of wikitext-2, lambada or a local .txt/.parquet"),
    (["--corpus", "lambada"], "--corpus lambada: needs the Hugging Face hub, which is "
                              "unreachable (HF_HUB_OFFLINE=1)"),
    (["--max-batches", "0"], "--max-batches: must be >= 1"),
])
def test_bad_inputs_one_line_exit_2_nothing_written(sweep, corpora, capsys, extra, message):
    before = _files(sweep.root)
    t0 = time.time()
    rc = main(["eval", str(sweep.root)] + [e.format(d=corpora) for e in extra])
    err = capsys.readouterr().err
    assert rc == 2 and time.time() - t0 < 20
    assert err.count("\n") == 1 and err.startswith("geosweep: error: ") and message in err
    assert _files(sweep.root) == before


@pytest.mark.timeout(120)
def test_hub_sets_scored_by_default_when_online(sweep, monkeypatch, capsys):
    """The online path without a network: the hub probe says reachable and ``datasets`` is
    replaced by fixed rows (WikiText lines; LAMBADA passages ending in a word)."""
    import workloads.data
    from orchestrator.evaluation import sets as eval_sets

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(workloads.data, "hub_offline_reason", lambda timeout=2.0: "")
    loaded = []

    def rows(spec):
        loaded.append(spec.path)
        if spec.kind == "lm":
            return [" Valkyrie \n", " The king hath happily received , Macbeth , \n"] * 40
        return ["And what says the king to that, my good lord", "Thou art a villain, sir"] * 3

    monkeypatch.setattr(eval_sets, "_hub_rows", rows)
    assert main(["eval", str(sweep.root), "--trial", DONE[1], "--max-batches", "2"]) == 0
    out = capsys.readouterr().out
    assert "wikitext-2" in out and "lambada" in out
    assert loaded == ["Salesforce/wikitext", "EleutherAI/lambada_openai"]  # once for the sweep
    rows_ = read_eval(sweep.parquet_root, "fake")
    lam = rows_[(rows_.trial == DONE[1]) & (rows_.corpus == "lambada")].set_index("metric")
    assert lam.loc["examples", "value"] == 6 and 0 <= lam.loc["acc", "value"] <= 1
    # " lord" and " sir" in char tokens, 3 times each
    assert lam.loc["tokens", "value"] == 3 * (5 + 4)
    wiki = rows_[(rows_.trial == DONE[1]) & (rows_.corpus == "wikitext-2")].set_index("metric")
    assert wiki.loc["tokens", "value"] == 2 * 8 * 32
    assert main(["eval", str(sweep.root), "--trial", DONE[1], "--no-hub",
                 "--max-batches", "1"]) == 0  # --no-hub: not even probed
    assert "wikitext-2" not in capsys.readouterr().out.split("corpus")[-1]


def test_not_a_sweep_folder(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    assert "not a geosweep sweep folder (no sweep.json)" in capsys.readouterr().err
    with pytest.raises(EvalInputError, match="no sweep.json"):
        run_eval(tmp_path)
    # as a script too (`python -m orchestrator.cli`: the CLI module is __main__ there)
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "eval", str(tmp_path)],
                          capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[3])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "not a geosweep sweep folder" in proc.stderr


@pytest.mark.timeout(180)
def test_report_metric_uses_eval_values(sweep, capsys):
    from orchestrator.analysis.report import ReportConfig, ReportError, arm_table, load_sweep

    assert main(["eval", str(sweep.root), "--max-batches", "1", "--no-hub"]) == 0
    rows = read_eval(sweep.parquet_root, "fake")
    loss = rows[(rows.corpus == "shakespeare-val") & (rows.metric == "loss")]
    by_trial = dict(zip(loss.trial, loss.value))
    data = load_sweep(sweep.root)
    arms = arm_table(data, config=ReportConfig(metric="eval/shakespeare-val/loss"))
    got = dict(zip(arms.arm, arms.metric_mean))
    assert got["optim.lr=0.001"] == pytest.approx(by_trial[DONE[0]])
    assert got["optim.lr=0.003"] == pytest.approx(by_trial[DONE[1]])
    assert math.isnan(got["optim.lr=500.0"])  # diverged: not evaluated
    # the baseline is the best completed arm (never the diverged one); diffs are against it
    ids = {"optim.lr=0.001": DONE[0], "optim.lr=0.003": DONE[1]}
    (base,) = arms[arms.baseline.astype(bool)].arm
    (other,) = set(ids) - {base}
    diff = arms[arms.arm == other]["diff_mean"].iloc[0]
    assert diff == pytest.approx(by_trial[ids[other]] - by_trial[ids[base]])
    default = arm_table(data)  # unchanged default: final val loss of the trial records
    assert dict(zip(default.arm, default.metric_mean))["optim.lr=0.003"] == pytest.approx(2.40)
    with pytest.raises(ReportError, match=r"\(eval metrics: .*eval/shakespeare-val/loss"):
        arm_table(data, config=ReportConfig(metric="eval/nope/loss"))
    capsys.readouterr()
    assert main(["report", str(sweep.root), "--metric", "eval/nope/loss"]) == 2
    assert "--metric: 'eval/nope/loss'" in capsys.readouterr().err


# --- end to end on Ray -------------------------------------------------------------------------

SPEC_E2E = """
name: evale2e
workload: {preset: gpt-debug, overrides: {optim.warmup_steps: 0}}
space:
  optim.lr: {grid: [1.0e-3, 3.0e-3]}
seeds: [0]
search: {algorithm: grid, max_concurrent: 1}
budget: {steps: 30, eval_every: 15, metrics_every: 0}
resources: {workers_per_trial: 1, cpus_per_worker: 1}
"""


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(300)
def test_end_to_end_sweep_eval_load_and_report(tmp_path, capsys):
    from mlflow import MlflowClient

    from orchestrator.store.parquet import read_trials
    from orchestrator.store.runs import trial_runs
    from orchestrator.store.weights import load_model

    (tmp_path / "e2e.yaml").write_text(textwrap.dedent(SPEC_E2E))
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    proc = subprocess.run(  # its own Ray, shut down when it exits (as test_sweep_ray.py)
        [sys.executable, "-m", "orchestrator.cli", "run", str(tmp_path / "e2e.yaml"),
         "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=240, env=env,
        cwd=Path(__file__).parents[3])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "best trial's weights: runs:/" in proc.stdout
    root = tmp_path / "out" / "evale2e"

    assert main(["eval", str(root), "--max-batches", "4"]) == 0
    assert "shakespeare-val" in capsys.readouterr().out
    rows = read_eval(str(root / "parquet"), "evale2e")
    trials = read_trials(str(root / "parquet"), "evale2e")
    assert sorted(rows.trial.unique()) == sorted(trials.trial) and (rows.step == 30).all()
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    runs = trial_runs(client, "evale2e")
    loss = rows[(rows.corpus == "shakespeare-val") & (rows.metric == "loss")]
    for tid, value in zip(loss.trial, loss.value):
        hist = client.get_metric_history(runs[tid], "eval/shakespeare-val/loss")
        assert [(h.step, h.value) for h in hist] == [(30, pytest.approx(value))]

    best = trials.loc[trials.final_val_loss.idxmin(), "trial"]
    model, cfg = load_model(f"runs:/{runs[best]}/model", tracking_uri=str(root))
    es = EvalSources(max_batches=4).own_split(cfg)
    assert evaluate(model, es)["loss"] == pytest.approx(
        float(loss[loss.trial == best].value.iloc[0]), rel=1e-6)
    others = [t for t in trials.trial if t != best]
    assert all("model" not in {a.path for a in client.list_artifacts(runs[t])} for t in others)

    assert main(["report", str(root), "--metric", "eval/shakespeare-val/loss"]) == 0
    arms = (root / "report" / "arms.csv").read_text()
    assert "eval/shakespeare-val/loss" in arms


@pytest.mark.timeout(180)
def test_stopped_trial_is_scored_on_its_last_checkpoint(tmp_path, monkeypatch):
    """A trial ASHA stopped early ends with the weights of its last checkpoint: scored there
    (its step recorded); a diverged one is not (its checkpoint predates the divergence)."""
    import fake_sweep as test_weights

    from orchestrator.store.parquet import ParquetSink

    monkeypatch.setattr(test_weights, "TRIALS", {
        "abc12_00000": ("completed", 1e-3, 2.50), "abc12_00001": ("completed", 3e-3, 2.40)})
    sw = make_sweep(tmp_path)
    # ASHA stopped abc12_00001 after its step-8 checkpoint: same files, status "stopped"
    ParquetSink(sw.parquet_root, "fake").write_trial({
        "trial": "abc12_00001", "status": "stopped", "arm": "optim.lr=0.003", "seed": 0,
        "params": {"optim.lr": 3e-3, "train.seed": 0}})
    lines: list[str] = []
    run_eval(str(sw.root), max_batches=1, printer=lines.append)
    got = read_eval(sw.parquet_root, "fake")
    assert set(got["trial"]) == {"abc12_00000", "abc12_00001"}
    assert set(got.loc[got["trial"] == "abc12_00001", "step"]) == {8}
