"""The MLflow UI in a real browser (issues 7 §6, 14 §1 and 33): ``geosweep ui`` on a finished
real sweep, opened in headless Chromium (Debian's ``chromium`` and ``chromium-driver``, through
selenium) with a fresh profile. The sweep runs three trials one at a time: a completed one, one
ASHA stops at its first rung (it trails the first trial there) and one that diverges (lr = 1e30:
NaN by step 2, see test_nan_storm.py).

What a new user sees, asserted: every page in the model-training view, a run's page reached
without the link's ``workflowType`` included (a control page with the browser switched to GenAI
shows what that would look like), and no Assistant panel; the sweep's runs table flat and sorted
by the objective, the run names, the status and reason columns of the diverged and the stopped
run; the charts view with every trial's loss curve on one chart; the parent's summary on its
page. The same sweep checks one metric vocabulary: its MLflow keys are its Parquet names (but
the documented loss keys) and docs/metrics.md defines every one.

Screenshots go to ``tmp_path``; with ``GEOSWEEP_UPDATE_SCREENSHOT=1`` the runs table and the
charts also to ``docs/img/`` (the README's pictures).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

SPEC = """
name: uisweep
workload:
  preset: gpt-debug
  overrides: {model.residual.family: spheret, optim.grad_clip: 0.0, optim.warmup_steps: 4}
space:
  model.residual.p: {grid: [2.0]}
  optim.lr: {grid: [3.0e-3, 1.0e-4, 1.0e30]}
seeds: [0]
search: {algorithm: grid, max_concurrent: 1}
scheduler: {type: asha, grace_period: 4, reduction_factor: 2, max_t: 12}
budget: {steps: 12, eval_every: 4, metrics_every: 4}
resources: {workers_per_trial: 1, cpus_per_worker: 1}
"""
# one at a time, in grid order: the first trial sets the rung, the second trails it there
ARMS = {"p=2 lr=3e-3 s0": ("FINISHED", "completed"), "p=2 lr=1e-4 s0": ("FINISHED", "stopped"),
        "p=2 lr=1e30 s0": ("FAILED", "diverged")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("ui")
    (tmp / "uisweep.yaml").write_text(SPEC)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run",
                           str(tmp / "uisweep.yaml"), "--out", str(tmp / "out")],
                          capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp / "out" / "uisweep"


@pytest.fixture
def ui(sweep: Path, tmp_path: Path):
    """``geosweep ui`` in its own process group; yields the links it prints once its server
    answers (``base``, the sweep's ``runs`` table and ``charts``); killed afterwards."""
    port = _free_port()
    log = open(tmp_path / "ui.log", "w")  # noqa: SIM115 - closed below
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "ui", str(sweep),
                             "--port", str(port)], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:  # the links are printed only once the server answers
            text = (tmp_path / "ui.log").read_text()
            charts = re.search(r"the sweep's charts:\s+(\S+)", text)
            if charts:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("geosweep ui printed no link:\n" + text[-3000:])
            time.sleep(0.2)
        ready_s = time.monotonic() - t0
        urllib.request.urlopen(url + "/health", timeout=5).read()  # answers at once
        runs = re.search(r"the sweep's runs:\s+(\S+)", text)
        assert runs and runs.group(1).startswith(url + "/#/experiments/"), text
        assert "GET /" not in text, text  # no line per HTTP request
        print(f"geosweep ui: links printed {ready_s:.1f}s after the start")
        yield {"base": url, "runs": runs.group(1), "charts": charts.group(1),
               "ready_s": ready_s}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
        log.close()


@pytest.fixture
def browser(tmp_path: Path):
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1600,1000", f"--user-data-dir={tmp_path / 'chrome'}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver, cond, timeout: float = 60, what: str = ""):
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    # React re-renders the page while it loads: an element found a moment ago may be gone by
    # the time it is read (stale); that is "not yet", so the wait polls again
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.5,
                             ignored_exceptions=(StaleElementReferenceException,)).until(cond)
    except TimeoutException:
        pytest.fail(f"timed out waiting for {what}; page text: "
                    f"{driver.find_element('tag name', 'body').text[:1500]!r}")


def _text_present(text: str):
    return lambda d: text in d.find_element("tag name", "body").text



