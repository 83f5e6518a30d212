"""The CLI's one error: a user mistake, printed as one line with exit code 2 (``main``)."""

from __future__ import annotations

import argparse

__all__ = ["UsageError", "Parser"]


class UsageError(Exception):
    """A user mistake: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse prints a usage block before its error; ours is the one line (see main)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)
