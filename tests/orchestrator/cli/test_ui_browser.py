"""The MLflow UI in a real browser (issue 7, section 6): ``geosweep ui`` on a finished sweep,
opened in headless Chromium through selenium + chromedriver (Debian's ``chromium`` and
``chromium-driver``), shows the sweep's experiment, its parent run, its child runs nested under
it, and a metric chart of a child run.

The screenshot goes to ``tmp_path``; with ``GEOSWEEP_UPDATE_SCREENSHOT=1`` also to
``docs/img/mlflow_ui.png`` (the README's picture).
"""

from __future__ import annotations

import os
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
workload: {preset: gpt-debug}
space: {optim.lr: {grid: [1.0e-3, 3.0e-3]}}
seeds: [0]
search: {algorithm: grid, max_concurrent: 2}
budget: {steps: 12, eval_every: 4, metrics_every: 0}
resources: {workers_per_trial: 1, cpus_per_worker: 1}
"""


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
    """``geosweep ui`` in its own process group; yields its base URL; killed afterwards."""
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
        yield url
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
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.5).until(cond)
    except TimeoutException:
        pytest.fail(f"timed out waiting for {what}; page text: "
                    f"{driver.find_element('tag name', 'body').text[:1500]!r}")


def _text_present(text: str):
    return lambda d: text in d.find_element("tag name", "body").text


@pytest.mark.timeout(600)
def test_mlflow_ui_renders_the_sweep(sweep: Path, ui: str, browser, tmp_path: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{sweep / 'mlflow.db'}")
    exp = client.get_experiment_by_name("uisweep")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(parent) == 1 and len(children) == 2
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent[0].info.run_id}

    # 1. the experiment list names the sweep's experiment
    browser.get(f"{ui}/#/experiments")
    _wait(browser, _text_present("uisweep"), what="the experiment in the list")

    # 2. its runs table: the parent run, expanded (the chevron in its name cell) to its children
    browser.get(f"{ui}/#/experiments/{exp.experiment_id}/runs")
    _wait(browser, _text_present(parent[0].info.run_name), what="the parent run")
    for close in browser.find_elements("css selector", "button[aria-label='Close']"):
        close.click()  # the "MLflow Assistant" side panel: not part of what we show
    expander = _wait(browser, lambda d: d.find_elements(
        "css selector", "button[data-component-id*='runnamecellrenderer']"),
        what="the nested-runs expander")
    expander[0].click()
    for c in children:
        _wait(browser, _text_present(c.info.run_name), what=f"child run {c.info.run_name}")
    runs_png = tmp_path / "mlflow_ui.png"
    browser.save_screenshot(str(runs_png))

    # 3. a child run's model-metrics tab draws its loss curve (plotly: an svg path per line)
    child = children[0]
    assert "train/loss" in child.data.metrics, sorted(child.data.metrics)
    n_points = len(client.get_metric_history(child.info.run_id, "train/loss"))
    assert n_points == 12
    browser.get(f"{ui}/#/experiments/{exp.experiment_id}/runs/{child.info.run_id}/model-metrics")
    # a run has dozens of metric charts, drawn lazily as they scroll into view: filter
    search = _wait(browser, lambda d: d.find_elements(
        "css selector", "input[placeholder*='earch metric']"), what="the chart search box")
    search[0].send_keys("train/loss")
    _wait(browser, _text_present(f"{child.info.run_name} (train/loss)"),
          what="the train/loss chart legend")
    lines = _wait(browser, lambda d: [e for e in d.find_elements("css selector", "svg path.js-line")
                                      if (e.get_attribute("d") or "").count("L") == n_points - 1],
                  what="a drawn loss line")
    assert lines
    browser.save_screenshot(str(tmp_path / "mlflow_metrics.png"))
    assert runs_png.stat().st_size > 10_000
    if os.environ.get("GEOSWEEP_UPDATE_SCREENSHOT") == "1":
        (ROOT / "docs" / "img").mkdir(parents=True, exist_ok=True)
        shutil.copy(runs_png, ROOT / "docs" / "img" / "mlflow_ui.png")
