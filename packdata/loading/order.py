"""Which batches a loader reads: DataLoader's ``batch_size``/``shuffle``/``sampler``/
``batch_sampler`` arguments, with DataLoader's meanings, turned into one batch sampler."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import BatchSampler, Sampler

from packdata.errors import ArgumentError
from packdata.loading.dataset import PackedDataset
from packdata.loading.sampling import EpochBatchSampler
from packdata.units import iterable_argument


def batch_order(dataset: PackedDataset, batch_size: int | None, sampler: Any, batch_sampler: Any,
                shuffle: bool, drop_last: bool, seed: int) -> Sampler:
    """The batches of indices a loader reads, from DataLoader's arguments as DataLoader reads
    them (``shuffle``, ``drop_last`` and ``seed`` apply to the default order)."""
    iterable_argument("sampler", sampler, "indices")  # else a TypeError inside torch
    iterable_argument("batch_sampler", batch_sampler, "indices")
    if batch_sampler is not None:
        if batch_size is not None or shuffle or sampler is not None or drop_last:
            raise ArgumentError("batch_sampler= gives whole batches: leave out batch_size, "
                                "shuffle, sampler and drop_last (as in DataLoader)")
        return batch_sampler
    if batch_size is None:
        raise ArgumentError("give batch_size (with sampler= for an order of single indices), "
                            "or batch_sampler= for whole batches of indices")
    if sampler is None:
        return EpochBatchSampler(len(dataset), batch_size, shuffle=shuffle, drop_last=drop_last,
                                 seed=seed)
    if shuffle:
        raise ArgumentError("sampler= sets the order: leave out shuffle (as in DataLoader)")
    return IndexBatches(sampler, batch_size, drop_last)


class IndexBatches(BatchSampler):
    """torch's BatchSampler over a ``sampler`` of single indices, refusing one of batches (what
    ``batch_sampler=`` takes) with a line that says so. As with DataLoader, the loop calls the
    sampler's own ``set_epoch`` (e.g. DistributedSampler's)."""

    def __iter__(self) -> Iterator[list[int]]:
        for batch in super().__iter__():
            if np.ndim(batch[0]):
                raise ArgumentError(f"sampler= yields one index at a time (as in DataLoader); "
                                    f"{type(self.sampler).__name__} yields batches: pass it as "
                                    "batch_sampler=")
            yield batch
