"""The matrices ``MetricsCollector`` measures: each role stacked over layers (``_Group``).

Split out of workloads/metrics/collect.py to keep files small. GPT's fused ``c_attn`` (rows
[Q; K; V]) becomes three groups q, k, v; io matrices are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from workloads.metrics import continuity as C
from workloads.metrics.summary import RESIDUAL_SIDES

__all__ = ["STACKED_ROLES"]

STACKED_ROLES = frozenset(RESIDUAL_SIDES) | {"qkv"}


@dataclass
class _Group:
    """One role stacked over layers; ``rows`` slices a fused parameter (qkv)."""

    label: str
    layers: list[int]
    params: list[nn.Parameter]
    rows: slice | None = None

    def weights(self) -> Tensor:  # (L, m, n) fp32
        return torch.stack([C.as_float(self._cut(p.detach())) for p in self.params])

    def grads(self) -> list[Tensor] | None:
        if any(p.grad is None for p in self.params):
            return None
        return [self._cut(p.grad) for p in self.params]

    def _cut(self, t: Tensor) -> Tensor:
        return t if self.rows is None else t[self.rows]

    def pairs(self) -> list[int]:
        """Indices i with layers[i + 1] == layers[i] + 1 (adjacent layers)."""
        return [i for i in range(len(self.layers) - 1) if self.layers[i + 1] == self.layers[i] + 1]


def _build_groups(roles: list) -> list[_Group]:
    by_key: dict[tuple[str, str], list] = {}
    for mr in roles:
        if mr.role in STACKED_ROLES and mr.param.dim() == 2:
            by_key.setdefault((mr.role, mr.kind), []).append(mr)
    role_count: dict[str, int] = {}
    for role, _ in by_key:
        role_count[role] = role_count.get(role, 0) + 1
    groups = []
    for (role, kind), mrs in by_key.items():
        mrs = sorted(mrs, key=lambda mr: mr.layer)
        layers, params = [mr.layer for mr in mrs], [mr.param for mr in mrs]
        if role == "qkv":
            d = params[0].shape[0] // 3
            for j, r in enumerate("qkv"):
                groups.append(_Group(r, layers, params, slice(j * d, (j + 1) * d)))
        else:
            label = role if role_count[role] == 1 else f"{kind}_{role}"
            groups.append(_Group(label, layers, params))
    return groups
