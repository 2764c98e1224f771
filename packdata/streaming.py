"""Streaming access: an IterableDataset that reads a dataset front to back, shard by shard.

For sequential storage (tar shards, later object storage) where random access is expensive:
each epoch lays the shards end to end in a shuffled order, gives every DDP rank an equal run of
that sequence and every DataLoader worker an equal part of its rank's run, reads each part in
large sequential chunks and mixes the samples through a shuffle buffer.

Resume: an epoch's rank share is cut into ``roles`` streams (one per reader: a DataLoader worker,
or this process), each with its own shuffle buffer. A state records, per role, how many samples
of its stream were delivered; a resumed reader replays its role's stream up to there without
yielding it (the buffer's order depends on every sample before) and serves the rest.
:class:`StreamingLoader` counts the batches the training loop took, which fixes each worker's
position because a DataLoader takes batches from its workers in turn.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterator
from multiprocessing import sharedctypes
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from packdata.dataset import PackedDataset, Transform
from packdata.errors import ArgumentError, ResumeError
from packdata.remote.storage import CACHE_LIMIT, Storage
from packdata.sampling import SharedEpoch, ddp_rank_world, per_rank
from packdata.urls import is_url

Span = tuple[int, int]  # sample indices [start, stop)


Plan = list[tuple[int, int]]  # what one reader streams: (role, samples of it already delivered)


class StreamingDataset(IterableDataset):
    """Iterate a packed dataset in shard order with a shuffle buffer.

    Every epoch reshuffles the shard order from ``(seed, epoch)``; the epoch advances by one on
    each iteration, in DataLoader workers too, or is set with :meth:`set_epoch`. A dataset with
    one shard (LMDB, HDF5) is cut into ``chunk``-sized spans instead. Each DDP rank gets the same
    number of samples: the epoch's sequence is wrapped round to divide evenly, or cut short with
    ``drop_last``. ``rank`` and ``world_size`` default to torch.distributed's. With
    ``shuffle_buffer`` > 1 samples are drawn at random from a buffer of that many. A URL
    (``s3://bucket/ds``) streams tar shards from object storage through a local cache
    (``cache_dir``, at most ``cache_limit`` bytes) with the next shards fetched ahead.
    For batches with a resumable position over DataLoader workers use :meth:`loader`.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        shuffle_buffer: int = 10_000,
        seed: int = 0,
        chunk: int = 1024,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        transform: Transform | None = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | Path | None = None,
        cache_limit: int | str = CACHE_LIMIT,
        verify: str = "full",
    ) -> None:
        storage = Storage(storage_options or {}, cache_dir, cache_limit) if is_url(path) else None
        self.dataset = PackedDataset(path, transform=transform, storage=storage, verify=verify)
        self.shuffle_buffer, self.seed, self.chunk = shuffle_buffer, seed, chunk
        self.drop_last = drop_last
        default_rank, default_world = ddp_rank_world()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ArgumentError(f"rank {self.rank} is outside world size {self.world_size}")
        self._epoch = SharedEpoch()
        self._resume: dict[str, Any] | None = None  # a loaded mid-epoch state, not yet begun
        self._running: dict[str, Any] | None = None  # the state of an iteration in this process
        # worker streams begun and not finished (shared with DataLoader workers)
        self._in_workers = sharedctypes.RawArray("q", 1)
        shards = self.dataset.manifest.extra.get("shards")
        if shards:
            bounds = np.cumsum([0] + [s["count"] for s in shards]).tolist()
            self.spans: list[Span] = list(zip(bounds[:-1], bounds[1:]))
        else:
            count = self.dataset.manifest.count
            self.spans = [(a, min(a + chunk, count)) for a in range(0, count, chunk)]

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (reaches DataLoader workers, persistent or not).
        Setting the epoch a loaded state is in keeps its position."""
        if self._resume is not None and epoch != self._resume["epoch"]:
            self._resume = None
        self._epoch.set(epoch)
        self._in_workers[0] = 0
        self._running = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if mp.context.get_spawning_popen() is None:  # a plain copy, not a new worker: copy
            state["_in_workers"] = list(self._in_workers)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["_in_workers"], list):
            state["_in_workers"] = sharedctypes.RawArray("q", state["_in_workers"])
        self.__dict__.update(state)

    def loader(self, batch_size: int, *, num_workers: int = 0, drop_last: bool = False,
               **dataloader_options: Any) -> StreamingLoader:
        """Batches of this stream through a DataLoader, with ``state_dict`` mid-epoch."""
        return StreamingLoader(self, batch_size, num_workers=num_workers, drop_last=drop_last,
                               **dataloader_options)

    def settings(self) -> dict[str, Any]:
        """What fixes the order besides epoch and position (checked on load)."""
        return {"seed": self.seed, "shuffle_buffer": self.shuffle_buffer, "chunk": self.chunk,
                "drop_last": self.drop_last, "count": len(self.dataset),
                "world_size": self.world_size}

    def state_dict(self) -> dict[str, Any]:
        """Epoch and position (samples delivered from each reader's stream), O(number of
        readers) in size. Mid-epoch positions are known when the stream is iterated in this
        process; with DataLoader workers use :meth:`loader`, whose ``state_dict`` knows them
        (here a mid-epoch state with workers raises ResumeError). A resumed epoch replays each
        stream up to its position without yielding it, so resuming costs reading that part."""
        if self._running is not None:
            return self._state(**self._running)
        if self._resume is not None:
            return self._state(**self._resume)
        if self._in_workers[0]:
            raise ResumeError("the stream is being read by DataLoader workers mid-epoch: its "
                              "position is known to the loop that takes the batches; use "
                              "StreamingDataset.loader(...) and its state_dict()")
        return self.fresh_state(self._epoch.value + self._epoch._state[1])

    def fresh_state(self, epoch: int) -> dict[str, Any]:
        """The state at the start of ``epoch``."""
        return self._state(epoch, 1, [[0]], [0], 0)

    def _state(self, epoch: int, roles: int, groups: list[list[int]], positions: list[int],
               next: int) -> dict[str, Any]:
        """The position sealed with the dataset's fingerprint and packdata's version."""
        from packdata.resume import sealed

        if all(p >= self.role_size(r, roles) for r, p in enumerate(positions)):
            epoch, roles, groups, positions, next = epoch + 1, 1, [[0]], [0], 0
        return sealed(self.dataset, {
            "sampler": type(self).__name__, "epoch": epoch, "position": sum(positions),
            "roles": roles, "groups": groups, "positions": list(positions), "next": next,
            **self.settings()})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration serves the rest of its epoch, with any
        number of DataLoader workers (at the saved number, in the order an uninterrupted run
        has). Another world size, other settings, another dataset or packdata version, or a
        corrupted state raise ResumeError naming the difference."""
        from packdata.resume import opened

        state = opened(self.dataset, state)
        if not isinstance(state, dict) or state.get("sampler") != type(self).__name__:
            raise ResumeError(f"not a {type(self).__name__} state")
        differ = [f"{k} {state.get(k)!r} (now {v!r})" for k, v in self.settings().items()
                  if state.get(k) != v]
        if differ:
            raise ResumeError("the saved stream was made with other settings: " + ", ".join(differ))
        roles, groups, positions = state.get("roles"), state.get("groups"), state.get("positions")
        intact = (isinstance(state.get("epoch"), int) and state["epoch"] >= 0
                  and isinstance(roles, int) and roles >= 1
                  and isinstance(positions, list) and len(positions) == roles
                  and all(isinstance(p, int) and 0 <= p <= self.role_size(r, roles)
                          for r, p in enumerate(positions))
                  and isinstance(groups, list) and all(isinstance(g, list) for g in groups)
                  and sorted(r for g in groups for r in g) == list(range(roles))
                  and isinstance(state.get("next"), int) and 0 <= state["next"] < len(groups)
                  and state.get("position") == sum(positions))
        if not intact:
            raise ResumeError(f"corrupted stream state: epoch {state.get('epoch')!r}, roles "
                              f"{roles!r}, positions {positions!r}, groups {groups!r}")
        self._epoch.set(state["epoch"])
        self._in_workers[0] = 0
        self._running = None
        if any(positions):  # mid-epoch (an epoch's start is planned afresh, for any readers)
            self._resume = {k: state[k] for k in ("epoch", "roles", "groups", "positions", "next")}
        else:
            self._resume = None

    def __len__(self) -> int:
        """Samples this DDP rank yields per epoch (over all its DataLoader workers). Not batches:
        with workers each batches its own part, so a DataLoader may yield up to
        ``num_workers - 1`` more (partial) batches than ``len(loader)`` says."""
        return per_rank(len(self.dataset), self.world_size, self.drop_last)

    def role_size(self, role: int, roles: int) -> int:
        """Samples in the stream of ``role`` when the rank's share is cut into ``roles``."""
        share = len(self)
        return share * (role + 1) // roles - share * role // roles

    def spans_for(self, epoch: int, rank: int, world: int, worker: int = 0,
                  workers: int = 1) -> list[Span]:
        """What one worker of one rank reads in ``epoch``: runs of sample indices, in order."""
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.spans))
        sequence = [self.spans[i] for i in order]
        share = per_rank(len(self.dataset), world, self.drop_last)
        lo = rank * share + share * worker // workers
        hi = rank * share + share * (worker + 1) // workers
        return _positions(sequence, lo, hi)

    def plan(self, epoch: int, reader: int, readers: int) -> tuple[int, Plan]:
        """(roles, what ``reader`` of ``readers`` streams in ``epoch``). Fresh, reader ``i``
        streams role ``i``. Resumed with as many readers as saved, the roles rotate so that a
        DataLoader, taking batches from its workers in turn from worker 0, continues where the
        saved run stopped; with another number, the unfinished roles are dealt out in turn."""
        r = self._resume
        if r is None or r["epoch"] != epoch:
            return readers, [(reader, 0)]
        roles, groups, positions = r["roles"], r["groups"], r["positions"]
        if len(groups) == readers:
            mine = groups[(reader + r["next"]) % readers]
        else:
            turn = groups[r["next"]:] + groups[:r["next"]]
            left = [role for g in turn for role in g
                    if positions[role] < self.role_size(role, roles)]
            mine = left[reader::readers]
        return roles, [(role, positions[role]) for role in mine]

    def __iter__(self) -> Iterator[Any]:
        epoch = self._epoch.begin_iteration()
        info = get_worker_info()
        reader, readers = (info.id, info.num_workers) if info else (0, 1)
        roles, plan = self.plan(epoch, reader, readers)
        self._resume = None  # begun: this copy serves the rest once
        if info is not None:
            return self._in_worker(epoch, roles, plan)
        running = {"epoch": epoch, "roles": roles, "groups": [[role for role, _ in plan]],
                   "positions": [self.role_size(r, roles) for r in range(roles)], "next": 0}
        for role, skip in plan:
            running["positions"][role] = skip
        return self._tracked(running, plan)

    def _tracked(self, running: dict[str, Any], plan: Plan) -> Iterator[Any]:
        self._running = running
        positions = running["positions"]
        for role, skip in plan:
            for i, sample in enumerate(self._role_stream(running["epoch"], role, running["roles"])):
                if i >= skip:
                    positions[role] = i + 1
                    yield sample
        self._running = None

    def _in_worker(self, epoch: int, roles: int, plan: Plan) -> Iterator[Any]:
        self._in_workers[0] += 1
        try:
            for role, skip in plan:
                for i, sample in enumerate(self._role_stream(epoch, role, roles)):
                    if i >= skip:
                        yield sample
        finally:
            self._in_workers[0] -= 1

    def _samples(self, epoch: int, role: int, roles: int) -> Iterator[Any]:
        spans = self.spans_for(epoch, self.rank, self.world_size, role, roles)
        reader = self.dataset.reader
        if hasattr(reader, "prefetch"):  # object storage: fetch this worker's shards ahead
            reader.prefetch(reader.shards_of([a for a, _ in spans]))
        for a, b in spans:
            for start in range(a, b, self.chunk):
                indices = np.arange(start, min(start + self.chunk, b))
                yield from self.dataset.__getitems__(indices)

    def _role_stream(self, epoch: int, role: int, roles: int) -> Iterator[Any]:
        """One role's samples in order: its spans through its own shuffle buffer."""
        if self.shuffle_buffer <= 1:
            yield from self._samples(epoch, role, roles)
            return
        rng = np.random.default_rng([self.seed, epoch, self.rank, role])
        buffer: list[Any] = []
        for sample in self._samples(epoch, role, roles):
            if len(buffer) < self.shuffle_buffer:
                buffer.append(sample)
                continue
            j = int(rng.integers(len(buffer)))
            yield buffer[j]
            buffer[j] = sample
        rng.shuffle(buffer)
        yield from buffer


