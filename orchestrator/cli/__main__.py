"""`python -m orchestrator.cli`: the `geosweep` command."""

from orchestrator.cli import entry

entry()
