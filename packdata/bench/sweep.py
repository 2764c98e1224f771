"""``--sweep``: the real loop under each DataLoader setting, as one table with the best named."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from packdata.bench.inputs import BenchInput, LoaderOptions
from packdata.bench.runner import BenchSettings, Trainer, measure_loop


def worker_counts(cores: int) -> list[int]:
    """0, 1, 2, 4… up to ``cores``, and ``cores`` itself (every count on small machines)."""
    counts = {0, cores}
    n = 1
    while n < cores:
        counts.add(n)
        n *= 2
    return sorted(counts)


def grid(
    workers: Iterable[int],
    prefetch_factor: Sequence[int] = (2, 4),
    persistent_workers: Sequence[bool] = (False, True),
    pin_memory: Sequence[bool] = (False,),
    non_blocking: Sequence[bool] = (False,),
) -> list[LoaderOptions]:
    """Every combination; settings that only apply with workers (prefetch, persistence) or with
    pinned memory (non_blocking) are not repeated where they cannot matter."""
    seen: dict[LoaderOptions, None] = {}
    for w, pf, pers, pin, nb in itertools.product(
            workers, prefetch_factor, persistent_workers, pin_memory, non_blocking):
        seen[LoaderOptions(
            num_workers=w, prefetch_factor=pf if w else None, persistent_workers=pers and w > 0,
            pin_memory=pin, non_blocking=nb and pin)] = None
    return list(seen)


def default_grid(cores: int, device: torch.device) -> list[LoaderOptions]:
    """num_workers 0…cores × prefetch_factor × persistent_workers, and on CUDA pin_memory ×
    non_blocking (pinning means nothing without a GPU to copy to)."""
    cuda = device.type == "cuda"
    return grid(worker_counts(cores), pin_memory=(False, True) if cuda else (False,),
                non_blocking=(False, True) if cuda else (False,))


def run_sweep(
    inp: BenchInput,
    trainer: Trainer,
    settings: BenchSettings,
    configs: Sequence[LoaderOptions],
    seconds_per_config: float = 6.0,
    log: Callable[[str], Any] = lambda m: None,
) -> dict[str, Any]:
    """The real loop under each configuration (from the same weights each time).

    Returns ``{"rows": [{options…, samples_per_s, load_ms, train_ms, load_share, steps}],
    "best": index of the fastest row, "seconds": wall time of the sweep}``.
    """
    start = time.perf_counter()
    # two warm-up steps suffice to start the workers (the first batch waits for them); more
    # would cost every configuration several training steps on a slow device
    bounded = dataclasses.replace(settings, warmup=min(settings.warmup, 2),
                                  max_seconds=min(settings.max_seconds, seconds_per_config))
    initial = trainer.state()
    rows = []
    for i, options in enumerate(configs):
        trainer.restore(initial)
        result = measure_loop(inp, trainer, bounded, options)
        rows.append({**options.to_dict(), **result})
        log(f"sweep {i + 1}/{len(configs)}: {describe(options)}: "
            f"{result['samples_per_s']:,.0f} samples/s")
    trainer.restore(initial)
    best = max(range(len(rows)), key=lambda i: rows[i]["samples_per_s"]) if rows else None
    return {"rows": rows, "best": best, "seconds": time.perf_counter() - start}


def describe(options: LoaderOptions | dict[str, Any]) -> str:
    """``num_workers=2, prefetch_factor=4, persistent_workers=True`` (defaults left out)."""
    o = options if isinstance(options, dict) else options.to_dict()
    parts = [f"num_workers={o['num_workers']}"]
    if o["num_workers"]:
        parts.append(f"prefetch_factor={o['prefetch_factor']}")
        parts.append(f"persistent_workers={o['persistent_workers']}")
    if o["pin_memory"]:
        parts.append("pin_memory=True")
    if o["non_blocking"]:
        parts.append("non_blocking=True")
    return ", ".join(parts)
