"""The MLflow UI in a real browser (issues 7 §6 and 14 §1): ``geosweep ui`` on a finished sweep
with one deliberately diverged trial (lr = 1e30: NaN by step 2, see test_nan_storm.py), opened in
headless Chromium through selenium + chromedriver (Debian's ``chromium`` and ``chromium-driver``).
Through the link ``geosweep ui`` prints, the runs table shows the parent expanded to child runs
named by arm, with parameter and loss columns; the diverged child is Failed; a child's charts
start with the loss section. The same sweep checks one metric vocabulary: its MLflow keys are its
Parquet names (but the documented loss keys) and docs/metrics.md defines every one.

Screenshots go to ``tmp_path``; with ``GEOSWEEP_UPDATE_SCREENSHOT=1`` the runs table also to
``docs/img/mlflow_runs.png`` (the README's picture).
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
  optim.lr: {grid: [3.0e-3, 1.0e30]}
seeds: [0]
search: {algorithm: grid, max_concurrent: 2}
budget: {steps: 12, eval_every: 4, metrics_every: 4}
resources: {workers_per_trial: 1, cpus_per_worker: 1}
"""
ARMS = {"p=2 lr=3e-3 s0": "FINISHED", "p=2 lr=1e30 s0": "FAILED"}


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
    """``geosweep ui`` in its own process group; yields the sweep's link it prints (the shared
    view of its runs table); killed afterwards."""
    port = _free_port()
    log = open(tmp_path / "ui.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "ui", str(sweep),
                             "--port", str(port)], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail("MLflow UI did not come up:\n"
                                + (tmp_path / "ui.log").read_text()[-3000:])
                time.sleep(0.5)
        log.flush()
        link = re.search(r"the sweep's runs: (\S+)", (tmp_path / "ui.log").read_text())
        assert link, (tmp_path / "ui.log").read_text()[-3000:]
        assert link.group(1).startswith(url + "/#/experiments/")
        yield link.group(1)
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


@pytest.mark.timeout(600)
def test_mlflow_ui_renders_the_sweep(sweep: Path, ui: str, browser, tmp_path: Path):
    client, exp, parent, children = _runs(sweep)
    # child runs named by arm; the diverged one FAILED with its reason
    assert {k: r.info.status for k, r in children.items()} == ARMS, sorted(children)
    bad = children["p=2 lr=1e30 s0"]
    assert bad.data.tags["geosweep.reason"].startswith("diverged: "), bad.data.tags
    assert {r.data.tags["mlflow.parentRunId"] for r in children.values()} == {parent.info.run_id}

    # 1. the sweep's link: its runs table with parameter and loss columns
    browser.get(ui)
    _wait(browser, _text_present(parent.info.run_name), what="the parent run")
    def close_panels(d) -> bool:  # the "MLflow Assistant" side panel: not part of what we show
        for close in d.find_elements("css selector", "button[aria-label='Close']"):
            close.click()
        return True

    _wait(browser, close_panels, what="closing side panels")

    def headers(d):
        return [e.text for e in d.find_elements("css selector", "[role=columnheader]")]

    want = {"model.residual.p", "optim.lr", "train.seed", "Loss/val"}
    _wait(browser, lambda d: want <= set(headers(d)), what=f"the columns {sorted(want)}")
    # 2. the parent expanded (the chevron in its name cell) to its children, named by arm
    if not all(name in browser.find_element("tag name", "body").text for name in ARMS):
        def expand(d) -> bool:
            found = d.find_elements("css selector",
                                    "button[data-component-id*='runnamecellrenderer']")
            if found:
                found[0].click()
            return bool(found)

        _wait(browser, expand, what="the nested-runs expander")
    for name in ARMS:
        _wait(browser, _text_present(name), what=f"child run {name}")
    _wait(browser, _text_present("1e+30"), what="the diverged arm's optim.lr cell")
    runs_png = tmp_path / "mlflow_runs.png"
    browser.save_screenshot(str(runs_png))
    assert runs_png.stat().st_size > 10_000

    # 3. the diverged child's page says Failed
    base = ui.split("/#/")[0]
    browser.get(f"{base}/#/experiments/{exp.experiment_id}/runs/{bad.info.run_id}")
    _wait(browser, _text_present("Failed"), what="the diverged run's Failed status")

    # 4. a child's metric charts: the loss section first, its train curve drawn
    ok = children["p=2 lr=3e-3 s0"]
    assert len(client.get_metric_history(ok.info.run_id, "Loss/train")) == 12
    browser.get(f"{base}/#/experiments/{exp.experiment_id}/runs/{ok.info.run_id}/model-metrics")
    titles = _wait(browser, lambda d: (t := _section_titles(d)) and len(t) >= 3 and t,
                   what="the chart sections")
    assert titles[0] == "Loss (2)", titles
    _wait(browser, _text_present(f"{ok.info.run_name} (Loss/train)"),
          what="the Loss/train chart legend")
    # A drawn line, not its exact vertices: plotly simplifies nearly collinear points away, so
    # the segment count is not the step count (12 points, checked in the history above).
    lines = _wait(browser, lambda d: [e for e in d.find_elements("css selector", "svg path.js-line")
                                      if (e.get_attribute("d") or "").count("L") >= 2],
                  what="a drawn loss line")
    assert lines
    browser.save_screenshot(str(tmp_path / "mlflow_metrics.png"))
    if os.environ.get("GEOSWEEP_UPDATE_SCREENSHOT") == "1":
        from PIL import Image

        (ROOT / "docs" / "img").mkdir(parents=True, exist_ok=True)
        img = Image.open(runs_png).convert("RGB")  # small: 1000 px wide, 64-colour palette
        img = img.resize((1000, round(img.height * 1000 / img.width)), Image.LANCZOS)
        img.quantize(64).save(ROOT / "docs" / "img" / "mlflow_runs.png", optimize=True)


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