def _runs(sweep: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{sweep / 'mlflow.db'}")
    exp = client.get_experiment_by_name("uisweep")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId")}
    assert len(parent) == 1, [r.info.run_name for r in runs]
    return client, exp, parent[0], children


def _section_titles(driver) -> list[str]:
    """The chart sections of a run's metrics tab, in page order (``Loss (2)``, ``cont (11)``)."""
    lines = [ln.strip() for ln in driver.find_element("tag name", "body").text.splitlines()]
    # a section header is its name, then its chart count on the next line
    return [f"{lines[i - 1]} {ln}" for i, ln in enumerate(lines)
            if i and re.fullmatch(r"\(\d+\)", ln)]


def _body(d) -> str:
    return d.find_element("tag name", "body").text


def _shot(driver, path: Path) -> Path:
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    return path


# what MLflow 3.17 shows in its GenAI view and not in the model-training one (a run's page:
# the breadcrumb says Evaluations, the sidebar lists the GenAI sections)
GENAI_ONLY = ("Evaluations", "Observability", "Judges")


def _model_training_view(d, what: str) -> None:
    text = _body(d)
    assert not [w for w in GENAI_ONLY if w in text.split("\n")], (what, text[:800])
    assert "MLflow Assistant" not in text, (what, text[:800])
    assert d.execute_script("return localStorage.getItem('mlflow.workflowType_v1')") == \
        '"machine_learning"', what


def _rows(d) -> list[dict[str, str]]:
    """The runs table's rows as {column header: cell text}, in the table's order (ag-grid
    renders each row as a [role=row] with [role=gridcell]s carrying a col-id)."""
    heads = {e.get_attribute("col-id"): e.text for e in
             d.find_elements("css selector", "[role=columnheader][col-id]")}
    rows: dict[int, dict[str, str]] = {}
    for cell in d.find_elements("css selector", "[role=row][row-index] [role=gridcell][col-id]"):
        row = cell.find_element("xpath", "./ancestor::*[@role='row'][1]")
        idx = int(row.get_attribute("row-index"))
        rows.setdefault(idx, {})[heads.get(cell.get_attribute("col-id"),
                                           cell.get_attribute("col-id"))] = cell.text
    return [rows[i] for i in sorted(rows)]


@pytest.mark.timeout(600)
def test_mlflow_ui_shows_the_sweep(sweep: Path, ui: dict, browser, tmp_path: Path):
    client, exp, parent, children = _runs(sweep)
    # child runs named by arm; MLflow status and geosweep status per trial
    assert {k: (r.info.status, r.data.tags["geosweep.status"]) for k, r in children.items()} \
        == ARMS, sorted(children)
    bad, stopped, ok = (children[n] for n in ("p=2 lr=1e30 s0", "p=2 lr=1e-4 s0",
                                               "p=2 lr=3e-3 s0"))
    assert bad.data.tags["geosweep.reason"].startswith("diverged: "), bad.data.tags
    assert stopped.data.tags["geosweep.reason"] == \
        "stopped early by the scheduler (ASHA) at step 4"
    assert {r.data.tags["mlflow.parentRunId"] for r in children.values()} == {parent.info.run_id}
    assert "val/best_loss" not in bad.data.metrics  # no 1.797e308 sentinel (issue 33 §7)
    t_page = time.monotonic()

    # 1. the first link geosweep ui prints: the model-training view, no Assistant panel
    browser.get(ui["base"])
    _wait(browser, _text_present("Welcome to MLflow"), what="MLflow's home page")
    _model_training_view(browser, "home")

    # 2. the sweep's runs: flat, sorted by the objective, status and reason as columns
    browser.get(ui["runs"])
    for name in ARMS:
        _wait(browser, _text_present(name), what=f"child run {name}")
    rows = _wait(browser, lambda d: (r := _rows(d)) and len(r) == 4 and all(
        x.get("geosweep.status") for x in r[:3]) and r, what="the four rows with statuses")
    names = [r.get("Run Name", "").split("\n")[-1].strip() for r in rows]  # after its colour
    # completed 3e-3, then the stopped one (its loss at step 4), then the parent and the
    # diverged one, which have no Loss/val (MLflow sorts them last)
    assert names[:2] == ["p=2 lr=3e-3 s0", "p=2 lr=1e-4 s0"], names
    assert set(names[2:]) == {"uisweep", "p=2 lr=1e30 s0"}, names
    by = dict(zip(names, rows))
    assert by["p=2 lr=1e30 s0"]["geosweep.status"] == "diverged"
    assert by["p=2 lr=1e30 s0"]["geosweep.reason"].startswith("diverged: nonfinite")
    assert by["p=2 lr=1e-4 s0"]["geosweep.status"] == "stopped"
    assert by["p=2 lr=1e-4 s0"]["geosweep.reason"].startswith("stopped early")
    assert by["p=2 lr=3e-3 s0"]["geosweep.status"] == "completed"
    for col in ("Loss/val", "Loss/train", "model.residual.p", "optim.lr", "train.seed"):
        assert col in rows[0], sorted(rows[0])
    assert by["p=2 lr=1e30 s0"]["optim.lr"].startswith("1e+30")
    _model_training_view(browser, "runs table")
    runs_png = _shot(browser, tmp_path / "mlflow_runs.png")

    # 3. the charts: every trial's loss curve on one chart
    browser.get(ui["charts"])
    for name in ARMS:
        _wait(browser, _text_present(f"{name} (Loss/train)"),
              what=f"{name} in the Loss/train chart's legend")
    lines = _wait(browser, lambda d: (ls := [e for e in d.find_elements(
        "css selector", "svg path.js-line") if (e.get_attribute("d") or "").count("L") >= 1])
        and len(ls) >= 4 and ls, what="a loss line per trial (3 train, 2 val at least)")
    assert lines
    charts_png = _shot(browser, tmp_path / "mlflow_charts.png")

    # 4. a run's page reached without the link's workflowType: still model training
    base = ui["base"]
    browser.get(f"{base}/#/experiments/{exp.experiment_id}/runs/{bad.info.run_id}")
    _wait(browser, _text_present("Failed"), what="the diverged run's Failed status")
    _wait(browser, _text_present("diverged: nonfinite"), what="its reason as the description")
    _model_training_view(browser, "a run's page")
    assert "Runs" in _body(browser).split("\n")  # the breadcrumb: experiment > Runs
    _shot(browser, tmp_path / "mlflow_diverged_run.png")
    browser.get(f"{base}/#/experiments/{exp.experiment_id}/runs/{ok.info.run_id}/model-metrics")
    titles = _wait(browser, lambda d: (t := _section_titles(d)) and len(t) >= 3 and t,
                   what="the chart sections")
    assert titles[0] == "Loss (2)", titles
    assert len(client.get_metric_history(ok.info.run_id, "Loss/train")) == 12

    # 5. the parent's summary on its page
    browser.get(f"{base}/#/experiments/{exp.experiment_id}/runs/{parent.info.run_id}")
    _wait(browser, _text_present("3 trials (1 completed, 1 diverged, 1 stopped early by the "
                                 "scheduler)"), what="the parent's summary")
    text = _body(browser)
    assert "Best trial: p=2 lr=3e-3 s0" in text and "sweep/best_objective" in text
    _shot(browser, tmp_path / "mlflow_parent.png")
    print(f"browser: 6 pages in {time.monotonic() - t_page:.0f}s; screenshots in {tmp_path}")

    # control: the same run page with the browser switched to GenAI does show the GenAI view
    # (what a fresh profile got before: issue 33 §1), so the checks above can fail
    browser.execute_script("localStorage.setItem('mlflow.workflowType_v1', '\"genai\"')")
    browser.get(f"{base}/#/experiments/{exp.experiment_id}/runs/{bad.info.run_id}")
    browser.refresh()
    _wait(browser, lambda d: any(w in _body(d).split("\n") for w in GENAI_ONLY),
          what="the GenAI view of the control page")

    if os.environ.get("GEOSWEEP_UPDATE_SCREENSHOT") == "1":
        from PIL import Image

        (ROOT / "docs" / "img").mkdir(parents=True, exist_ok=True)
        for src, name in ((runs_png, "mlflow_runs.png"), (charts_png, "mlflow_charts.png")):
            img = Image.open(src).convert("RGB")  # small: 1000 px wide, a 256-colour palette
            img = img.resize((1000, round(img.height * 1000 / img.width)), Image.LANCZOS)
            img.quantize(256).save(ROOT / "docs" / "img" / name, optimize=True)


@pytest.mark.timeout(600)
def test_one_metric_vocabulary(sweep: Path):
    """MLflow keys == Parquet names (trials/ slash columns, curves/ <split>/<metric>) mapped by
    the documented exceptions; every name (and the parent's) is defined in docs/metrics.md."""
    from orchestrator.store.mlflow_names import MLFLOW_KEYS, mlflow_key
    from orchestrator.store.parquet import read_curves, read_trials

    client, _, parent, children = _runs(sweep)
    trials = read_trials(str(sweep / "parquet"), sweep="uisweep")
    curves = read_curves(str(sweep / "parquet"), sweep="uisweep")
    for name, run in children.items():
        tid = run.data.tags["geosweep.trial_id"]
        row = trials[trials["trial"] == tid].iloc[0]
        cols = {c for c in trials.columns if "/" in c and row[c] == row[c]}  # not NaN
        cur = curves[curves["trial"] == tid]
        names = cols | set(cur["split"] + "/" + cur["metric"])
        assert set(run.data.metrics) == {mlflow_key(n) for n in names}, name
    ok = children["p=2 lr=3e-3 s0"].data.metrics
    assert {"Loss/train", "Loss/val", "train/lr", "cont/resid_top1_mean"} <= set(ok)
    assert not set(MLFLOW_KEYS) & set(ok)  # the vocabulary names are not logged twice

    doc = (ROOT / "docs" / "metrics.md").read_text()
    for old, new in MLFLOW_KEYS.items():
        assert f"`{old}` → `{new}`" in doc  # the exceptions are documented
    tokens = set(re.findall(r"`([^`\s]+)`", doc))
    # a placeholder such as <k> or <d> stands for one name part (stream/a/<k>: stream/a/0)
    # (a token that is only placeholders, such as <section>/<name>, defines nothing)
    pats = [re.compile(re.sub(r"<[^>]+>", "[A-Za-z0-9_]+", re.escape(t)))
            for t in tokens if "<" in t and re.search(r"\w", re.sub(r"<[^>]+>", "", t))]
    allkeys = set(parent.data.metrics) | {k for r in children.values() for k in r.data.metrics}
    vocab = {next((o for o, n in MLFLOW_KEYS.items() if n == k), k) for k in allkeys}
    undefined = sorted(k for k in vocab
                       if k not in tokens and not any(p.fullmatch(k) for p in pats))
    assert not undefined, f"names docs/metrics.md does not define: {undefined}"
