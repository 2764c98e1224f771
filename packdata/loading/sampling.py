"""Batch samplers: which indices go in each batch, per epoch, per DDP rank.

Every sampler here yields lists of indices (one list per batch) so the Dataset reads each batch
with one vectorised call. Shuffling is a pure function of ``(seed, epoch)``: the same seed gives the
same batches on every rank and in every run. :class:`EpochBatchSampler` draws batches at random;
:class:`LengthBucketBatchSampler` groups documents of similar length so padding stays small.
"""

from __future__ import annotations

import multiprocessing as mp
import zlib
from collections.abc import Iterable, Iterator, Sequence
from multiprocessing import sharedctypes
from typing import Any

import numpy as np
import torch.distributed as dist
from torch.utils.data import Sampler

from packdata.errors import ArgumentError, ResumeError
from packdata.units import count_argument


def ddp_rank_world() -> tuple[int, int]:
    """(rank, world size) of the default process group, or (0, 1) outside DDP."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``rank`` and ``world_size`` as given, each defaulting to the process group's (see
    :func:`ddp_rank_world`); ArgumentError when the rank is outside the world."""
    default_rank, default_world = ddp_rank_world()
    rank = default_rank if rank is None else rank
    world_size = default_world if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ArgumentError(f"rank {rank} is outside world size {world_size}")
    return rank, world_size


def per_rank(count: int, world_size: int, drop_last: bool) -> int:
    """Samples each of ``world_size`` ranks gets of ``count``: all of them, the last few wrapped
    round to make equal shares, or with ``drop_last`` the remainder left out."""
    return count // world_size if drop_last else -(-count // world_size)


