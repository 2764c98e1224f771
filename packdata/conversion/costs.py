"""What a conversion's time goes to, phase by phase and process by process, so that its serial
share is a number (bench/bench_convert_cost.py prints it).

The converting process (the parent) times each of its phases in wall and CPU seconds; worker
processes time theirs in CPU seconds and send them back with each block, summed here. Only the
parent's own phases are serial: what workers do spreads over the cores they are given. Timing
costs two clock reads per phase and block, nothing per record.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from packdata.errors import ArgumentError

#: the parent's phases, in the order a conversion runs them
PARENT = ("listing", "keys", "survey", "surveying", "probe", "load", "hand-over", "writing",
          "hashing", "metadata", "finish", "commit")
#: the workers' phases (CPU seconds): reading the inputs' headers (survey), loading, packing,
#: hashing and writing records where the output lays them out (place); in a one-process
#: conversion the parent runs them itself, under its own phases "survey" and "load"
WORKER = ("survey", "load", "pack", "hashing", "place")
#: phases of the parent that spread with the workers: what it does only where no worker does it
SPREAD = ("survey", "load")


def _known(name: str, phases: tuple[str, ...]) -> str:
    # a misspelt phase would be timed apart and counted as serial: refused instead
    if name not in phases:
        raise ArgumentError(f"no conversion phase {name!r} (phases: {', '.join(phases)})")
    return name


@dataclass
class Costs:
    """Seconds and bytes of one conversion. ``parent``: phase → [wall, cpu]; ``workers``: phase
    → CPU seconds summed over the workers; ``bytes``: what was ``read`` (input files),
    ``handed_over`` (results sent from workers to the parent) and ``written`` (the output)."""

    parent: dict[str, list[float]] = field(default_factory=dict)
    workers: dict[str, float] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as the parent's phase ``name`` (phases add up when repeated)."""
        _known(name, PARENT)
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            spent = self.parent.setdefault(name, [0.0, 0.0])
            spent[0] += time.perf_counter() - wall
            spent[1] += time.process_time() - cpu

    @staticmethod
    def mark() -> tuple[float, float]:
        """Now, in wall and CPU seconds (see :meth:`since`)."""
        return time.perf_counter(), time.process_time()

    def since(self, name: str, mark: tuple[float, float]) -> None:
        """Time since ``mark`` (:meth:`mark`) added to the parent's phase ``name``: for a phase
        that ends where no block can wrap it (a commit, on leaving its context)."""
        spent = self.parent.setdefault(_known(name, PARENT), [0.0, 0.0])
        spent[0] += time.perf_counter() - mark[0]
        spent[1] += time.process_time() - mark[1]

    def add_workers(self, spent: dict[str, float]) -> None:
        """A worker's CPU seconds per phase, for one task."""
        for name, seconds in spent.items():
            self.workers[name] = self.workers.get(name, 0.0) + seconds

    def count(self, name: str, nbytes: int) -> None:
        self.bytes[name] = self.bytes.get(name, 0) + int(nbytes)

    def serial_cpu(self) -> float:
        """CPU seconds of the parent's phases that no worker could take."""
        return sum(cpu for name, (_, cpu) in self.parent.items() if name not in SPREAD)

    def to_dict(self) -> dict[str, Any]:
        return {"parent": {k: {"wall": round(w, 6), "cpu": round(c, 6)}
                           for k, (w, c) in self.parent.items()},
                "workers": {k: round(v, 6) for k, v in self.workers.items()},
                "bytes": dict(self.bytes), "serial_cpu": round(self.serial_cpu(), 6)}


class WorkerClock:
    """A worker's CPU seconds per phase for one task (:meth:`Costs.add_workers` adds them up)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        _known(name, WORKER)
        cpu = time.process_time()
        try:
            yield
        finally:
            self.spent[name] = self.spent.get(name, 0.0) + time.process_time() - cpu
