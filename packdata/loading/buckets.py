"""Length bucketing: batches of documents of similar length, so that padding each batch to its
longest member wastes little, with every index served once per epoch across DDP ranks."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from packdata.errors import ArgumentError
from packdata.loading.sampling import SeededSampler, Segments
from packdata.units import count_argument


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

    def batches(self, epoch: int, plan: Segments = ()) -> list[np.ndarray]:
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
            batches = budget_batches(order, self.lengths[order], self.max_tokens)  # type: ignore[arg-type]
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

    def _batches(self, epoch: int, plan: Segments) -> list[np.ndarray]:
        return self.batches(epoch, plan)[self.rank :: self.world_size]

    def __len__(self) -> int:
        """Batches the next epoch serves on each rank (every rank the same)."""
        return len(self.batches(self._next_epoch, self._pending)) // self.world_size


def budget_batches(order: np.ndarray, lengths: np.ndarray, max_tokens: int) -> list[np.ndarray]:
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
