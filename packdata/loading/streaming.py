"""Streaming access: an IterableDataset that reads a dataset front to back, shard by shard.

For sequential storage (tar shards, later object storage) where random access is expensive:
each epoch lays the shards end to end in a shuffled order, gives every DDP rank an equal run of
that sequence and every DataLoader worker an equal part of its rank's run, reads each part in
large sequential chunks and mixes the samples through a shuffle buffer.

Resume: an epoch's rank share is cut into ``roles`` streams (one per reader: a DataLoader worker,
or this process), each with its own shuffle buffer. A state records, per role, how many samples
of its stream were delivered; a resumed reader replays its role's stream up to there without
yielding it (the buffer's order depends on every sample before) and serves the rest.
:class:`~packdata.loading.streamloader.StreamingLoader` counts the batches the training loop took, which
fixes each worker's position because a DataLoader takes batches from its workers in turn.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from packdata.errors import ResumeError
from packdata.loading.dataset import PackedDataset, Transform
from packdata.loading.ranks import per_rank, rank_and_world
from packdata.loading.shared import SharedState
from packdata.loading.streamloader import RoleProgress, StreamingLoader
from packdata.remote.storage import CACHE_LIMIT, Storage
from packdata.units import count_argument

Span = tuple[int, int]  # sample indices [start, stop)



class StreamEpochs(SharedState):
    """The epoch a stream's next iteration runs: the epoch set, plus the epochs completed since.

    An epoch is complete once each of its readers (this process, or each DataLoader worker) has
    run its part to the end. Every reader writes only its own slot (the epoch it last finished
    and how many readers that epoch had) in memory shared with the workers, so no lock is
    needed and in-process and worker iterations count the same epochs.
    """

    SLOTS = 256  # readers: this process or up to 256 DataLoader workers (ids wrap round)

    def __init__(self) -> None:
        super().__init__(1 + self.SLOTS)  # [0]: the epoch set

    def set(self, epoch: int) -> None:
        """The next iteration runs ``epoch`` (and forgets which epochs were completed)."""
        self._state[1:] = [0] * self.SLOTS
        self._state[0] = count_argument("epoch", epoch)

    @property
    def value(self) -> int:
        """The epoch the next iteration runs."""
        slots = self._state[1:]
        done = [((v >> 16) - 1, v & 0xFFFF) for v in slots if v]
        if not done:
            return self._state[0]
        # the last epoch any reader finished began after the one before it completed: it is
        # complete once each of its readers finished it too
        last, readers = max(done)
        complete = all((v >> 16) - 1 >= last for v in slots[:readers])
        return max(self._state[0], last + complete)

    def finish(self, epoch: int, reader: int, readers: int) -> None:
        """Reader ``reader`` of ``readers`` ran its part of ``epoch`` to the end."""
        self._state[1 + reader % self.SLOTS] = ((epoch + 1) << 16) | min(readers, self.SLOTS)


class StreamingDataset(IterableDataset):
    """Iterate a packed dataset in shard order with a shuffle buffer.

    Every epoch reshuffles the shard order from ``(seed, epoch)``. An iteration runs the epoch
    after the last one run to its end (by this process or by DataLoader workers alike; an
    iteration left early, such as ``next(iter(stream))``, runs again), or the one set with
    :meth:`set_epoch`. A dataset with one shard (LMDB, HDF5) is cut into ``chunk``-sized spans
    instead. Each DDP rank gets the same number of samples: the epoch's sequence is wrapped round
    to divide evenly, or cut short with ``drop_last``. ``rank`` and ``world_size`` default to
    torch.distributed's. With ``shuffle_buffer`` > 1 samples are drawn at random from a buffer of
    that many. A URL (``s3://bucket/ds``) streams tar shards from object storage through a local
    cache (``cache_dir``, at most ``cache_limit`` bytes) with the next shards fetched ahead. For
    batches with a resumable position over DataLoader workers use :meth:`loader`.
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
        storage = Storage(storage_options or {}, cache_dir, cache_limit)
        self.dataset = PackedDataset(path, transform=transform, storage=storage, verify=verify)
        self.shuffle_buffer = count_argument("shuffle_buffer", shuffle_buffer)
        self.seed, self.chunk = count_argument("seed", seed), count_argument("chunk", chunk, 1)
        self.drop_last = drop_last
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self._epoch = StreamEpochs()
        self._resume: dict[str, Any] | None = None  # a loaded mid-epoch state, not yet begun
        self._running: dict[str, Any] | None = None  # the state of an iteration in this process
        # worker streams begun and not finished (shared with DataLoader workers)
        self._in_workers = SharedState(1)
        shards = self.dataset.manifest.extra.get("shards")
        if shards:
            bounds = np.cumsum([0] + [s["count"] for s in shards]).tolist()
            self.spans: list[Span] = list(zip(bounds[:-1], bounds[1:]))
        else:
            count = self.dataset.manifest.count
            self.spans = [(a, min(a + chunk, count)) for a in range(0, count, chunk)]

    @property
    def next_epoch(self) -> int:
        """The epoch the next iteration runs."""
        return self._epoch.value

    def drop_loaded_position(self) -> None:
        """Forget a loaded mid-epoch position once the readers that serve it (DataLoader
        workers, each with its copy of this stream) have begun: it is served once."""
        self._resume = None

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (reaches DataLoader workers, persistent or not).
        Setting the epoch a loaded state is in keeps its position."""
        if self._resume is not None and epoch != self._resume["epoch"]:
            self._resume = None
        self._epoch.set(epoch)
        self._in_workers[0] = 0
        self._running = None

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
            return self.position_state(**self._running)
        if self._resume is not None:
            return self.position_state(**self._resume)
        if self._in_workers[0]:
            raise ResumeError("the stream is being read by DataLoader workers mid-epoch: its "
                              "position is known to the loop that takes the batches; use "
                              "StreamingDataset.loader(...) and its state_dict()")
        return self.fresh_state(self._epoch.value)

    def fresh_state(self, epoch: int) -> dict[str, Any]:
        """The state at the start of ``epoch``."""
        return self.position_state(epoch, 1, [[0]], [0], 0)

    def position_state(self, epoch: int, roles: int, groups: list[list[int]], positions: list[int],
                       next: int) -> dict[str, Any]:
        """The state of ``positions`` (samples delivered of each of ``roles`` streams of
        ``epoch``, dealt to readers in ``groups``, reader ``next`` to serve next), sealed with the
        dataset's fingerprint and packdata's version."""
        from packdata.loading.resume import sealed

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
        from packdata.loading.resume import opened

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

    def plan(self, epoch: int, reader: int, readers: int) -> tuple[int, RoleProgress]:
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
        epoch = self._epoch.value
        info = get_worker_info()
        reader, readers = (info.id, info.num_workers) if info else (0, 1)
        roles, plan = self.plan(epoch, reader, readers)
        self._resume = None  # begun: this copy serves the rest once
        if info is not None:
            return self._in_worker(epoch, roles, plan, reader, readers)
        running = {"epoch": epoch, "roles": roles, "groups": [[role for role, _ in plan]],
                   "positions": [self.role_size(r, roles) for r in range(roles)], "next": 0}
        for role, skip in plan:
            running["positions"][role] = skip
        return self._tracked(running, plan)

    def _tracked(self, running: dict[str, Any], plan: RoleProgress) -> Iterator[Any]:
        self._running = running
        positions = running["positions"]
        for role, skip in plan:
            for i, sample in enumerate(self._role_stream(running["epoch"], role, running["roles"])):
                if i >= skip:
                    positions[role] = i + 1
                    yield sample
        self._running = None
        self._epoch.finish(running["epoch"], 0, 1)

    def _in_worker(self, epoch: int, roles: int, plan: RoleProgress, reader: int,
                   readers: int) -> Iterator[Any]:
        self._in_workers[0] += 1
        try:
            for role, skip in plan:
                for i, sample in enumerate(self._role_stream(epoch, role, roles)):
                    if i >= skip:
                        yield sample
            self._epoch.finish(epoch, reader, readers)
        finally:
            self._in_workers[0] -= 1

    def _samples(self, epoch: int, role: int, roles: int) -> Iterator[Any]:
        spans = self.spans_for(epoch, self.rank, self.world_size, role, roles)
        self.dataset.reader.prefetch([a for a, _ in spans])  # object storage fetches ahead
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

