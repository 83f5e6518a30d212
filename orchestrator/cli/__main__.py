"""`python -m orchestrator.cli`: the `geosweep` command."""

import sys

from orchestrator.cli import main

sys.exit(main())