class StreamingLoader:
    """Batches of a :class:`StreamingDataset` through a DataLoader (``num_workers`` workers),
    owning the epoch and the position: :meth:`state_dict` mid-epoch, :meth:`load_state_dict` on
    a rebuilt one serves exactly the rest, also at another ``num_workers`` (then in another
    order: each worker batches its own stream). Iterate it once per epoch."""

    def __init__(self, stream: StreamingDataset, batch_size: int, *, num_workers: int = 0,
                 drop_last: bool = False, **dataloader_options: Any) -> None:
        if dataloader_options.get("in_order", True) is not True:
            raise ArgumentError("in_order=False takes batches in the order workers finish them: "
                                "no position can be saved")
        if batch_size < 1:
            raise ArgumentError(f"batch_size must be ≥ 1, got {batch_size}")
        self.stream = stream
        self.dataset = stream
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.drop_last = drop_last
        self._options = dataloader_options
        self._dataloader: DataLoader | None = None
        self._next_epoch = 0
        self._loaded: dict[str, Any] | None = None
        self._epoch_plan: tuple[int, int, list[Plan]] | None = None  # (epoch, roles, per reader)
        self._delivered: int | None = None  # batches taken in the epoch in progress

    @property
    def readers(self) -> int:
        return max(self.num_workers, 1)

    @property
    def dataloader(self) -> DataLoader:
        if self._dataloader is None:
            self._dataloader = DataLoader(self.stream, batch_size=self.batch_size,
                                          num_workers=self.num_workers, drop_last=self.drop_last,
                                          **self._options)
        return self._dataloader

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs."""
        self._next_epoch = epoch
        self.stream.set_epoch(epoch)

    def _batches(self, samples: int) -> int:
        return samples // self.batch_size if self.drop_last else -(-samples // self.batch_size)

    def __len__(self) -> int:
        """Batches per epoch (each worker batches its own stream)."""
        return sum(self._batches(self.stream.role_size(r, self.readers))
                   for r in range(self.readers))

    def __iter__(self) -> Iterator[Any]:
        epoch = self._next_epoch
        self.stream.set_epoch(epoch)  # keeps a loaded state of this epoch
        plans = [self.stream.plan(epoch, j, self.readers) for j in range(self.readers)]
        self._epoch_plan = (epoch, plans[0][0], [p for _, p in plans])
        batches = iter(self.dataloader)  # workers start here, each with the loaded state
        self.stream._resume, self._loaded = None, None
        self._next_epoch = epoch + 1
        return self._counted(batches)

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        self._delivered = 0
        for batch in batches:
            self._delivered += 1
            yield batch
        self._delivered = None

    def state_dict(self) -> dict[str, Any]:
        """The stream's state after the batches taken so far (plain JSON, O(workers))."""
        if self._loaded is not None:
            return self._loaded
        if self._delivered is None or self._epoch_plan is None:
            return self.stream.fresh_state(self._next_epoch)
        epoch, roles, plans = self._epoch_plan
        left = [sum(self.stream.role_size(role, roles) - skip for role, skip in plan)
                for plan in plans]
        taken, nxt = _round_robin([self._batches(n) for n in left], self._delivered)
        positions = [self.stream.role_size(r, roles) for r in range(roles)]
        for plan, batches, n in zip(plans, taken, left):
            done = min(batches * self.batch_size, n)  # samples this reader delivered
            for role, skip in plan:
                size = self.stream.role_size(role, roles)
                positions[role] = skip + min(done, size - skip)
                done -= positions[role] - skip
        groups = [[role for role, _ in plan] for plan in plans]
        return self.stream._state(epoch, roles, groups, positions, nxt)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (or the stream's own)."""
        self.stream.load_state_dict(state)
        self._next_epoch = self.stream._epoch.value
        self._loaded, self._delivered, self._epoch_plan = state, None, None
        self._dataloader = None  # persistent workers would keep the old position


def _round_robin(batches: list[int], k: int) -> tuple[list[int], int]:
    """Batches each reader delivered after a DataLoader handed out ``k``, taking one from each
    reader with batches left in turn (from reader 0), and the reader whose turn is next."""
    n = len(batches)
    k = min(k, sum(batches))
    full = min(k // n, min(batches))  # rounds where every reader delivered
    taken = [full] * n
    k -= full * n
    j = 0
    while k > 0:
        if taken[j] < batches[j]:
            taken[j] += 1
            k -= 1
        j = (j + 1) % n
    return taken, j


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
