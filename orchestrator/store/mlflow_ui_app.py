"""The MLflow UI server of ``geosweep ui``: MLflow's own app, opening in the model-training view.

What MLflow 3.17's UI reads to choose its view (read from the installed bundle,
``mlflow/server/js/build``; there is no server setting for it):

- the GenAI / model-training switch: the URL's ``workflowType`` query parameter, else the
  browser's ``localStorage`` key ``mlflow.workflowType_v1``, else GenAI. The experiment tag
  ``mlflow.experimentKind`` is not read while the switch is shown (always, in 3.17), and a
  link's ``workflowType`` is dropped by the next click inside the UI (a run's page, the
  breadcrumb), so a fresh browser lands on GenAI pages whatever the first link said;
- the Assistant side panel opens by itself on a localhost UI's first visit unless
  ``localStorage`` holds ``mlflow.assistant.fab.autoOpenedOnFirstLoad_v1``.

So the page MLflow serves for every UI route (``index.html``; the UI routes by ``#/...``) is
served with one inline script (``mlflow_names.seed_script``) that sets those two keys when the
browser has none: every page
of a fresh profile opens in the model-training view with the Assistant closed, and a user who
flips the switch keeps their choice (the key is theirs from then on). Everything else is
MLflow's app unchanged. MLflow starts it by name (``mlflow server --app-name geosweep``, the
``mlflow.app`` entry point in pyproject.toml).
"""

from __future__ import annotations

import os

import mlflow  # noqa: F401  (first: mlflow.server imported on its own meets a half-built mlflow)
from flask import Response
from mlflow.server import app as flask_app
from mlflow.server.fastapi_app import app

from orchestrator.store.mlflow_names import seed_script

__all__ = ["app"]


def _index_html() -> str:
    with open(os.path.join(flask_app.static_folder, "index.html"), encoding="utf-8") as f:
        html = f.read()
    head = html.find("<head>")
    if head < 0:  # not the page this module knows: serve it as MLflow would
        return html
    cut = head + len("<head>")
    return html[:cut] + seed_script() + html[cut:]


def _serve() -> Response:
    # read per request (a few kB): an MLflow upgraded under a running server serves its own page
    return Response(_index_html(), mimetype="text/html",
                    headers={"Cache-Control": "no-cache"})


# MLflow's "/" route (mlflow/server/__init__.py), looked up per request by Flask: replaced
# before the server takes its first one
if "serve" in flask_app.view_functions:
    flask_app.view_functions["serve"] = _serve