class SharedState:
    """Integers (``_state``) in memory shared with the DataLoader workers this object is handed
    to, so that what the training process writes later reaches persistent workers. Plain
    pickling (``copy.deepcopy``, sending elsewhere) copies them."""

    def __init__(self, size: int) -> None:
        self._state = sharedctypes.RawArray("q", size)

    def __getitem__(self, i: int) -> int:
        return self._state[i]

    def __setitem__(self, i: int, value: int) -> None:
        self._state[i] = value

    def __getstate__(self) -> dict[str, Any]:
        if mp.context.get_spawning_popen() is not None:  # handed to a new worker: share
            return {"shared": self._state}
        return {"copy": list(self._state)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "shared" in state:
            self._state = state["shared"]
        else:
            self._state = sharedctypes.RawArray("q", state["copy"])


class SharedEpoch(SharedState):
    """An epoch number that DataLoader workers see change (:class:`SharedState`)."""

    def __init__(self, epoch: int = 0) -> None:
        super().__init__(1)
        self._state[0] = epoch

    def set(self, epoch: int) -> None:
        """Every process's next reads are of ``epoch``."""
        self._state[0] = count_argument("epoch", epoch)

    @property
    def value(self) -> int:
        """The epoch last :meth:`set`."""
        return self._state[0]


Plan = list[tuple[int, int]]  # an epoch's finished segments: (world size, batches each rank took)


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
        self._pending: Plan = []  # finished segments of the next epoch (after a resume)
        self._current: tuple[int, Plan, int] | None = None  # (epoch, plan, batches) iterating
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

    def _batches(self, epoch: int, plan: Plan) -> list[np.ndarray]:
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


def _merge(plan: Plan, world: int, batches: int) -> Plan:
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

    def indices(self, epoch: int, plan: Plan = ()) -> np.ndarray:
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

    def _batches(self, epoch: int, plan: Plan) -> list[np.ndarray]:
        order = self.indices(epoch, plan)
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        return [order[a : a + self.batch_size] for a in range(0, stop, self.batch_size)]

    def __len__(self) -> int:
        """Batches per epoch on each rank (every rank the same: ``ceil(size / world)`` samples,
        the last few wrapped round, or with ``drop_last`` ``floor(size / world)`` samples in
        whole batches only)."""
        n = per_rank(self.size, self.world_size, self.drop_last)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class LengthBucketBatchSampler(SeededSampler):
    """Batches of documents of similar length, so each batch pads little to its longest member.

    Each epoch: shuffle all indices, sort them by length bucket (a bucket holds lengths within a
    factor ``1 + bucket_width`` of each other, its edges shifted at random each epoch; inside a
    bucket the shuffled order stays), cut the
    sorted run into batches — ``batch_size`` documents each, or as many as fit ``max_tokens``
    padded tokens (count × longest) — then shuffle the order of the batches. A document longer
    than ``max_tokens`` makes a batch of its own.

    Across DDP ranks every index is served exactly once per epoch: the epoch's batches are the same
    on every rank (one seed), and rank ``r`` of ``w`` takes batches ``r, r + w, …``; when their
    number does not divide by ``w``, the largest batches are halved until it does, so every rank
    runs the same number of steps (only when every batch already holds a single
    document are a few served twice). ``shuffle=False`` gives the batches in ascending length order.
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        batch_size: int | None = None,
        *,
        max_tokens: int | None = None,
        bucket_width: float = 0.02,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if (batch_size is None) == (max_tokens is None):
            raise ArgumentError("give exactly one of batch_size (documents) or max_tokens (a budget)")
        count_argument("batch_size" if max_tokens is None else "max_tokens",
                       max_tokens if batch_size is None else batch_size, 1)
        if bucket_width < 0:
            raise ArgumentError(f"bucket_width must be ≥ 0, got {bucket_width}")
        super().__init__(seed, rank, world_size)
        self.lengths = np.asarray(lengths)
        if len(self.lengths) and (self.lengths.dtype.kind not in "iu" or (self.lengths < 0).any()):
            raise ArgumentError(f"lengths must be integers ≥ 0, got {lengths!r:.60}")
        self.lengths = self.lengths.astype(np.int64)
        if len(self.lengths) < self.world_size:
            raise ArgumentError(f"{len(self.lengths)} documents cannot be split over "
                             f"{self.world_size} ranks")
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.shuffle, self.bucket_width = shuffle, bucket_width
        self._cache: tuple[tuple[int, int], list[np.ndarray]] | None = None

    def _bucket_keys(self, rng: np.random.Generator | None) -> np.ndarray:
        if self.bucket_width == 0:
            return self.lengths
        scaled = np.log(np.maximum(self.lengths, 1)) / np.log1p(self.bucket_width)
        # bucket edges move each epoch, so lengths near an edge meet different neighbours
        return np.floor(scaled + (rng.random() if rng is not None else 0.0))

    def settings(self) -> dict[str, Any]:
        return {"seed": self.seed, "size": len(self.lengths), "batch_size": self.batch_size,
                "max_tokens": self.max_tokens, "bucket_width": self.bucket_width,
                "shuffle": self.shuffle,
                "lengths_crc": zlib.crc32(np.ascontiguousarray(self.lengths).data)}

    def batches(self, epoch: int, plan: Plan = ()) -> list[np.ndarray]:
        """Every batch of ``epoch`` over all ranks, in serving order (rank ``r`` takes every
        ``world_size``-th from the ``r``-th); after ``plan``'s segments, the rest of them."""
        worlds = [w for w, _ in plan] + [self.world_size]
        batches = self._epoch_batches(epoch, worlds[0])
        for world, taken in plan:
            batches = _even_for_ranks(list(batches), world)[taken * world:]
        return _even_for_ranks(list(batches), self.world_size)

    def _epoch_batches(self, epoch: int, world_size: int) -> list[np.ndarray]:
        if self._cache is not None and self._cache[0] == (epoch, world_size):
            return self._cache[1]
        rng = self.rng(epoch)
        n = len(self.lengths)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        keys = self._bucket_keys(rng if self.shuffle else None)
        order = order[np.argsort(keys[order], kind="stable")]
        if self.batch_size is not None:
            batches = np.split(order, range(self.batch_size, n, self.batch_size))
        else:
            batches = _budget_batches(order, self.lengths[order], self.max_tokens)  # type: ignore[arg-type]
        batches = _even_for_ranks(batches, world_size)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._cache = ((epoch, world_size), batches)
        return batches

    def padding_fraction(self, epoch: int | None = None) -> float:
        """Share of pad tokens when each batch of ``epoch`` (default: the next) is padded to its
        longest document, over all ranks."""
        return padding_fraction(self.batches(self._next_epoch if epoch is None else epoch),
                                self.lengths)

    def _batches(self, epoch: int, plan: Plan) -> list[np.ndarray]:
        return self.batches(epoch, plan)[self.rank :: self.world_size]

    def __len__(self) -> int:
        """Batches the next epoch serves on each rank (every rank the same)."""
        return len(self.batches(self._next_epoch, self._pending)) // self.world_size


def _budget_batches(order: np.ndarray, lengths: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Cut ``order`` greedily into batches whose count × longest stays within ``max_tokens``."""
    cuts, count, longest = [], 0, 0
    for i, length in enumerate(lengths.tolist()):
        top = max(longest, length)
        if count and (count + 1) * top > max_tokens:
            cuts.append(i)
            count, top = 0, length
        count += 1
        longest = top
    return np.split(order, cuts)


def _even_for_ranks(batches: list[np.ndarray], world_size: int) -> list[np.ndarray]:
    """Halve the largest batches until their number divides by ``world_size``; once every batch
    is down to one document, repeat the first batches instead (as DistributedSampler pads)."""
    while len(batches) % world_size:
        largest = max(range(len(batches)), key=lambda i: len(batches[i]))
        big = batches[largest]
        if len(big) < 2:
            batches += batches[: world_size - len(batches) % world_size]
            break
        half = len(big) // 2
        batches[largest : largest + 1] = [big[:half], big[half:]]  # stays in length order
    return batches


def padding_fraction(batches: Iterable[Sequence[int]], lengths: np.ndarray) -> float:
    """Pad tokens ÷ all tokens when each batch is padded to its longest member."""
    lengths = np.asarray(lengths)
    real = padded = 0
    for batch in batches:
        sizes = lengths[np.asarray(batch, dtype=np.int64)]
        if len(sizes):
            real += int(sizes.sum())
            padded += int(sizes.max()) * len(sizes)
    return 1 - real / padded if padded else 0.0
