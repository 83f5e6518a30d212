"""Batches with a resumable random state.

``TokenBatcher``: nanoGPT-style windows at random offsets of a token stream; each rank draws
from its own generator seeded by (seed, rank). ``ArrayBatcher``: epoch-wise shuffles of a
labelled array; the permutation is shared by all ranks (seeded by ``seed`` only) and each rank
takes a disjoint stride of it, so together they see every example once per epoch.
Both ``state_dict()`` -> ``load_state_dict()`` resume the exact same batch sequence.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from workloads.data.cache import DataError

__all__ = ["TokenBatcher", "ArrayBatcher", "eval_batches", "eval_array_batches", "rank_seed"]


def rank_seed(seed: int, rank: int) -> int:
    """A 63-bit seed per (seed, rank); distinct ranks never share a stream."""
    x = (int(seed) * 0x9E3779B97F4A7C15 + int(rank) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x ^= x >> 31
    return x & ((1 << 63) - 1)


def _windows(tokens: np.ndarray, starts: torch.Tensor, block_size: int):
    # (B, T+1) int64 rows tokens[s : s + T + 1]; y is x shifted by one
    rows = np.stack([tokens[s : s + block_size + 1] for s in starts.tolist()]).astype(np.int64)
    buf = torch.from_numpy(rows)
    return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()


def _check_len(tokens: np.ndarray, block_size: int) -> None:
    if len(tokens) < block_size + 1:
        raise DataError(
            f"data.corpus: {len(tokens)} tokens in this split, fewer than block_size + 1 = "
            f"{block_size + 1}; raise data.max_tokens or lower model.block_size"
        )


class TokenBatcher:
    """Random (x, y) windows: ``next() -> (B, T), (B, T)`` int64 CPU tensors."""

    def __init__(self, tokens: np.ndarray, batch_size: int, block_size: int, seed: int,
                 rank: int = 0, world_size: int = 1) -> None:
        _check_len(tokens, block_size)
        self.tokens, self.batch_size, self.block_size = tokens, batch_size, block_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.generator = torch.Generator().manual_seed(rank_seed(seed, rank))
        self.step = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(self.tokens) - self.block_size, (self.batch_size,),
                               generator=self.generator)
        self.step += 1
        return _windows(self.tokens, starts, self.block_size)

    __next__ = next

    def __iter__(self) -> TokenBatcher:
        return self

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "step": self.step,
                "seed": self.seed, "rank": self.rank}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.step = int(state["step"])


def eval_batches(tokens: np.ndarray, n: int, batch_size: int, block_size: int,
                 seed: int = 1234) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` fixed batches; the same for every trial with the same split and shapes."""
    _check_len(tokens, block_size)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        starts = torch.randint(len(tokens) - block_size, (batch_size,), generator=g)
        out.append(_windows(tokens, starts, block_size))
    return out


class ArrayBatcher:
    """Shuffled minibatches of (x, y) arrays, epoch by epoch; the last batch may be short."""

    def __init__(self, x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor,
                 batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        self.x, self.y = torch.as_tensor(x), torch.as_tensor(y)
        if len(self.x) != len(self.y):
            raise ValueError(f"x has {len(self.x)} rows but y has {len(self.y)}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        # every rank gets the same number of examples (and so of steps): drop the remainder
        self.per_rank = len(self.x) // world_size
        if self.per_rank == 0:
            raise DataError(f"data: {len(self.x)} examples cannot be shared by {world_size} ranks")
        self.steps_per_epoch = math.ceil(self.per_rank / batch_size)
        self.generator = torch.Generator().manual_seed(int(seed))
        self.epoch, self.position = 0, 0
        self._start_epoch()

    def _start_epoch(self) -> None:
        # the generator state *before* drawing this epoch's permutation is what we checkpoint
        self._epoch_state = self.generator.get_state()
        perm = torch.randperm(len(self.x), generator=self.generator)
        self._index = perm[: self.per_rank * self.world_size][self.rank :: self.world_size]

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position >= self.steps_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
            self._start_epoch()
        i = self.position * self.batch_size
        idx = self._index[i : i + self.batch_size]
        self.position += 1
        return self.x[idx], self.y[idx]

    __next__ = next

    def __iter__(self) -> ArrayBatcher:
        return self

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "generator": self._epoch_state,
                "seed": self.seed, "rank": self.rank, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self._start_epoch()
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def eval_array_batches(x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor,
                       batch_size: int, n: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``n`` (0: all) consecutive batches, unshuffled, e.g. the whole test set."""
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    stops = range(0, len(x), batch_size)
    if n:
        stops = stops[:n]
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in stops]
