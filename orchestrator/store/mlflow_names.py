"""How geosweep's metric vocabulary (docs/metrics.md) reads in the MLflow UI.

One vocabulary: an MLflow metric key is the name Parquet uses (``trials/`` slash columns,
``curves/`` ``<split>/<metric>``) with ONE documented exception, the loss curves:
``train/loss`` -> ``Loss/train`` and ``val/loss`` -> ``Loss/val``. MLflow 3 draws a run's (and an
experiment's) charts in sections named by the key's part before its last ``/``, sorted by plain
code-unit order (upper case before lower case), with un-sectioned keys last; so ``Loss`` is the
first section and the loss curves are the first charts, above the ~40 ``cont/``, ``inst/`` and
``stream/`` diagnostics (docs/platform.md, "MLflow UI").

The sweep's view: MLflow's "share view" mechanism reads a UI state (selected table columns,
the sort, the runs the charts show) from the experiment tag ``mlflow.sharedViewState.<key>`` when
the URL carries ``?viewStateShareKey=<key>``. geosweep writes one per sweep so that ``geosweep
ui`` can print a link to the runs table (or the charts) of the sweep. What MLflow 3.17 does
with it (read from its UI bundle): the rows' expanded state is NOT taken from a shared view
(``runsExpanded`` is dropped), and children are nested under their parent only while the
table is sorted by start time with no filter. So the view sorts by the objective (ascending
when minimised): the table is flat, every trial a row in objective order (the parent, which
has no curve, last), and every trial's loss curve is drawn on the same chart
(``runsHiddenMode: SHOW_ALL``; MLflow's default charts only the first 10 rows). Columns: the
trial's geosweep status (completed, stopped, diverged, failed) and its reason, the searched
parameters (+ seed), the objective and the two loss curves.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

__all__ = ["MLFLOW_KEYS", "mlflow_key", "VIEW_TAG_PREFIX", "view_key", "view_state",
           "view_url", "run_link", "WORKFLOW_QUERY", "UI_APP", "UI_DEFAULTS", "seed_script"]

# vocabulary name -> MLflow key (the only names that differ; see the module docstring)
MLFLOW_KEYS = {"train/loss": "Loss/train", "val/loss": "Loss/val"}
VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # MLflow's own tag prefix for shared views
UI_APP = "geosweep"  # the mlflow.app entry point geosweep ui serves (store/mlflow_ui_app.py)


def mlflow_key(name: str) -> str:
    """The MLflow key of a vocabulary name (the name itself but for the loss curves)."""
    return MLFLOW_KEYS.get(name, name)


def view_key(sweep: str) -> str:
    """The share key of a sweep's view (URL-safe)."""
    return "geosweep-" + re.sub(r"[^A-Za-z0-9_-]", "-", sweep)


def _col(kind: str, key: str) -> str:
    return f"{kind}.`{key}`"  # MLflow's canonical column id (makeCanonicalSortKey)


def view_state(params: Iterable[str], parent_run_id: str | None = None,
               objective: str = "val/loss", mode: str = "min") -> str:
    """The shared view as JSON: runs sorted by the objective (flat: see the module docstring),
    all of them charted; columns, in this order: status and reason, the objective and the two
    loss curves, every searched parameter (+ seed), the duration. Number columns are sized to
    show 4-5 significant digits (MLflow 3.17's runs table prints a stored double in full and
    has no display precision; the cell's tooltip and the run's page keep every digit).
    ``parent_run_id``: kept for callers; MLflow ignores a shared view's expanded rows."""
    metrics = list(dict.fromkeys([mlflow_key(objective), MLFLOW_KEYS["val/loss"],
                                  MLFLOW_KEYS["train/loss"]]))
    status, why = _col("tags", "geosweep.status"), _col("tags", "geosweep.reason")
    nums = [_col("metrics", m) for m in metrics] + [_col("params", p) for p in params]
    cols = [status, why, *nums, _col("attributes", "Duration")]
    widths = {status: 100, why: 330, **dict.fromkeys(nums, 92)}
    state = {"selectedColumns": cols, "columnOrder": cols, "columnWidths": widths,
             "runsHiddenMode": "SHOW_ALL",
             "orderByKey": _col("metrics", mlflow_key(objective)),
             "orderByAsc": mode != "max"}
    return json.dumps(state)


# MLflow 3's UI has a GenAI / model-training switch in its sidebar, taken from the link's
# ``workflowType`` query parameter, else from the browser's last choice (GenAI by default);
# our experiments are model training, so every link we print says so
WORKFLOW_QUERY = "workflowType=machine_learning"


def view_url(base: str, experiment_id: str, sweep: str, mode: str = "TABLE") -> str:
    """The link that opens the sweep's runs with its shared view applied: the table
    (``mode="TABLE"``) or the charts (``"CHART"``: the runs list beside every metric's chart)."""
    url = (f"{base}/#/experiments/{experiment_id}/runs?viewStateShareKey={view_key(sweep)}"
           f"&{WORKFLOW_QUERY}")
    return url if mode == "TABLE" else f"{url}&compareRunsMode={mode}"


def run_link(experiment_id: str, run_id: str) -> str:
    """A run's page, relative to the UI's address (``#/...``), in the model-training view."""
    return f"#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW_QUERY}"


# What a fresh browser of geosweep's UI server starts with (store/mlflow_ui_app.py: what MLflow
# 3.17's UI reads): localStorage key -> value, set only where the browser has none
UI_DEFAULTS = {"mlflow.workflowType_v1": "machine_learning",
               "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True}


def seed_script(defaults: dict = UI_DEFAULTS) -> str:
    """The inline ``<script>`` that sets the defaults a browser lacks (before MLflow's code)."""
    pairs = json.dumps({k: json.dumps(v) for k, v in defaults.items()})
    return ("<script>(function(d){try{for(var k in d){if(localStorage.getItem(k)===null)"
            f"localStorage.setItem(k,d[k]);}}}}catch(e){{}}}})({pairs});</script>")
