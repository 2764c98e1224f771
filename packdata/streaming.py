"""Streaming access: an IterableDataset that reads a dataset front to back, shard by shard.

For sequential storage (tar shards, later object storage) where random access is expensive:
shards are dealt out to DDP ranks and DataLoader workers, read in large sequential chunks, and
mixed through a shuffle buffer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from packdata.dataset import PackedDataset, Transform
from packdata.sampling import ddp_rank_world


class StreamingDataset(IterableDataset):
    """Iterate a packed dataset in shard order with a shuffle buffer.

    Every epoch (``set_epoch``, or advancing on each ``iter``) reshuffles the shard order from
    ``seed + epoch``; with ``shuffle_buffer`` > 1 samples are drawn at random from a buffer of that
    many. A dataset with one shard (LMDB, HDF5) is cut into ``chunk``-sized spans instead, so
    workers and ranks still split it.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        shuffle_buffer: int = 10_000,
        seed: int = 0,
        chunk: int = 1024,
        transform: Transform | None = None,
    ) -> None:
        self.dataset = PackedDataset(path, transform=transform)
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.chunk = chunk
        self.epoch = 0
        self._next_epoch = 0
        shards = self.dataset.manifest.extra.get("shards")
        counts = [s["count"] for s in shards] if shards else [self.dataset.manifest.count]
        bounds = np.concatenate([[0], np.cumsum(counts)])
        self.spans = [
            (int(a), int(min(a + chunk, b))) if not shards else (int(a), int(b))
            for a, b in zip(bounds[:-1], bounds[1:])
            for a in (range(a, b, chunk) if not shards else [a])
        ]

    def set_epoch(self, epoch: int) -> None:
        self._next_epoch = epoch

    def _my_spans(self) -> list[tuple[int, int]]:
        rank, world = ddp_rank_world()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.spans))
        share = order[rank * workers + worker :: world * workers]
        return [self.spans[i] for i in share]

    def _samples(self) -> Iterator[Any]:
        for a, b in self._my_spans():
            for start in range(a, b, self.chunk):
                indices = np.arange(start, min(start + self.chunk, b))
                yield from self.dataset.__getitems__(indices)

    def __iter__(self) -> Iterator[Any]:
        self.epoch = self._next_epoch
        self._next_epoch += 1
        if self.shuffle_buffer <= 1:
            yield from self._samples()
            return
        info = get_worker_info()
        rng = np.random.default_rng([self.seed, self.epoch, info.id if info else 0])
        buffer: list[Any] = []
        for sample in self._samples():
            if len(buffer) < self.shuffle_buffer:
                buffer.append(sample)
                continue
            j = int(rng.integers(len(buffer)))
            yield buffer[j]
            buffer[j] = sample
        rng.shuffle(buffer)
        yield from buffer
