"""A DataLoader configured for packed datasets: whole batches read in one call."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from packdata.dataset import PackedDataset
from packdata.sampling import EpochBatchSampler


def loader(
    dataset: PackedDataset,
    batch_size: int,
    *,
    shuffle: bool = True,
    drop_last: bool = False,
    seed: int = 0,
    num_workers: int = 0,
    **dataloader_options: Any,
) -> DataLoader:
    """A DataLoader yielding whole batches, each read with a few vectorised calls.

    The sampler yields lists of indices and the DataLoader passes each list to
    ``dataset[indices]`` (``batch_size=None`` turns off per-sample collation). Epochs reshuffle
    from ``seed`` and split across DDP ranks (see :class:`packdata.sampling.EpochBatchSampler`).
    With ``num_workers=0`` the batch is read in the training process, the fastest choice for raw
    records: handing batches between processes costs more than reading them. Other keyword
    arguments (``pin_memory``, ``prefetch_factor``, ``persistent_workers``…) go to DataLoader.
    """
    sampler = EpochBatchSampler(
        len(dataset), batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed
    )
    return DataLoader(
        dataset, batch_size=None, sampler=sampler, num_workers=num_workers, **dataloader_options
    )
