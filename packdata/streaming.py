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
        self._skip = 0  # samples of the next epoch already served before a resume
        self._running: tuple[int, int] | None = None  # (epoch, samples yielded) in this process
        shards = self.dataset.manifest.extra.get("shards")
        if shards:
            bounds = np.cumsum([0] + [s["count"] for s in shards]).tolist()
            self.spans: list[Span] = list(zip(bounds[:-1], bounds[1:]))
        else:
            count = self.dataset.manifest.count
            self.spans = [(a, min(a + chunk, count)) for a in range(0, count, chunk)]

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (reaches DataLoader workers, persistent or not)."""
        if epoch != self._epoch.value:
            self._skip = 0
        self._epoch.set(epoch)

    def settings(self) -> dict[str, Any]:
        """What fixes the order besides epoch and position (checked on load)."""
        return {"seed": self.seed, "shuffle_buffer": self.shuffle_buffer, "chunk": self.chunk,
                "drop_last": self.drop_last, "count": len(self.dataset),
                "world_size": ddp_rank_world()[1]}

    def state_dict(self) -> dict[str, Any]:
        """Epoch and position, O(1) in size. Mid-epoch positions are known when the stream is
        iterated in this process (``num_workers=0``); with DataLoader workers save it between
        epochs. (No prefetch runs at ``num_workers=0``: what was yielded is what was used.) A
        resumed epoch replays its stream up to the position without yielding it (the shuffle
        buffer's order depends on every sample before), so resuming costs reading that part."""
        if self._running is not None:
            epoch, position = self._running
        else:
            epoch, position = self._epoch.value + self._epoch._state[1], self._skip
        if position >= len(self):
            epoch, position = epoch + 1, 0
        return {"sampler": type(self).__name__, "epoch": epoch, "position": position,
                **self.settings()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration serves the rest of its epoch."""
        from packdata.errors import ResumeError

        if not isinstance(state, dict) or state.get("sampler") != type(self).__name__:
            raise ResumeError(f"not a {type(self).__name__} state")
        differ = [f"{k} {state.get(k)!r} (now {v!r})" for k, v in self.settings().items()
                  if state.get(k) != v]
        if differ:
            raise ResumeError("the saved stream was made with other settings: " + ", ".join(differ))
        if not (isinstance(state.get("epoch"), int) and isinstance(state.get("position"), int)
                and state["epoch"] >= 0 and 0 <= state["position"] <= len(self)):
            raise ResumeError(f"corrupted stream state: epoch {state.get('epoch')!r}, "
                              f"position {state.get('position')!r}")
        self._epoch.set(state["epoch"])
        self._skip, self._running = state["position"], None

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
        skip, self._skip = self._skip, 0
        if get_worker_info() is not None:
            if skip:
                from packdata.errors import ResumeError

                raise ResumeError("a StreamingDataset resumed mid-epoch must be read with "
                                  "num_workers=0 (each worker streams its own part)")
            yield from self._stream(epoch)
            return
        self._running = (epoch, skip)
        for i, sample in enumerate(self._stream(epoch)):
            if i >= skip:  # replayed up to the position: the buffer's order depends on it all
                self._running = (epoch, i + 1)
                yield sample
        self._running = None

    def _stream(self, epoch: int) -> Iterator[Any]:
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
