"""``--sweep``: the real loop under each DataLoader setting, repeated, as one table: a winner named
only when it beats the others beyond their spread, otherwise the tie said as one."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from packdata.bench.inputs import BenchInput, LoaderOptions
from packdata.bench.runner import Trainer, measure_loop
from packdata.bench.settings import BenchSettings
from packdata.errors import BenchError
from packdata.loading.device import Augment


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
    seconds: float = 60.0,
    log: Callable[[str], Any] = lambda m: None,
    repeats: int = 3,
    augment: Augment | None = None,
) -> dict[str, Any]:
    """The real loop under each configuration, ``repeats`` times in interleaved rounds (a
    slowdown of the machine hits every configuration alike), each run from the same weights.
    ``seconds`` is the budget of the whole sweep, shared equally by the runs (each takes at
    least one warm-up and one timed step; warm, half of a run's share reads the batches first).
    Each configuration's shortest run (its workers started, its fewest steps) is measured
    first, for the fewest and the most workers: what is left of ``seconds`` after those is
    shared; where nothing is, ``log`` says so before the sweep, with the time it will take.

    Returns ``{"rows": [{options…, samples_per_s (median), rates (each run), spread, load_ms,
    train_ms, load_share (medians), steps, samples, seconds (totals)}], "best", "tied", "pick",
    "repeats", "seconds"}`` (see :func:`decide`).
    """
    if repeats < 2:
        raise BenchError(f"sweep repeats must be ≥ 2 to tell a difference from noise, "
                         f"got {repeats}")
    if not configs:
        raise BenchError("the sweep has no configuration to measure")
    start = time.perf_counter()
    initial = trainer.state()
    # two warm-up steps suffice to start the workers (the first batch waits for them)
    shortest = dataclasses.replace(settings, warmup=min(settings.warmup, 2), max_seconds=1e-3)
    floors = _floors(inp, trainer, shortest, configs, augment)
    need = repeats * sum(floors)  # every run as short as it can be: start, a step or two
    spent = time.perf_counter() - start
    if spent + need > seconds:
        log(f"warning: {len(configs)} configurations × {repeats} runs take at least "
            f"{spent + need:.0f} s on this input (each starts its loader's workers and runs "
            f"at least {shortest.warmup + 1} steps), more than --sweep-seconds {seconds:g}: "
            "every run is made as short as it can be")
    per_run = max(seconds - spent - need, 0.0) / (len(configs) * repeats)  # beyond its floor
    if settings.warm:  # each run reads its batches once untimed, then times them: half each
        per_run /= 2
    bounded = dataclasses.replace(shortest, max_seconds=min(settings.max_seconds,
                                                            max(per_run, 1e-3)))
    runs: list[list[dict[str, Any]]] = [[] for _ in configs]
    for r in range(repeats):
        for i, options in enumerate(configs):
            trainer.restore(initial)
            result = measure_loop(inp, trainer, bounded, options, augment=augment)
            runs[i].append(result)
            log(f"sweep round {r + 1}/{repeats}, {i + 1}/{len(configs)}: {describe(options)}: "
                f"{result['samples_per_s']:,.0f} samples/s")
    trainer.restore(initial)
    rows = [{**options.to_dict(), **_combine(results)} for options, results in zip(configs, runs)]
    return {"rows": rows, **decide(rows), "repeats": repeats,
            "seconds": time.perf_counter() - start}


def _floors(inp: BenchInput, trainer: Trainer, shortest: BenchSettings,
            configs: Sequence[LoaderOptions], augment: Augment | None) -> list[float]:
    """Each configuration's shortest run in seconds (its loader started, its fewest steps),
    from two runs made now: the one with no workers, and the one with most (which start the
    most processes; counts between are interpolated)."""
    state = trainer.state()
    most = max(configs, key=lambda c: (c.num_workers, not c.persistent_workers))
    least = min(configs, key=lambda c: c.num_workers)
    timed = {}
    for options in dict.fromkeys((least, most)):
        begun = time.perf_counter()
        measure_loop(inp, trainer, shortest, options, augment=augment)
        timed[options.num_workers] = time.perf_counter() - begun
        trainer.restore(state)
    low, high = timed[least.num_workers], timed[most.num_workers]
    span = most.num_workers - least.num_workers
    return [low + (high - low) * (c.num_workers - least.num_workers) / (span or 1)
            for c in configs]


def _combine(results: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["samples_per_s"] for r in results]
    median = statistics.median(rates)
    return {
        "samples_per_s": median,
        "rates": rates,
        "spread": (max(rates) - min(rates)) / median if median > 0 else math.nan,
        **{k: statistics.median(r[k] for r in results)
           for k in ("load_ms", "train_ms", "load_share")},
        **{k: sum(r[k] for r in results) for k in ("steps", "samples", "seconds")},
    }


def _cost(row: dict[str, Any]) -> tuple:
    """Fewer workers, then less prefetching, persistence, pinning: what a tie should settle on."""
    return (row["num_workers"], row["prefetch_factor"] or 0, row["persistent_workers"],
            row["pin_memory"], row["non_blocking"])


def decide(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Which configuration wins, from each row's ``rates`` over the repeats.

    The fastest by median wins (``best``) only when its slowest run beats every other
    configuration's fastest; otherwise ``best`` is None and ``tied`` lists the configurations
    whose range overlaps the fastest's (within noise of it). ``pick`` is the one to use: the
    winner, or among the tied the cheapest (fewest workers, then no prefetch, persistence or
    pinning).
    """
    fastest = max(range(len(rows)), key=lambda i: rows[i]["samples_per_s"])
    floor = min(rows[fastest]["rates"])
    tied = [i for i, row in enumerate(rows) if max(row["rates"]) >= floor]
    best = fastest if tied == [fastest] else None
    pick = fastest if best is not None else min(tied, key=lambda i: _cost(rows[i]))
    return {"best": best, "tied": tied, "pick": pick}


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
