"""Resident mode: the whole dataset loaded once into host RAM or GPU memory, shuffled batches
served by index on that device (CIFAR-10 as uint8 is ~150 MB).

Batches follow the order :func:`packdata.loader` would read (the same
:func:`~packdata.loading.order.batch_order` of ``batch_size``, ``shuffle``, ``sampler`` or
``batch_sampler``), so for one seed both yield the same samples in the same order; the
dataset's ``batch_transform`` and the ``augment`` pipeline run after the gather, on the device.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from packdata.errors import ArgumentError, PackdataError, ResidentMemoryError
from packdata.loading.dataset import PackedDataset
from packdata.loading.device import Augment, augment_images, resolve_device
from packdata.loading.order import batch_order
from packdata.loading.sampling import SeededSampler

CHUNK = 8192  # samples read per call while loading: bounded host memory for a GPU load


def available_bytes(device: torch.device) -> int:
    """Free memory on ``device``: CUDA's free bytes, or the host's MemAvailable."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def resident_bytes(dataset: PackedDataset) -> int:
    """Bytes the dataset takes resident: from the manifest when every field has a fixed shape,
    else from the first sample as loaded (decoded images, for ``keep``-encoded records)."""
    manifest = dataset.manifest
    if not manifest.variable_fields:
        return sum(f.nbytes for f in manifest.fields.values()) * manifest.count
    parts = dataset.read_samples(np.zeros(1, dtype=np.int64))
    return sum(p.nbytes for p in parts if isinstance(p, torch.Tensor)) * manifest.count


def _gather(part: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` of ``part``, keeping channels-last images channels-last (index_select
    alone returns NCHW-contiguous rows, a transposing copy)."""
    if part.ndim == 4 and part.is_contiguous(memory_format=torch.channels_last):
        return part.permute(0, 2, 3, 1).index_select(0, index).permute(0, 3, 1, 2)
    return part.index_select(0, index)


class ResidentLoader:
    """Batches of a dataset held whole on ``device`` (``"cpu"``, ``"cuda"``, ``"auto"``), in the
    order ``batch_size``, ``shuffle``, ``sampler`` or ``batch_sampler`` give, as in
    :func:`packdata.loader`.

    Loading refuses with :class:`ResidentMemoryError` when the estimate exceeds ``max_fraction``
    of the free memory (or ``memory_limit`` bytes, when given). Samples must load as fixed-shape
    tensors (variable-length fields such as token ids cannot be stacked).
    """

    def __init__(self, dataset: PackedDataset, batch_size: int | None = None, *,
                 sampler: Any = None, batch_sampler: Any = None,
                 device: str | torch.device | None = "cpu", shuffle: bool = False,
                 drop_last: bool = False, seed: int = 0, augment: Augment | None = None,
                 memory_limit: int | None = None, max_fraction: float = 0.8) -> None:
        if dataset.transform is not None:  # it would be frozen into memory or skipped
            raise PackdataError(
                f"{dataset.path}: resident mode serves whole batches from memory and cannot run "
                "a per-sample transform; use batch_transform= or augment= instead")
        self.dataset = dataset
        self.device = resolve_device(device)
        self.augment = augment
        self.sampler = batch_order(dataset, batch_size, sampler, batch_sampler, shuffle,
                                   drop_last, seed)
        if not 0 < max_fraction <= 1:  # more than all of the memory is never safe
            raise ArgumentError(f"max_fraction must be in (0, 1], got {max_fraction!r}")
        need = resident_bytes(dataset)
        limit = memory_limit if memory_limit is not None else int(
            available_bytes(self.device) * max_fraction)
        if need > limit:
            raise ResidentMemoryError(
                f"{dataset.path}: resident mode needs ~{need / 2**20:,.0f} MiB on {self.device} but "
                f"only {limit / 2**20:,.0f} MiB may be used there; stream it instead "
                "(resident=False) or use a device with more memory")
        self.parts = self._load()

    def _load(self) -> tuple[torch.Tensor, ...]:
        n = len(self.dataset)
        stored: list[torch.Tensor] = []
        for start in range(0, n, CHUNK):
            chunk = self.dataset.read_samples(np.arange(start, min(start + CHUNK, n)))
            if not stored:
                for j, part in enumerate(chunk):
                    if not isinstance(part, torch.Tensor):
                        raise PackdataError(
                            f"{self.dataset.path}: resident mode needs fixed-shape samples; part "
                            f"{j} of each sample is variable-length ({type(part).__name__})")
                    channels_last = part.ndim == 4 and part.is_contiguous(
                        memory_format=torch.channels_last)
                    stored.append(torch.empty(
                        (n, *part.shape[1:]), dtype=part.dtype, device=self.device,
                        memory_format=torch.channels_last if channels_last else torch.contiguous_format))
            for dst, part in zip(stored, chunk):
                dst[start : start + len(part)].copy_(part)
        return tuple(stored)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (its shuffle), as DistributedSampler's."""
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        transform = self.dataset.batch_transform
        sampler = self.sampler
        for indices in sampler.arrays() if isinstance(sampler, SeededSampler) else sampler:
            index = torch.as_tensor(indices, device=self.device)
            batch = tuple(_gather(p, index) for p in self.parts)
            if transform is not None:
                batch = (transform(batch[0]), *batch[1:])
            yield augment_images(batch if len(batch) > 1 else batch[0], self.augment)

    def __repr__(self) -> str:
        return (f"ResidentLoader({self.dataset!r}, {len(self)} batches, "
                f"device={self.device}, {self.nbytes / 2**20:.1f} MiB)")
