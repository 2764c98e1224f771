"""Seeded batch samplers: which indices go in each batch, per epoch, per DDP rank, with the
position in the epoch as state.

Every sampler here yields one batch of indices at a time (lists, or int64 arrays through
:meth:`SeededSampler.arrays`) so the dataset reads each batch with one vectorised call. Shuffling
is a pure function of ``(seed, epoch)``: the same seed gives the same batches on every rank and in
every run. :class:`EpochBatchSampler` draws batches at random;
:class:`~packdata.loading.buckets.LengthBucketBatchSampler` groups documents of similar length.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from packdata.errors import ResumeError
from packdata.loading.ranks import per_rank, rank_and_world
from packdata.units import count_argument

#: an epoch's finished segments: (world size, batches each rank took in it)
Segments = list[tuple[int, int]]


class SeededSampler(Sampler[list[int]]):
    """What every batch sampler here shares: seed, epoch, position and this process's DDP rank.

    The sampler owns the epoch and the position in it. :meth:`state_dict` is a handful of
    numbers (epoch, the batches each rank took so far and at which world size, the settings that
    fix the order), never a list of samples; :meth:`load_state_dict` makes the next iteration
    serve exactly the rest of that epoch. At another world size the rest is re-split over the new
    ranks (each sample of the epoch still served once).
    """

    shuffle: bool  # whether each epoch's order is drawn at random (every sampler here sets it)

    def __init__(self, seed: int, rank: int | None, world_size: int | None) -> None:
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.seed, self.epoch, self._next_epoch = count_argument("seed", seed), 0, 0
        self._pending: Segments = []  # finished segments of the next epoch (after a resume)
        self._current: tuple[int, Segments, int] | None = None  # (epoch, plan, batches) iterating
        self._served = 0
        self._done = False

    @property
    def next_epoch(self) -> int:
        """The epoch the next iteration runs."""
        return self._next_epoch

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (as DistributedSampler's ``set_epoch``). Setting the
        epoch a loaded state is in keeps its position."""
        epoch = count_argument("epoch", epoch)  # numpy's generators take no other
        if epoch != self._next_epoch:
            self._pending = []
        self._next_epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        return (batch.tolist() for batch in self.arrays())

    def arrays(self) -> Iterator[np.ndarray]:
        """Iteration as ``iter(sampler)`` (the same batches, epoch and position), each batch an
        int64 array, not a list: what :func:`packdata.loader` reads (no list made per batch)."""
        # a generator: the epoch begins at the first batch asked for (DataLoader calls iter() twice)
        epoch, plan = self._next_epoch, self._pending
        self.epoch, self._next_epoch, self._pending = epoch, epoch + 1, []
        self._served, self._done = 0, False
        batches = self._batches(epoch, plan)
        self._current = (epoch, plan, len(batches))
        for batch in batches:
            self._served += 1
            yield batch
        self._done = True

    def _batches(self, epoch: int, plan: Segments) -> list[np.ndarray]:
        """This rank's batches of ``epoch`` (the rest of it after ``plan``'s segments)."""
        raise NotImplementedError

    def rng(self, epoch: int) -> np.random.Generator:
        """The generator of ``epoch``: the same on every rank."""
        return np.random.default_rng([self.seed, epoch])

    def settings(self) -> dict[str, Any]:
        """What fixes the order besides epoch and position (checked on load)."""
        return {"seed": self.seed}

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        """Epoch and position: after ``position`` batches of the epoch in progress (default: as
        many as this sampler handed out; a loader passes the number it delivered)."""
        if self._current is None or (position is None and self._done):
            epoch, plan = self._next_epoch, list(self._pending)
        else:
            epoch, plan, total = self._current
            position = self._served if position is None else position
            if position >= total:
                epoch, plan = epoch + 1, []
            else:
                plan = _merge(plan, self.world_size, position)
        return {"sampler": type(self).__name__, "epoch": epoch, "plan": [list(p) for p in plan],
                "world_size": self.world_size, **self.settings()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration serves the rest of its epoch."""
        if not isinstance(state, dict) or not {"sampler", "epoch", "plan"} <= set(state):
            raise ResumeError("not a sampler state: it needs 'sampler', 'epoch' and 'plan'")
        if state["sampler"] != type(self).__name__:
            raise ResumeError(f"the state is of a {state['sampler']}, this is a "
                              f"{type(self).__name__}")
        differ = [f"{k} {state.get(k)!r} (now {v!r})" for k, v in self.settings().items()
                  if state.get(k) != v]
        if differ:
            raise ResumeError("the saved order was made with other settings: " + ", ".join(differ))
        try:
            epoch = int(state["epoch"])
            plan = [(int(w), int(k)) for w, k in state["plan"]]
        except (TypeError, ValueError):
            raise ResumeError(f"corrupted sampler state: epoch {state['epoch']!r}, "
                              f"plan {state['plan']!r}") from None
        if epoch < 0 or any(w < 1 or k < 0 for w, k in plan):
            raise ResumeError(f"corrupted sampler state: epoch {epoch}, plan {plan}")
        self._next_epoch, self._pending = epoch, plan
        self._current, self._done = None, False


def _merge(plan: Segments, world: int, batches: int) -> Segments:
    """``plan`` followed by ``batches`` at ``world`` ranks (joined with a last segment at the same
    world size, which re-splits to the same order)."""
    if plan and plan[-1][0] == world:
        return [*plan[:-1], (world, plan[-1][1] + batches)]
    return [*plan, (world, batches)] if batches else list(plan)


class EpochBatchSampler(SeededSampler):
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
        super().__init__(seed, rank, world_size)
        self.size = count_argument("size", size)
        self.batch_size = count_argument("batch_size", batch_size, 1)
        self.shuffle, self.drop_last = shuffle, drop_last

    def settings(self) -> dict[str, Any]:
        return {"seed": self.seed, "size": self.size, "batch_size": self.batch_size,
                "shuffle": self.shuffle, "drop_last": self.drop_last}

    def indices(self, epoch: int, plan: Segments = ()) -> np.ndarray:
        """This rank's indices for ``epoch``, in order (the rest of it after ``plan``'s
        segments, re-split over this world size)."""
        full = self.rng(epoch).permutation(self.size) if self.shuffle else np.arange(self.size)
        rest = full
        for world, batches in plan:
            rest = rest[min(batches * self.batch_size * world, len(rest)):]
        if self.world_size == 1:
            return rest
        share = per_rank(len(rest), self.world_size, self.drop_last)
        pad = share * self.world_size - len(rest)
        # cut short, or wrapped round with the epoch's first samples (the same pad however the
        # epoch was split into segments)
        order = rest[: share * self.world_size] if pad <= 0 else np.concatenate(
            [rest, np.resize(full, pad)])
        return order[self.rank :: self.world_size]

    def _batches(self, epoch: int, plan: Segments) -> list[np.ndarray]:
        order = self.indices(epoch, plan)
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        return [order[a : a + self.batch_size] for a in range(0, stop, self.batch_size)]

    def __len__(self) -> int:
        """Batches per epoch on each rank (every rank the same: ``ceil(size / world)`` samples,
        the last few wrapped round, or with ``drop_last`` ``floor(size / world)`` samples in
        whole batches only)."""
        n = per_rank(self.size, self.world_size, self.drop_last)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
