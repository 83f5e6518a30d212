"""``orchestrator.analysis.report``: a synthetic Parquet sweep with planted statistics, written with
pyarrow in the contract's layout (docs/contracts.md), checked against scipy and by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats as st

from orchestrator.analysis import load as L
from orchestrator.analysis import report as A

pytestmark = pytest.mark.timeout(180)  # the first test also builds the report and MLflow store

SWEEP = "synth"
BASE = "model.residual.family=pre_ln,optim.lr=0.001"
P1 = "model.residual.family=spheret,model.residual.p=1,optim.lr=0.001"
P4 = "model.residual.family=spheret,model.residual.p=4,optim.lr=0.001"
PINF = "model.residual.family=spheret,model.residual.p=inf,optim.lr=0.001"
# final val loss per arm and seed (None: diverged); seed 4 of P1 failed (infrastructure)
FINAL = {
    BASE: [3.00, 3.10, 2.95, 3.05],
    P1: [2.90, 2.98, 2.87, 2.94],
    P4: [2.97, 3.02, 2.99, None],
    PINF: [None, None, 3.20, 3.40],
}
DIV_STEP = {(P4, 3): 40, (PINF, 0): 30, (PINF, 1): 70}
SPIKY = (BASE, 2)  # its train curve has two planted spike episodes
STEPS = 100


def _write(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _train_curve(arm: str, seed: int, last: int) -> np.ndarray:
    s = np.arange(last + 1)
    loss = 2.0 + 3.0 * np.exp(-s / 25.0) + 0.01 * seed
    if (arm, seed) == SPIKY:
        loss[50:53] *= 3.0  # episode 1 (three steps)
        loss[80] *= 2.5  # episode 2
    if (arm, seed) in DIV_STEP:
        loss[-1] = np.inf
    return loss


def make_sweep(tmp_path: Path, with_metrics: bool = True, with_p: bool = True,
               mlflow_uri: str | None = None) -> Path:
    root = tmp_path / SWEEP
    pq_root = root / "parquet"
    trial_no = 0
    for arm, finals in FINAL.items():
        p = {P1: 1.0, P4: 4.0, PINF: math.inf}.get(arm)
        seeds = list(range(len(finals))) + ([4] if arm == P1 else [])
        for seed in seeds:
            tid = f"t{trial_no:03d}"
            trial_no += 1
            final = finals[seed] if seed < len(finals) else None
            status = ("failed" if seed >= len(finals) else
                      "diverged" if final is None else "completed")
            rec = {"trial": tid, "status": status, "arm": arm, "seed": seed,
                   "final_val_loss": final,
                   "best_val_loss": None if final is None else final - 0.02,
                   "final_train_loss": final, "divergence_reason": None, "divergence_step": None,
                   "model.residual.family": "pre_ln" if arm == BASE else "spheret",
                   "optim.lr": 1e-3, "train.seed": seed}
            if with_p and p is not None:
                rec["model.residual.p"] = p
            if status == "diverged":
                rec.update(divergence_reason="nonfinite_loss",
                           divergence_step=DIV_STEP[(arm, seed)])
            types = {"divergence_step": pa.int64(), "divergence_reason": pa.string(),
                     "final_val_loss": pa.float64(), "best_val_loss": pa.float64(),
                     "final_train_loss": pa.float64()}
            table = pa.table({k: pa.array([v], type=types.get(k)) for k, v in rec.items()})
            _write(table, pq_root / "trials" / f"sweep={SWEEP}" / f"trial={tid}.parquet")
            if status == "failed":
                continue
            last = DIV_STEP.get((arm, seed), STEPS)
            tr = _train_curve(arm, seed, last)
            val_steps = np.arange(0, last + 1, 20)
            val = tr[val_steps] + 0.1
            curve = pd.DataFrame({
                "step": np.concatenate([np.arange(last + 1), val_steps]),
                "split": ["train"] * (last + 1) + ["val"] * len(val_steps),
                "metric": "loss", "value": np.concatenate([tr, val]),
                "wall_time": 0.01 * np.concatenate([np.arange(last + 1), val_steps])})
            folder = pq_root / "curves" / f"sweep={SWEEP}" / f"trial={tid}"
            _write(pa.Table.from_pandas(curve, preserve_index=False),
                   folder / f"part-{0:08d}-{last:08d}.parquet")
            (folder / "_part-junk.tmp-abc").write_bytes(b"half-written")  # readers skip it
            if with_metrics:
                _write(pa.Table.from_pandas(_metric_rows(arm, seed, last), preserve_index=False),
                       pq_root / "metrics" / f"sweep={SWEEP}" / f"trial={tid}"
                       / f"part-{0:08d}-{last:08d}.parquet")
    manifest = {"name": SWEEP, "trials": trial_no, "parquet_root": str(pq_root),
                "mlflow_uri": mlflow_uri, "started": 0.0, "address": None}
    (root / "sweep.json").write_text(json.dumps(manifest))
    (root / "spec.yaml").write_text(f"name: {SWEEP}\n")
    return root


def _metric_rows(arm: str, seed: int, last: int) -> pd.DataFrame:
    rows = []
    growth = 3.0 if arm == PINF else 1.0
    for step in range(0, last + 1, 25):
        for module in ("q", "hidden"):
            for layer in range(3):
                rows.append((step, "w.top1_v", module, layer, layer + 1,
                             0.2 + 0.1 * layer + 0.004 * step + 0.01 * seed))
                rows.append((step, "base.top1_v", module, layer, layer + 1, 0.05))
                rows.append((step, "w.sigma_max", module, layer, -1,
                             1.0 + growth * step / 100 + 0.1 * layer))
                # a degenerate top gap for q in the p=inf arm (as on the Stiefel manifold)
                rows.append((step, "w.s1_s2", module, layer, -1,
                             1.01 if (arm == PINF and module == "q") else 1.5))
        for layer in range(4):
            rows.append((step, "inst.max_logit", "attn", layer, -1, 5.0 + step * growth / 10))
    return pd.DataFrame(rows, columns=["step", "metric", "module", "layer", "next_layer",
                                       "value"])


# --- fixtures ---------------------------------------------------------------------------------


def _mlflow_store(tmp: Path, tagged: bool = True) -> tuple[str, str | None]:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(SWEEP, artifact_location=str(tmp / "mlartifacts"))
    if not tagged:
        client.create_run(exp, tags={"other": "x"})
        return uri, None
    parent = client.create_run(exp, tags={"geosweep.sweep": SWEEP, "geosweep.role": "parent"})
    client.create_run(exp, tags={"geosweep.sweep": SWEEP, "geosweep.trial_id": "t000",
                                 "mlflow.parentRunId": parent.info.run_id})
    return uri, parent.info.run_id


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("sweep")
    uri, parent = _mlflow_store(tmp)
    root = make_sweep(tmp, mlflow_uri=uri)
    md = A.write_report(root)
    return {"root": root, "md": md, "uri": uri, "parent": parent, "data": A.load_sweep(root)}


@pytest.fixture(scope="module")
def arms(sweep) -> pd.DataFrame:
    return A.arm_table(sweep["data"]).set_index("arm")


# --- loading ----------------------------------------------------------------------------------


def test_load_sweep_reads_all_tables(sweep):
    d = sweep["data"]
    assert len(d.trials) == 17 and set(d.trials["status"]) == {"completed", "diverged", "failed"}
    assert d.trials["trial"].is_unique
    assert np.isinf(d.trials.loc[d.trials["arm"] == PINF, "model.residual.p"]).all()
    # 13 completed x 101 train points + diverged ones (31, 41, 71) + val every 20 steps
    n_train = 13 * 101 + 31 + 41 + 71
    assert d.curves is None  # read when a stage needs them
    assert (L.curves_of(d)["split"] == "train").sum() == n_train
    assert set(d.metrics["metric"]) == {"w.top1_v", "base.top1_v", "w.sigma_max",
                                        "inst.max_logit", "w.s1_s2"}


def test_fallback_reader_matches_sink_reader(sweep):
    pq_root = str(sweep["root"] / "parquet")
    for kind in ("trials", "curves", "metrics"):
        ours = L._fallback_read(pq_root, kind, SWEEP)
        theirs = L._read(pq_root, kind, SWEEP)
        key = ["trial"] if kind == "trials" else ["trial", "step", "metric"] + (
            ["split"] if kind == "curves" else ["module", "layer"])
        a = ours.sort_values(key).reset_index(drop=True)
        b = theirs.sort_values(key).reset_index(drop=True)
        assert len(a) == len(b) > 0
        np.testing.assert_allclose(pd.to_numeric(a["final_val_loss" if kind == "trials"
                                                   else "value"]).to_numpy(dtype=float),
                                   pd.to_numeric(b["final_val_loss" if kind == "trials"
                                                   else "value"]).to_numpy(dtype=float))
    assert L._fallback_read(pq_root, "curves", "other_sweep").empty


# --- the arm table ----------------------------------------------------------------------------


def test_arm_table_t_intervals_match_scipy(arms):
    for arm, finals in FINAL.items():
        x = np.array([v for v in finals if v is not None])
        lo, hi = st.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=st.sem(x))
        row = arms.loc[arm]
        assert row["final_val_mean"] == pytest.approx(x.mean())
        assert (row["final_val_lo"], row["final_val_hi"]) == pytest.approx((lo, hi))
        assert (row["best_val_lo"], row["best_val_hi"]) == pytest.approx((lo - 0.02, hi - 0.02))
        assert row["n_completed"] == len(x)


def test_arm_table_counts_and_wilson(arms):
    z = st.norm.ppf(0.975)
    for arm, k, n in ((BASE, 0, 4), (P1, 0, 4), (P4, 1, 4), (PINF, 2, 4)):
        row = arms.loc[arm]
        p = k / n
        c = (p + z**2 / (2 * n)) / (1 + z**2 / n)
        h = z / (1 + z**2 / n) * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
        assert row["n_diverged"] == k
        assert row["div_rate"] == pytest.approx(p)
        assert (row["div_lo"], row["div_hi"]) == pytest.approx((max(0, c - h), c + h))
    # the failed trial is neither an outcome nor a divergence
    assert arms.loc[P1, "n_failed"] == 1 and arms.loc[P1, "n_trials"] == 5
    assert arms.loc[P4, "median_div_step"] == 40 and arms.loc[PINF, "median_div_step"] == 50
    assert math.isnan(arms.loc[BASE, "median_div_step"])


def test_arm_table_paired_differences_and_holm(arms):
    base = np.array(FINAL[BASE])
    pvals = {}
    for arm in (P1, P4, PINF):
        seeds = [s for s, v in enumerate(FINAL[arm]) if v is not None]
        a = np.array([FINAL[arm][s] for s in seeds])
        b = base[seeds]
        d = a - b
        row = arms.loc[arm]
        assert row["diff_n"] == len(seeds)
        assert row["diff_mean"] == pytest.approx(d.mean())
        ref = st.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=st.sem(d))
        assert (row["diff_lo"], row["diff_hi"]) == pytest.approx(ref)
        assert row["p_value"] == pytest.approx(st.ttest_rel(a, b).pvalue)
        pvals[arm] = row["p_value"]
    # Holm by hand over the three arms: sort, scale by 3, 2, 1, running max, cap at 1
    order = sorted(pvals, key=pvals.get)
    running = 0.0
    for i, arm in enumerate(order):
        running = max(running, min(1.0, (3 - i) * pvals[arm]))
        assert arms.loc[arm, "p_holm"] == pytest.approx(running)
    assert math.isnan(arms.loc[BASE, "p_value"]) and bool(arms.loc[BASE, "baseline"])
    assert arms.loc[P1, "diff_hi"] < 0  # the planted improvement is significant
    assert arms.loc[P1, "p_holm"] < 0.05


def test_arm_table_spikes(arms):
    # BASE seed 2: two planted episodes over 4 trials; each diverged trial ends in one (inf)
    assert arms.loc[BASE, "spikes_total"] == 2 and arms.loc[BASE, "spikes_per_trial"] == 0.5
    assert arms.loc[P1, "spikes_total"] == 0
    assert arms.loc[PINF, "spikes_total"] == 2


def test_baseline_default_override_and_error(sweep):
    d = sweep["data"]
    assert A.resolve_baseline(A.arm_order(d.trials), None) == BASE
    assert A.resolve_baseline(["a", "b=unconstrained", "c"], None) == "b=unconstrained"
    assert A.resolve_baseline(["x", "y"], None) == "x"
    t = A.arm_table(d, baseline=P4).set_index("arm")
    assert bool(t.loc[P4, "baseline"]) and math.isnan(t.loc[P4, "p_value"])
    assert t.loc[BASE, "diff_mean"] == pytest.approx(
        np.mean(np.array(FINAL[BASE][:3]) - np.array(FINAL[P4][:3])))
    with pytest.raises(A.ReportError) as e:
        A.write_report(sweep["root"], baseline="nope", log_mlflow=False)
    msg = str(e.value)
    assert "\n" not in msg and "'nope'" in msg and all(a in msg for a in FINAL)


# --- the report -------------------------------------------------------------------------------


def _assert_png(path: Path) -> None:
    import matplotlib.image as mpimg

    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", path
    assert len(raw) > 1024, path
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert float(img[..., :3].std()) > 0.01, f"{path.name} is blank"


def test_report_files_and_figures(sweep):
    out = sweep["root"] / "report"
    md = sweep["md"]
    assert md == out / "report.md"
    text = md.read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["growth.png", "heatmap_w_top1_v.png", "loss_curves.png",
                    "objective_vs_params.png", "parallel_coordinates.png", "val_vs_p.png"]
    for name in pngs:
        _assert_png(out / name)
        assert f"]({name})" in text  # every figure is linked
    arms = pd.read_csv(out / "arms.csv")
    assert list(arms["arm"]) == list(FINAL)
    assert arms.loc[arms["arm"] == P1, "final_val_mean"].item() == pytest.approx(
        np.mean(FINAL[P1]))
    trials = pd.read_csv(out / "trials.csv")
    assert len(trials) == 17 and trials.loc[trials["arm"] == BASE, "spikes"].sum() == 2
    assert f"baseline arm `{BASE}`" in text
    assert "2.922 [2.846, 2.999]" in text  # P1 final val loss, mean [t-interval]
    assert "## Skipped" not in text


def test_metric_table_last_step_of_completed_trials(sweep):
    out = pd.read_csv(sweep["root"] / "report" / "metrics.csv")
    row = out[(out["arm"] == PINF) & (out["metric"] == "w.top1_v") & (out["module"] == "q")]
    # seeds 2 and 3 completed; step 100, mean over layers 0.3 + 0.4 + 0.01 seed
    vals = [0.2 + 0.1 + 0.4 + 0.01 * s for s in (2, 3)]
    assert row["n"].item() == 2 and row["step"].item() == 100
    assert row["mean"].item() == pytest.approx(np.mean(vals))


def test_small_spectral_gap_is_flagged(sweep):
    """docs/science.md §4.3 (M2): top-1 continuity with s1/s2 < 1.05 is marked, not trusted."""
    out = pd.read_csv(sweep["root"] / "report" / "metrics.csv")
    top1 = out[out["metric"] == "w.top1_v"].set_index(["arm", "module"])["small_gap"]
    assert top1[(PINF, "q")] == 1.0
    assert (top1.drop(index=(PINF, "q")) == 0.0).all()
    assert out.loc[out["metric"] != "w.top1_v", "small_gap"].isna().all()
    text = (sweep["root"] / "report" / "report.md").read_text()
    assert text.count("\u2020") == 2  # the one flagged cell and its footnote
    assert "s1/s2 < 1.05" in text


def test_report_skips_missing_parts_visibly(tmp_path):
    root = make_sweep(tmp_path, with_metrics=False, with_p=False)
    text = A.write_report(root).read_text()
    skipped = text.split("## Skipped", 1)[1]
    assert "continuity heatmaps: no metric rows" in skipped
    assert "sigma_max(W_Q) growth" in skipped and "max attention logit growth" in skipped
    assert "validation loss vs p: no `model.residual.p` column" in skipped
    assert sorted(p.name for p in (root / "report").glob("*.png")) == [
        "loss_curves.png", "objective_vs_params.png", "parallel_coordinates.png"]
    assert "not logged: the sweep has no mlflow_uri" in text


def test_report_logged_to_mlflow_parent(sweep):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=sweep["uri"])
    names = {Path(f.path).name for f in client.list_artifacts(sweep["parent"], "report")}
    assert {"report.md", "arms.csv", "trials.csv", "loss_curves.png", "growth.png"} <= names
    assert f"logged to MLflow run {sweep['parent']}" in sweep["md"].read_text()


def test_mlflow_without_parent_run_is_one_line(sweep, tmp_path):
    from orchestrator.store.runs import log_report

    data = sweep["data"]
    note = log_report(data.manifest["mlflow_uri"], "other", tmp_path)
    assert note == f"not logged: no parent run tagged geosweep.sweep='other' in {sweep['uri']}"
    absent = f"sqlite:///{tmp_path / 'absent.db'}"
    assert log_report(absent, data.name, tmp_path) == \
        f"not logged: MLflow store {absent} does not exist"
    assert not (tmp_path / "absent.db").exists()  # no empty store created as a side effect
