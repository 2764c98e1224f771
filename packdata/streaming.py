"""Streaming access: an IterableDataset that reads a dataset front to back, shard by shard.

For sequential storage (tar shards, later object storage) where random access is expensive:
each epoch lays the shards end to end in a shuffled order, gives every DDP rank an equal run of
that sequence and every DataLoader worker an equal part of its rank's run, reads each part in
large sequential chunks and mixes the samples through a shuffle buffer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from packdata.dataset import PackedDataset, Transform
from packdata.sampling import SharedEpoch, ddp_rank_world, per_rank
from packdata.storage import CACHE_LIMIT, Storage, is_url

Span = tuple[int, int]  # sample indices [start, stop)


class StreamingDataset(IterableDataset):
    """Iterate a packed dataset in shard order with a shuffle buffer.

    Every epoch reshuffles the shard order from ``(seed, epoch)``; the epoch advances by one on
    each iteration, in DataLoader workers too, or is set with :meth:`set_epoch`. A dataset with
    one shard (LMDB, HDF5) is cut into ``chunk``-sized spans instead. Each DDP rank gets the same
    number of samples: the epoch's sequence is wrapped round to divide evenly, or cut short with
    ``drop_last``. With ``shuffle_buffer`` > 1 samples are drawn at random from a buffer of that
    many. A URL (``s3://bucket/ds``) streams tar shards from object storage through a local
    cache (``cache_dir``, at most ``cache_limit`` bytes) with the next shards fetched ahead.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        shuffle_buffer: int = 10_000,
        seed: int = 0,
        chunk: int = 1024,
        drop_last: bool = False,
        transform: Transform | None = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | Path | None = None,
        cache_limit: int | str = CACHE_LIMIT,
    ) -> None:
        storage = Storage(storage_options or {}, cache_dir, cache_limit) if is_url(path) else None
        self.dataset = PackedDataset(path, transform=transform, storage=storage)
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.chunk = chunk
        self.drop_last = drop_last
        self._epoch = SharedEpoch()
        shards = self.dataset.manifest.extra.get("shards")
        if shards:
            bounds = np.cumsum([0] + [s["count"] for s in shards]).tolist()
            self.spans: list[Span] = list(zip(bounds[:-1], bounds[1:]))
        else:
            count = self.dataset.manifest.count
            self.spans = [(a, min(a + chunk, count)) for a in range(0, count, chunk)]

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (reaches DataLoader workers, persistent or not)."""
        self._epoch.set(epoch)

    def __len__(self) -> int:
        """Samples this DDP rank yields per epoch (over all its DataLoader workers). Not batches:
        with workers each batches its own part, so a DataLoader may yield up to
        ``num_workers - 1`` more (partial) batches than ``len(loader)`` says."""
        _, world = ddp_rank_world()
        return per_rank(len(self.dataset), world, self.drop_last)

    def spans_for(self, epoch: int, rank: int, world: int, worker: int = 0,
                  workers: int = 1) -> list[Span]:
        """What one worker of one rank reads in ``epoch``: runs of sample indices, in order."""
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.spans))
        sequence = [self.spans[i] for i in order]
        share = per_rank(len(self.dataset), world, self.drop_last)
        lo = rank * share + share * worker // workers
        hi = rank * share + share * (worker + 1) // workers
        return _positions(sequence, lo, hi)

    def _samples(self, epoch: int) -> Iterator[Any]:
        rank, world = ddp_rank_world()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        spans = self.spans_for(epoch, rank, world, worker, workers)
        reader = self.dataset.reader
        if hasattr(reader, "prefetch"):  # object storage: fetch this worker's shards ahead
            reader.prefetch(reader.shards_of([a for a, _ in spans]))
        for a, b in spans:
            for start in range(a, b, self.chunk):
                indices = np.arange(start, min(start + self.chunk, b))
                yield from self.dataset.__getitems__(indices)

    def __iter__(self) -> Iterator[Any]:
        epoch = self._epoch.begin_iteration()
        if self.shuffle_buffer <= 1:
            yield from self._samples(epoch)
            return
        info = get_worker_info()
        rank, _ = ddp_rank_world()
        rng = np.random.default_rng([self.seed, epoch, rank, info.id if info else 0])
        buffer: list[Any] = []
        for sample in self._samples(epoch):
            if len(buffer) < self.shuffle_buffer:
                buffer.append(sample)
                continue
            j = int(rng.integers(len(buffer)))
            yield buffer[j]
            buffer[j] = sample
        rng.shuffle(buffer)
        yield from buffer


def _positions(sequence: list[Span], lo: int, hi: int) -> list[Span]:
    """Positions ``[lo, hi)`` of the spans laid end to end — repeated from the start when ``hi``
    runs past the end — as spans of sample indices."""
    out: list[Span] = []
    offset = 0
    while offset < hi:
        for a, b in sequence:
            start, stop = max(lo - offset, 0), min(hi - offset, b - a)
            if start < stop:
                out.append((a + start, a + stop))
            offset += b - a
    return out
