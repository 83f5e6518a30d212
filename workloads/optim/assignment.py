"""Which constraint each Muon-managed matrix lives on; docs/science.md §3.4.

``optim.manifold.assignment`` is a strategy name (Paper B's ``--manifold`` arms) or an explicit
``{pattern: constraint}`` dict. A pattern is an fnmatch pattern tried against the parameter name
(``blocks.*.attn.c_attn.weight``), its role (``qkv``, ``down``, ``hidden``) and its kind
(``attention``, ``mlp``); the first matching pattern wins, unmatched matrices stay ``none``.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any, Protocol

import torch

from workloads.choices import STRATEGIES, validate_assignment
from workloads.config import ConfigError
from workloads.geometry.manifolds import MANIFOLDS

__all__ = [
    "CONSTRAINTS",
    "MUON_ROLES",
    "STRATEGIES",
    "MatrixRoleLike",
    "matrix_kind",
    "validate_assignment",
    "resolve_assignment",
]

# the registry's keys; validation reads the same names from workloads/choices.py (torch-free),
# which tests/workloads/test_choices.py keeps equal to these
CONSTRAINTS = tuple(MANIFOLDS)
# Hidden matrices go to Muon; io matrices (roles in/out) and embeddings stay on AdamW.
_ATTENTION_ROLES = frozenset({"qkv", "q", "k", "v", "o"})
_MLP_ROLES = frozenset({"fc", "proj", "gate", "up", "down", "hidden"})
MUON_ROLES = _ATTENTION_ROLES | _MLP_ROLES
_KEY = "optim.manifold.assignment"


class MatrixRoleLike(Protocol):
    """``MatrixRole(name, param, role, layer, kind)`` of docs/contracts.md."""

    name: str
    param: torch.nn.Parameter
    role: str
    layer: int
    kind: str


def matrix_kind(mr: MatrixRoleLike) -> str:
    """``attention`` or ``mlp``: the model's ``kind`` when it says so, else from the role."""
    if mr.kind in ("attention", "mlp"):
        return mr.kind
    return "attention" if mr.role in _ATTENTION_ROLES else "mlp"


def _matches(pattern: str, mr: MatrixRoleLike) -> bool:
    return any(fnmatchcase(s, pattern) for s in (mr.name, mr.role, matrix_kind(mr)))


def resolve_assignment(roles: list[MatrixRoleLike], assignment: Any) -> dict[str, str]:
    """``{param name: constraint}`` for the Muon-managed ``roles`` (roles in ``MUON_ROLES``).

    A pattern that matches no managed matrix is an error: it is almost always a typo.
    """
    validate_assignment(assignment)
    if isinstance(assignment, str):
        table = STRATEGIES[assignment]
        return {mr.name: table[matrix_kind(mr)] for mr in roles}
    out: dict[str, str] = {}
    for mr in roles:
        hits = [c for pattern, c in assignment.items() if _matches(pattern, mr)]
        out[mr.name] = hits[0] if hits else "none"
    unused = [p for p in assignment if not any(_matches(p, mr) for mr in roles)]
    if unused:
        example = roles[0].name if roles else "(no managed matrices)"
        raise ConfigError(
            f"{_KEY}: pattern {unused[0]!r} matches no Muon-managed matrix "
            f"(names look like {example!r}; roles {', '.join(sorted(MUON_ROLES))})"
        )
    return out
