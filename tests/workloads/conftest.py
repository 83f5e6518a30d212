"""Shared fixtures of the workload tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: on CI's 2 shared cores extra threads only contend (batched LAPACK
    calls ran ~30x slower with 2 threads), and golden losses are pinned with 1 thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
