"""Batch samplers: which indices go in each batch, per epoch, per DDP rank.

Every sampler here yields lists of indices (one list per batch) so the Dataset reads each batch
with one vectorised call. Shuffling is a pure function of ``(seed, epoch)``: the same seed gives the
same batches on every rank and in every run.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch.distributed as dist
from torch.utils.data import Sampler


def ddp_rank_world() -> tuple[int, int]:
    """(rank, world size) of the default process group, or (0, 1) outside DDP."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class EpochBatchSampler(Sampler[list[int]]):
    """Shuffled (or sequential) batches of indices, split across DDP ranks.

    Each epoch draws a permutation from ``seed + epoch``; rank ``r`` of ``w`` takes every ``w``-th
    index of it, padded by wrapping so all ranks get the same number of batches unless
    ``drop_last``. The epoch advances by one each time iteration starts, or is set with
    :meth:`set_epoch`.
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
        default_rank, default_world = ddp_rank_world()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world size {self.world_size}")
        self.size = size
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.epoch = 0
        self._next_epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self._next_epoch = epoch

    def indices(self, epoch: int) -> np.ndarray:
        """This rank's indices for ``epoch``, in order."""
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.size)
        else:
            order = np.arange(self.size)
        if self.world_size > 1:
            per_rank = -(-self.size // self.world_size)
            if self.drop_last:
                per_rank = self.size // self.world_size
                order = order[: per_rank * self.world_size]
            else:
                order = np.resize(order, per_rank * self.world_size)  # wrap to even shares
            order = order[self.rank :: self.world_size]
        return order

    def __iter__(self) -> Iterator[list[int]]:
        self.epoch = self._next_epoch
        self._next_epoch += 1
        order = self.indices(self.epoch)
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        for start in range(0, stop, self.batch_size):
            yield order[start : start + self.batch_size].tolist()

    def __len__(self) -> int:
        n = self.size // self.world_size if self.drop_last else -(-self.size // self.world_size)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
