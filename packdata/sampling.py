"""Batch samplers: which indices go in each batch, per epoch, per DDP rank.

Every sampler here yields lists of indices (one list per batch) so the Dataset reads each batch
with one vectorised call. Shuffling is a pure function of ``(seed, epoch)``: the same seed gives the
same batches on every rank and in every run. :class:`EpochBatchSampler` draws batches at random;
:class:`LengthBucketBatchSampler` groups documents of similar length so padding stays small.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterable, Iterator, Sequence
from multiprocessing import sharedctypes
from typing import Any

import numpy as np
import torch.distributed as dist
from torch.utils.data import Sampler, get_worker_info

from packdata.errors import ArgumentError


def ddp_rank_world() -> tuple[int, int]:
    """(rank, world size) of the default process group, or (0, 1) outside DDP."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def per_rank(count: int, world_size: int, drop_last: bool) -> int:
    """Samples each of ``world_size`` ranks gets of ``count``: all of them, the last few wrapped
    round to make equal shares, or with ``drop_last`` the remainder left out."""
    return count // world_size if drop_last else -(-count // world_size)


class SharedEpoch:
    """An epoch number that DataLoader workers see change.

    It lives in shared memory, so :meth:`set` in the training process reaches persistent workers.
    For objects that advance by themselves on each iteration, every process (the training
    process, or worker ``i``) counts the iterations it began since the last :meth:`set`, in shared
    memory too: non-persistent workers, which start each epoch from the training process's copy,
    still see epoch 0, 1, 2… Plain pickling (``copy.deepcopy``, sending elsewhere) copies it.
    """

    SLOTS = 256  # the training process and up to 255 DataLoader workers

    def __init__(self, epoch: int = 0) -> None:
        self._state = sharedctypes.RawArray("q", self.SLOTS + 1)
        self._state[0] = epoch

    def set(self, epoch: int) -> None:
        """Start from ``epoch``: the next iteration of every process runs it."""
        self._state[1:] = [0] * self.SLOTS
        self._state[0] = epoch

    @property
    def value(self) -> int:
        """The epoch last :meth:`set`."""
        return self._state[0]

    def begin_iteration(self) -> int:
        """The epoch this process's iteration runs; its next iteration runs the one after."""
        info = get_worker_info()
        slot = 1 if info is None else 2 + info.id % (self.SLOTS - 1)
        epoch = self._state[0] + self._state[slot]
        self._state[slot] += 1
        return epoch

    def __getstate__(self) -> dict[str, Any]:
        if mp.context.get_spawning_popen() is not None:  # handed to a new worker: share
            return {"shared": self._state}
        return {"copy": list(self._state)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "shared" in state:
            self._state = state["shared"]
        else:
            self._state = sharedctypes.RawArray("q", state["copy"])


class _SeededSampler(Sampler[list[int]]):
    """What every batch sampler here shares: seed, epoch counter and this process's DDP rank."""

    def __init__(self, seed: int, rank: int | None, world_size: int | None) -> None:
        default_rank, default_world = ddp_rank_world()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ArgumentError(f"rank {self.rank} is outside world size {self.world_size}")
        self.seed = seed
        self.epoch = 0
        self._next_epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (as DistributedSampler's ``set_epoch``)."""
        self._next_epoch = epoch

    def _begin_epoch(self) -> int:
        """Called as iteration starts: the epoch to run; the following one runs next."""
        self.epoch = self._next_epoch
        self._next_epoch += 1
        return self.epoch

    def rng(self, epoch: int) -> np.random.Generator:
        """The generator of ``epoch``: the same on every rank."""
        return np.random.default_rng([self.seed, epoch])


class EpochBatchSampler(_SeededSampler):
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
        if batch_size < 1:
            raise ArgumentError(f"batch_size must be ≥ 1, got {batch_size}")
        super().__init__(seed, rank, world_size)
        self.size = size
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last

    def indices(self, epoch: int) -> np.ndarray:
        """This rank's indices for ``epoch``, in order."""
        order = self.rng(epoch).permutation(self.size) if self.shuffle else np.arange(self.size)
        if self.world_size > 1:
            share = per_rank(self.size, self.world_size, self.drop_last)
            order = np.resize(order, share * self.world_size)  # cut short, or wrapped round
            order = order[self.rank :: self.world_size]
        return order

    def __iter__(self) -> Iterator[list[int]]:
        order = self.indices(self._begin_epoch())
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        for start in range(0, stop, self.batch_size):
            yield order[start : start + self.batch_size].tolist()

    def __len__(self) -> int:
        n = per_rank(self.size, self.world_size, self.drop_last)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class LengthBucketBatchSampler(_SeededSampler):
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
        if (batch_size or max_tokens or 0) < 1:
            raise ArgumentError(f"batch size must be ≥ 1, got {batch_size or max_tokens}")
        if bucket_width < 0:
            raise ArgumentError(f"bucket_width must be ≥ 0, got {bucket_width}")
        super().__init__(seed, rank, world_size)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if len(self.lengths) < self.world_size:
            raise ArgumentError(f"{len(self.lengths)} documents cannot be split over "
                             f"{self.world_size} ranks")
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.shuffle = shuffle
        self.bucket_width = bucket_width
        self._cache: tuple[int, list[np.ndarray]] | None = None

    def _bucket_keys(self, rng: np.random.Generator | None) -> np.ndarray:
        if self.bucket_width == 0:
            return self.lengths
        scaled = np.log(np.maximum(self.lengths, 1)) / np.log1p(self.bucket_width)
        # bucket edges move each epoch, so lengths near an edge meet different neighbours
        return np.floor(scaled + (rng.random() if rng is not None else 0.0))

    def batches(self, epoch: int) -> list[np.ndarray]:
        """Every batch of ``epoch`` over all ranks, in serving order (rank ``r`` takes every
        ``world_size``-th from the ``r``-th)."""
        if self._cache is not None and self._cache[0] == epoch:
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
        batches = _even_for_ranks(batches, self.world_size)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._cache = (epoch, batches)
        return batches

    def padding_fraction(self, epoch: int | None = None) -> float:
        """Share of pad tokens when each batch of ``epoch`` (default: the next) is padded to its
        longest document, over all ranks."""
        return padding_fraction(self.batches(self._next_epoch if epoch is None else epoch),
                                self.lengths)

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches(self._begin_epoch())
        for batch in batches[self.rank :: self.world_size]:
            yield batch.tolist()

    def __len__(self) -> int:
        return len(self.batches(self._next_epoch)) // self.world_size


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
