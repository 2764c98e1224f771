"""Samples per second delivered by a loader to a loop that touches every batch."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from packdata.bench.timer import batch_size_of


def touch(batch: Any) -> int:
    """Read one element of every sample so that lazily produced data is really produced."""
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    if isinstance(x, torch.Tensor):
        return int(x[(slice(None),) + (0,) * (x.ndim - 1)].sum())  # no copy of the batch
    return sum(int(t[(0,) * t.ndim]) for t in x)


def sample_rate(
    make_batches: Callable[[], Iterable[Any]],
    *,
    min_seconds: float = 1.0,
    warmup_batches: int = 2,
    consume: Callable[[Any], Any] = touch,
) -> float:
    """Samples/s over whole passes of ``make_batches()`` (at least ``min_seconds`` of them).

    The first ``warmup_batches`` of the first pass are not timed (worker start-up, cold caches).
    """
    samples = 0
    elapsed = 0.0
    first = True
    while elapsed < min_seconds:
        start = time.perf_counter()
        for i, batch in enumerate(make_batches()):
            consume(batch)
            if first and i + 1 == warmup_batches:
                start = time.perf_counter()
                continue
            if not (first and i < warmup_batches):
                samples += batch_size_of(batch)
        elapsed += time.perf_counter() - start
        first = False
    return samples / elapsed
