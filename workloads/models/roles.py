"""``MatrixRole``: one weight matrix of a model and what it does (docs/contracts.md "Models").

Its own module so that the models (gpt.py, mlp.py) and the package that builds them
(``workloads.models.build_model``) import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

__all__ = ["MatrixRole"]


@dataclass
class MatrixRole:
    """One weight matrix (nn.Linear layout, out x in) and what it does."""

    name: str  # parameter name, e.g. "blocks.3.attn.c_attn.weight"
    param: nn.Parameter
    role: str  # qkv q k v o fc proj gate up down hidden in out
    layer: int  # block index, 0-based (inputs: -1, outputs: n_layer)
    kind: str  # attention | mlp | io
