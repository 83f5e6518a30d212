"""`geosweep list [WHAT]`: what a spec or ``train --set`` can name, read from the registries
(presets, shipped specs, residual families, optimizers, manifolds, assignment strategies)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["SECTIONS", "listing", "cmd_list"]


def _presets() -> list[tuple[str, str]]:
    from workloads.config import PRESETS

    return [(k, _first_line(f.__doc__))
            for k, f in PRESETS.items()]


def _specs() -> list[tuple[str, str]]:
    from orchestrator.spec.yaml_reader import load_spec_data
    from search_spaces import list_specs

    return [(n, str(load_spec_data(n).get("description") or "")) for n in list_specs()]


def _families() -> list[tuple[str, str]]:
    from workloads.residual import RESIDUALS

    return [(k, _first_line(c.__doc__)) for k, c in RESIDUALS.items()]


def _optimizers() -> list[tuple[str, str]]:
    from workloads.config import preset
    from workloads.validate import choices

    notes = {"muon": "Muon on hidden matrices (+ optim.manifold: Manifold Muon), AdamW elsewhere"}
    return [(k, notes.get(k, "")) for k in choices(preset("gpt-debug"))["optim.name"]]


def _manifolds() -> list[tuple[str, str]]:
    from workloads.geometry.manifolds import MANIFOLDS

    return [(k, _first_line(type(m).__doc__)) for k, m in MANIFOLDS.items()]


def _assignments() -> list[tuple[str, str]]:
    from workloads.optim.assignment import STRATEGIES

    return [(k, ", ".join(f"{kind}: {c}" for kind, c in v.items()))
            for k, v in STRATEGIES.items()]


SECTIONS: dict[str, tuple[str, Callable[[], list[tuple[str, str]]]]] = {
    "presets": ("workload presets (train --preset, workload.preset)", _presets),
    "specs": ("shipped sweep specs (geosweep run NAME)", _specs),
    "families": ("residual families (model.residual.family)", _families),
    "optimizers": ("optimizers (optim.name)", _optimizers),
    "manifolds": ("manifolds (constraints of optim.manifold.assignment)", _manifolds),
    "assignments": ("assignment strategies (optim.manifold.assignment)", _assignments),
}


def _first_line(doc: str | None) -> str:
    """A docstring's first sentence, whole: its first paragraph up to the first full stop
    that ends a sentence (a docstring's first line can stop mid-sentence: issue 33 §16)."""
    import re

    para = " ".join(ln.strip() for ln in (doc or "").strip().split("\n\n")[0].splitlines())
    end = re.search(r"[.!?](?=\s+[A-Z(]|$)", para)
    return para[: end.end()] if end else para


def listing(what: str | None = None) -> str:
    """The text ``geosweep list [what]`` prints."""
    lines: list[str] = []
    for key, (title, rows_fn) in SECTIONS.items():
        if what not in (None, key):
            continue
        rows = rows_fn()
        width = max(len(n) for n, _ in rows)
        lines.append(f"{title}:")
        lines += [f"  {n:<{width}}  {d}".rstrip() for n, d in rows]
    return "\n".join(lines)


def cmd_list(args: argparse.Namespace) -> int:
    print(listing(args.what))
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("list", help="list presets, shipped specs, residual families, "
                       "optimizers, manifolds and assignment strategies")
    c.add_argument("what", nargs="?", choices=tuple(SECTIONS), default=None,
                   help="one section only (default: all)")
    c.set_defaults(fn=cmd_list)
