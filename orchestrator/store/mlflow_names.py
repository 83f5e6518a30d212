"""How geosweep's metric vocabulary (docs/metrics.md) reads in the MLflow UI.

One vocabulary: an MLflow metric key is the name Parquet uses (``trials/`` slash columns,
``curves/`` ``<split>/<metric>``) with ONE documented exception, the loss curves:
``train/loss`` -> ``Loss/train`` and ``val/loss`` -> ``Loss/val``. MLflow 3 draws a run's (and an
experiment's) charts in sections named by the key's part before its last ``/``, sorted by plain
code-unit order (upper case before lower case), with un-sectioned keys last; so ``Loss`` is the
first section and the loss curves are the first charts, above the ~40 ``cont/``, ``inst/`` and
``stream/`` diagnostics (docs/platform.md, "MLflow UI").

The sweep's view: MLflow's "share view" mechanism reads a UI state (selected table columns,
expanded rows) from the experiment tag ``mlflow.sharedViewState.<key>`` when the URL carries
``?viewStateShareKey=<key>``. geosweep writes one per sweep so that ``geosweep ui`` can print a
link whose runs table shows the searched parameters and the losses next to each arm's name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

__all__ = ["MLFLOW_KEYS", "mlflow_key", "VIEW_TAG_PREFIX", "view_key", "view_state",
           "view_url", "run_link", "WORKFLOW_QUERY"]

# vocabulary name -> MLflow key (the only names that differ; see the module docstring)
MLFLOW_KEYS = {"train/loss": "Loss/train", "val/loss": "Loss/val"}
VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # MLflow's own tag prefix for shared views


def mlflow_key(name: str) -> str:
    """The MLflow key of a vocabulary name (the name itself but for the loss curves)."""
    return MLFLOW_KEYS.get(name, name)


def view_key(sweep: str) -> str:
    """The share key of a sweep's view (URL-safe)."""
    return "geosweep-" + re.sub(r"[^A-Za-z0-9_-]", "-", sweep)


def _col(kind: str, key: str) -> str:
    return f"{kind}.`{key}`"  # MLflow's canonical column id (makeCanonicalSortKey)


def view_state(params: Iterable[str], parent_run_id: str | None,
               objective: str = "val/loss") -> str:
    """The shared view as JSON: the parent expanded to its children; columns: status-bearing
    attributes, every searched parameter (+ seed), the objective and the two loss curves."""
    metrics = dict.fromkeys([mlflow_key(objective), MLFLOW_KEYS["val/loss"],
                             MLFLOW_KEYS["train/loss"]])
    cols = [_col("attributes", "Duration")] + [_col("params", p) for p in params]
    cols += [_col("metrics", m) for m in metrics]
    state = {"selectedColumns": cols,
             "runsExpanded": {parent_run_id: True} if parent_run_id else {}}
    return json.dumps(state)


# MLflow 3's UI has a GenAI / model-training switch in its sidebar, taken from the link's
# ``workflowType`` query parameter, else from the browser's last choice (GenAI by default);
# our experiments are model training, so every link we print says so
WORKFLOW_QUERY = "workflowType=machine_learning"


def view_url(base: str, experiment_id: str, sweep: str) -> str:
    """The link that opens the sweep's runs table with its shared view applied."""
    return (f"{base}/#/experiments/{experiment_id}/runs?viewStateShareKey={view_key(sweep)}"
            f"&{WORKFLOW_QUERY}")


def run_link(experiment_id: str, run_id: str) -> str:
    """A run's page, relative to the UI's address (``#/...``), in the model-training view."""
    return f"#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW_QUERY}"
