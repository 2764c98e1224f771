"""Loader state for mid-epoch resume, and the definition of "resumable" that checks it.

A loader's state is O(1) in the dataset size: the sampler's epoch and position (batches each
rank took, and at which world size), the settings that fix the order, a fingerprint of the
dataset's manifest and the packdata version. :func:`resumable` runs a loader, snapshots it after
``k`` batches, rebuilds it from the snapshot and compares the rest with the uninterrupted run.
"""

from __future__ import annotations

import json
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from packdata.errors import ArgumentTypeError, ResumeError

STATE_FORMAT = 1
#: what a saved position means: bump it when the same state would serve other samples (the
#: samplers' or the stream's order, the position's layout). A state is refused across packdata
#: versions only when this differs; states saved before it was recorded have order 1.
ORDER_VERSION = 1


def packdata_version() -> str:
    from packdata._version import __version__

    return __version__


def fingerprint(dataset: Any) -> str:
    """CRC-32 of what the dataset's manifest says of its records (kind, fields, keys, record
    checksums, classes), as hex: the same records in another container share it."""
    m = getattr(dataset, "manifest", None)
    if m is None:
        return f"len:{len(dataset)}"
    header = json.dumps([m.kind, {k: f.to_dict() for k, f in m.fields.items()}, m.count,
                         m.classes], separators=(",", ":"))
    crc = zlib.crc32(header.encode())
    for array in (m.keys.data, m.keys.offsets, m.checksums):  # their bytes, not Python lists
        crc = zlib.crc32(memoryview(np.ascontiguousarray(array)).cast("B"), crc)
    return f"{crc:08x}"


def _crc32(obj: Any) -> str:
    return f"{zlib.crc32(json.dumps(obj, separators=(',', ':')).encode()):08x}"


def _crc32_of_arrays(*arrays: Any) -> str:
    """CRC-32 of arrays' bytes (per-record metadata is arrays, never Python lists)."""
    crc = 0
    for array in arrays:
        crc = zlib.crc32(memoryview(np.ascontiguousarray(array)).cast("B"), crc)
    return f"{crc:08x}"


def _shape(shape: Any) -> str:
    return "×".join("N" if s is None else str(s) for s in shape) or "scalar"


def records(dataset: Any) -> dict[str, Any]:
    """What a state keeps of the dataset's records to name a difference (O(1): counts, CRC-32s,
    the first and last key): kind, count, fields, keys, classes, record checksums."""
    m = getattr(dataset, "manifest", None)
    if m is None:
        return {"count": len(dataset)}
    return {"kind": m.kind, "count": m.count,
            "fields": ", ".join(f"{k} {np.dtype(f.dtype).name} {_shape(f.shape)}"
                                for k, f in m.fields.items()),
            "keys": _crc32_of_arrays(m.keys.data, m.keys.offsets),
            "first_key": m.keys[0] if len(m.keys) else None,
            "last_key": m.keys[-1] if len(m.keys) else None, "classes": _crc32(m.classes),
            "num_classes": len(m.classes or []), "checksums": _crc32_of_arrays(m.checksums)}


def difference(saved: dict[str, Any], here: dict[str, Any]) -> str:
    """How the records a state was saved with differ from ``here``'s, in words."""
    if saved.get("kind") != here.get("kind") and "kind" in saved:
        return f"it holds {saved['kind']} samples, this dataset {here.get('kind')}"
    if saved.get("count") != here.get("count"):
        return f"it has {saved.get('count')} samples, this dataset {here.get('count')}"
    if saved.get("fields") != here.get("fields"):
        return f"its fields are {saved.get('fields')}, this dataset's {here.get('fields')}"
    if saved.get("keys") != here.get("keys"):
        return (f"its samples are other files (keys {saved.get('first_key')!r} … "
                f"{saved.get('last_key')!r}; this dataset {here.get('first_key')!r} … "
                f"{here.get('last_key')!r})")
    if saved.get("classes") != here.get("classes"):
        return (f"its classes differ ({saved.get('num_classes')} classes; this dataset "
                f"{here.get('num_classes')}, or the same number named or ordered otherwise)")
    return ("the same files hold other contents (other record checksums: converted again with "
            "other options, or the files changed)")


