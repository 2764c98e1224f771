"""Sizes and counts as users write them (a seed, an epoch), how many cores this process may
use, and whether it reads batches for another process."""

from __future__ import annotations

import numbers
import os
import sys
from collections.abc import Iterable

from packdata.errors import ArgumentError, ArgumentTypeError

_UNITS = (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10), ("B", 1))


def count_argument(name: str, value: object, least: int = 0) -> int:
    """``value`` (an int or a numpy integer) as an int of at least ``least``; an ArgumentError
    naming ``name`` for anything else (booleans, floats, strings, smaller numbers)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ArgumentError(f"{name} must be an integer ≥ {least}, got {value!r}")
    return int(value)


def callable_argument(name: str, value: object) -> None:
    """An ArgumentTypeError naming ``name`` unless ``value`` is None or can be called: refused
    where it is given, not as a TypeError at the first batch that calls it."""
    if value is not None and not callable(value):
        raise ArgumentTypeError(f"{name} must be callable, got {value!r:.60}")


def iterable_argument(name: str, value: object, of: str, optional: bool = True) -> None:
    """An ArgumentTypeError naming ``name`` unless ``value`` can be iterated (an iterable ``of``
    what), or is None where ``optional``: refused where it is given, not as a TypeError when
    first iterated."""
    if not (optional and value is None) and not isinstance(value, Iterable):
        raise ArgumentTypeError(f"{name} must be an iterable of {of}, got {value!r:.60}")


def size_pair(value: object, what: str, error: type[Exception] = ArgumentError) -> tuple[int, int]:
    """``value`` (a positive whole number, or two: height and width) as (H, W); ``error``
    naming ``what`` for anything else."""
    try:
        h, w = (value, value) if isinstance(value, numbers.Integral) else tuple(value)  # type: ignore[arg-type]
        if int(h) == h > 0 and int(w) == w > 0:
            return int(h), int(w)
    except (TypeError, ValueError):  # not a pair, not numbers
        pass
    raise error(f"{what} {value!r}: expected positive integers (H, W)")


def parse_bytes(value: int | str) -> int:
    """``10_000_000`` or ``"10GB"``/``"512MB"``/``"64KB"`` as a byte count."""
    text = str(value).strip().upper()
    number, scale = text, 1
    for unit, unit_scale in _UNITS:
        if text.endswith(unit):
            number, scale = text[: -len(unit)], unit_scale
            break
    try:
        size = int(float(number) * scale) if scale > 1 else int(number)
    except ValueError:
        size = -1
    if size < 0:
        raise ArgumentError(f"size '{value}': expected a byte count or a size like 512MB")
    return size


def parse_count_or_bytes(value: int | str, what: str) -> tuple[int | None, int | None]:
    """``"10000"`` → ``(10000, None)`` (a count); ``"512MB"`` → ``(None, 536870912)`` (bytes);
    an ArgumentError naming ``what`` for anything else, or for nothing (0, or less)."""
    text = str(value).strip().upper()
    try:
        count, size = (None, parse_bytes(text)) if text.endswith(
            tuple(unit for unit, _ in _UNITS)) else (int(text), None)
    except (ValueError, ArgumentError):
        count = size = 0
    if (count or size or 0) < 1:  # none, or nothing in each: -5 made a shard per sample
        raise ArgumentError(f"{what} '{value}': expected a count or a size like 512MB, above 0")
    return count, size


def available_cores() -> int:
    """Cores this process may run on: its CPU affinity where the platform tells (a container
    or a batch job's allocation), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_READS_FOR_ANOTHER = False  # set in a loader's feeder process (which is no DataLoader worker)


def read_for_another_process() -> None:
    """Mark this process as one that reads batches for another (a loader's feeder)."""
    global _READS_FOR_ANOTHER
    _READS_FOR_ANOTHER = True


def reads_for_another_process() -> bool:
    """Whether this process reads batches for a training process: a DataLoader worker or a
    loader's feeder. It hands its batches over through shared memory, and must not start CUDA
    (the training process, forked after CUDA started, is the one that pins and copies)."""
    if _READS_FOR_ANOTHER:
        return True
    data = sys.modules.get("torch.utils.data")  # no torch loaded: no DataLoader worker either
    return data is not None and data.get_worker_info() is not None


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and ``noun`` as a message says them: "1 file", "2 files", "10,000 records"
    (``many``: the plural when it is not ``noun`` + "s")."""
    return f"{count:,} {noun if count == 1 else many or noun + 's'}"
