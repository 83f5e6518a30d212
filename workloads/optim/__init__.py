"""Optimizers: AdamW, and Muon / Manifold Muon for the hidden matrices (docs/science.md §3)."""

from workloads.optim.assignment import (
    CONSTRAINTS,
    MUON_ROLES,
    STRATEGIES,
    resolve_assignment,
    validate_assignment,
)
from workloads.optim.build import (
    ManagedMatrix,
    OptimizerGroupError,
    Optimizers,
    assert_partition,
    build_optimizers,
)
from workloads.optim.muon import Muon, manifold_muon_step, muon_direction, muon_update

__all__ = [
    "CONSTRAINTS",
    "MUON_ROLES",
    "STRATEGIES",
    "ManagedMatrix",
    "Muon",
    "OptimizerGroupError",
    "Optimizers",
    "assert_partition",
    "build_optimizers",
    "manifold_muon_step",
    "muon_direction",
    "muon_update",
    "resolve_assignment",
    "validate_assignment",
]
