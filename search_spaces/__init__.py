"""Shipped sweep specs (package data): ``spec_path(name)`` and ``list_specs()``.

Load and validate one with ``orchestrator.spec.yaml_reader.load_spec(name_or_path)``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SPEC_DIR", "spec_path", "list_specs"]

SPEC_DIR = Path(__file__).resolve().parent


def list_specs() -> list[str]:
    """Names of the shipped specs, sorted."""
    return sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))


def spec_path(name: str) -> Path:
    """The YAML file of a shipped spec; ``FileNotFoundError`` (one line) for an unknown name."""
    path = SPEC_DIR / f"{name}.yaml"
    if "/" in name or "\\" in name or not path.is_file():
        raise FileNotFoundError(f"no shipped spec {name!r}; shipped: {', '.join(list_specs())}")
    return path