def loader_state(loader: Any, delivered: int | None,
                 sampler_state: dict[str, Any] | None = None) -> dict[str, Any]:
    """The state of ``loader`` after it delivered ``delivered`` batches of its epoch in progress
    (None: no epoch in progress), or with the sampler state given."""
    sampler = loader.batch_sampler
    if not hasattr(sampler, "state_dict"):
        raise ArgumentTypeError(f"{type(sampler).__name__} has no state_dict(): its position cannot be "
                        "saved (packdata's samplers have one)")
    if sampler_state is not None:
        state = sampler_state
    else:
        state = sampler.state_dict(delivered) if delivered is not None else sampler.state_dict()
    return sealed(loader.dataset, state)


def sealed(dataset: Any, position: dict[str, Any]) -> dict[str, Any]:
    """``position`` (a sampler's or stream's state) with what :func:`opened` checks: the state
    format, packdata version, the dataset's fingerprint and size, and a checksum."""
    return {"format": STATE_FORMAT, "packdata": packdata_version(), "order": ORDER_VERSION,
            "dataset": fingerprint(dataset), "count": len(dataset), "records": records(dataset),
            "sampler": position, "crc": _crc(position)}


def opened(dataset: Any, state: dict[str, Any]) -> dict[str, Any]:
    """The position inside a :func:`sealed` state, after checking it belongs to ``dataset``
    (same records, same sampling order, intact); raises :class:`ResumeError` naming the
    difference. A state of another packdata version is taken when its order is this one's."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ResumeError(f"not a packdata loader state (format {_get(state, 'format')!r}, "
                          f"expected {STATE_FORMAT})")
    if state.get("order", 1) != ORDER_VERSION:  # another version alone changes nothing
        raise ResumeError(f"the state was saved by packdata {state.get('packdata')}, whose "
                          f"sampling order (version {state.get('order', 1)}) is not this "
                          f"packdata {packdata_version()}'s (version {ORDER_VERSION}): the same "
                          "state would serve other samples, so it is refused")
    if state.get("crc") != _crc(state.get("sampler")):
        raise ResumeError("the state is corrupted: its checksum does not match its contents")
    if state.get("dataset") != fingerprint(dataset) or state.get("count") != len(dataset):
        saved = state.get("records") or {"count": state.get("count")}
        why = difference(saved, records(dataset)) if isinstance(saved, dict) else \
            "its records differ"
        raise ResumeError(f"the state belongs to another dataset: {why}")
    return state["sampler"]


def load_loader_state(loader: Any, state: dict[str, Any]) -> None:
    """Check ``state`` against ``loader`` (same dataset, packdata version, intact) and hand its
    position to the sampler; raises :class:`ResumeError` naming the difference."""
    position = opened(loader.dataset, state)
    sampler = loader.batch_sampler
    if not hasattr(sampler, "load_state_dict"):
        raise ArgumentTypeError(f"{type(sampler).__name__} has no load_state_dict()")
    sampler.load_state_dict(position)


def _get(state: Any, key: str) -> Any:
    return state.get(key) if isinstance(state, dict) else None


def _crc(sampler_state: Any) -> str:
    return f"{zlib.crc32(json.dumps(sampler_state, sort_keys=True).encode()):08x}"


def resumable(build: Callable[[], Any], k: int, *, epochs: int = 1,
              key: Callable[[Any], Iterable[Any]] = lambda batch: batch,
              rebuild: Callable[[], Any] | None = None) -> tuple[bool, str]:
    """Whether what ``build()`` makes (a loader or sampler with ``state_dict``) resumes exactly:
    run ``epochs`` epochs uninterrupted; run again, snapshot after ``k`` batches, rebuild with
    ``build()``, load the snapshot and run to the end. The batches after the snapshot (mapped
    by ``key``, e.g. to sample keys) must equal the uninterrupted run's. Returns (ok, why).

    ``rebuild`` resumes into what it makes instead (e.g. another ``num_workers``), where the
    order may differ: the interrupted epoch must then serve exactly its remaining samples (each
    as often as uninterrupted), and later epochs equal an uninterrupted run of ``rebuild()``."""
    with warnings.catch_warnings():  # rebuilding a loader here is the point
        warnings.simplefilter("ignore", UserWarning)
        return _resumable(build, k, epochs, key, rebuild)


def _resumable(build: Callable[[], Any], k: int, epochs: int,
               key: Callable[[Any], Iterable[Any]],
               rebuild: Callable[[], Any] | None) -> tuple[bool, str]:
    reference = _epochs(build(), epochs, key)
    flat = [b for epoch in reference for b in epoch]
    first = build()
    taken: list[list[Any]] = []
    state, epoch = None, 0
    while state is None and epoch < epochs:
        for batch in first:
            taken.append(list(map(_hashable, key(batch))))
            if len(taken) == k:
                state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint keeps
                break
        else:
            epoch += 1
    if state is None:
        return False, f"the run has only {len(taken)} batches, fewer than k={k}"
    if taken != flat[:k]:
        return False, "two uninterrupted runs differ before the snapshot (an unseeded order?)"
    again = (rebuild or build)()
    again.load_state_dict(state)
    if rebuild is not None:
        return _rebuilt(again, rebuild, reference, epoch, k - sum(map(len, reference[:epoch])),
                        key)
    rest = [b for e in _epochs(again, epochs, key) for b in e][: len(flat) - k]
    if rest != flat[k:]:
        where = next((i for i, (a, b) in enumerate(zip(rest, flat[k:])) if a != b),
                     min(len(rest), len(flat) - k))
        return False, (f"after resuming at batch {k} the order differs from batch {k + where} "
                       f"({len(rest)} batches served, {len(flat) - k} expected)")
    return True, "ok"


def _rebuilt(again: Any, rebuild: Callable[[], Any], reference: list[list[list[Any]]],
             epoch: int, taken: int, key: Callable[[Any], Iterable[Any]]) -> tuple[bool, str]:
    """The checks of a resume into another setup, interrupted after ``taken`` batches of
    ``epoch``."""
    if taken == len(reference[epoch]):  # stopped at the epoch's end: the next one is fresh
        epoch, taken = epoch + 1, 0
    if epoch == len(reference):
        return True, "ok"
    resumed = _epochs(again, len(reference) - epoch, key)
    served = sorted(s for b in reference[epoch][:taken] + resumed[0] for s in b)
    expected = sorted(s for b in reference[epoch] for s in b)
    if served != expected:
        missing, extra = Counter(expected) - Counter(served), Counter(served) - Counter(expected)
        return False, (f"epoch {epoch} resumed at batch {taken} in another setup: "
                       f"{sum(missing.values())} samples left out, {sum(extra.values())} extra")
    fresh = rebuild()
    fresh.set_epoch(epoch + 1)
    if resumed[1:] != _epochs(fresh, len(reference) - epoch - 1, key):
        return False, f"the epochs after resumed epoch {epoch} differ from an uninterrupted run"
    return True, "ok"


def _epochs(iterable: Any, epochs: int, key: Callable[[Any], Iterable[Any]]) -> list[Any]:
    return [[list(map(_hashable, key(b))) for b in iterable] for _ in range(epochs)]


def _hashable(x: Any) -> Any:
    if hasattr(x, "tolist"):
        x = x.tolist()
    return tuple(map(_hashable, x)) if isinstance(x, (list, tuple)) else x
