"""One sample of a batch already read, as ``PackedDataset.__getitems__`` hands it to DataLoader.

Torch's DataLoader asks the dataset for a batch of samples (``__getitems__``) and gives the list
to its ``collate_fn``. A packed dataset reads the batch in a few vectorised calls; rebuilding it
from per-sample views in the default collate (a view per sample and part, then ``torch.stack``)
costs several times the read. A :class:`BatchRow` is a cheap stand-in for sample ``j`` of the
batch: it behaves as the ``(image, label, …)`` tuple (index it, unpack it, ``len``), and torch's
default collate, through the type registered in its ``default_collate_fn_map``, returns the batch
itself when it is given that batch's rows in order. Any other list (rows of different batches,
reordered, a subset, mixed with other samples) is collated from the samples as usual, and a
user's own ``collate_fn`` sees rows that act as tuples.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from itertools import repeat
from operator import attrgetter, is_
from typing import Any

from torch.utils.data._utils.collate import collate, default_collate_fn_map

from packdata.transfer import leave_worker


class _Cell:
    """The batch a set of rows belongs to (one attribute, so a set of rows can be reused)."""

    __slots__ = ("batch",)


class BatchRow(Sequence):
    """Sample ``row`` of ``batch`` (a tuple of batched parts), its parts made on access."""

    __slots__ = ("_cell", "row")

    def __init__(self, cell: _Cell, row: int) -> None:
        self._cell = cell
        self.row = row

    @property
    def batch(self) -> tuple:
        return self._cell.batch

    def __len__(self) -> int:
        return len(self.batch)

    def __getitem__(self, part: int | slice) -> Any:  # type: ignore[override]
        if isinstance(part, slice):
            return tuple(p[self.row] for p in self.batch[part])
        return self.batch[part][self.row]

    def __iter__(self) -> Iterator[Any]:
        row = self.row
        return (p[row] for p in self.batch)

    def as_tuple(self) -> tuple:
        """The sample as a plain tuple of per-sample views."""
        return tuple(self)

    def __reduce__(self) -> tuple:  # pickled (e.g. sent to another process) as the plain sample
        return tuple, (self.as_tuple(),)

    def __repr__(self) -> str:
        return f"BatchRow{self.as_tuple()!r}"


class BatchRows(list):
    """The rows of one batch, as ``__getitems__`` returns them: a plain list that remembers
    whether it was changed since (any list method that changes it clears ``intact``), so the
    collate recognises its own batch without looking at every row."""

    __slots__ = ("batch", "intact")

    def __init__(self, batch: tuple, rows: list[BatchRow]) -> None:
        super().__init__(rows)
        self.batch = batch
        self.intact = True

    def __reduce__(self) -> tuple:  # pickled as the plain list of samples
        return list, ([row.as_tuple() for row in self],)


def _changes(name: str) -> Any:
    method = getattr(list, name)

    def changed(self: BatchRows, *args: Any, **kwargs: Any) -> Any:
        self.intact = False
        return method(self, *args, **kwargs)

    changed.__name__ = name
    return changed


for _name in ("__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend",
              "insert", "pop", "remove", "clear", "sort", "reverse"):
    setattr(BatchRows, _name, _changes(_name))


def rows_of(batch: tuple) -> BatchRows:
    """One new row per sample of ``batch``."""
    return RowPool().rows_of(batch)


class RowPool:
    """Makes the rows of each batch, reusing the last batch's row objects when nothing outside
    holds any of them (the usual case: the collate read them and let them go), so a batch costs
    one attribute change instead of a new object per sample. A row still held anywhere (in a
    list, a variable, an iterator) is never reused, so no one sees a row change its batch.
    Safe across threads; a copy (pickled, e.g. for a worker process) starts empty."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: list[tuple[_Cell, list[BatchRow]]] = []  # at most one entry

    def __reduce__(self) -> tuple:
        return RowPool, ()

    def rows_of(self, batch: tuple) -> BatchRows:
        """One row per sample of ``batch``."""
        n = len(batch[0])
        try:
            cell, rows = self._kept.pop()  # atomic: two threads never take the same rows
        except IndexError:
            cell, rows = _Cell(), []
        if _ALONE is None or len(rows) != n or set(map(_refcount, rows)) != {_ALONE}:
            cell = _Cell()
            rows = list(map(BatchRow, repeat(cell, n), range(n)))
        cell.batch = batch
        self._kept.append((cell, rows))
        return BatchRows(batch, rows)


_refcount = getattr(sys, "getrefcount", None)


def _alone() -> int | None:
    """What ``map(_refcount, rows)`` gives for a row held by nothing but the list ``rows``
    (None where the interpreter has no reference counts)."""
    if _refcount is None:
        return None
    rows = [_Cell()]
    return next(map(_refcount, rows))


_ALONE = _alone()
_row_of, _cell_of = attrgetter("row"), attrgetter("_cell")


def whole_batch(rows: Sequence[Any]) -> tuple | None:
    """The batch ``rows`` came from, when they are all its rows in order; else None."""
    if type(rows) is BatchRows and rows.intact:  # as __getitems__ made it
        return rows.batch
    first = rows[0]
    if type(first) is not BatchRow:
        return None
    cell = first._cell
    n = len(cell.batch[0])
    if len(rows) != n or set(map(type, rows)) != {BatchRow}:
        return None
    if list(map(_row_of, rows)) != list(range(n)) or not all(
            map(is_, map(_cell_of, rows), repeat(cell))):
        return None
    return cell.batch


def collate_rows(rows: Sequence[BatchRow], *, collate_fn_map: dict | None = None) -> list:
    """Default collate of :class:`BatchRow` samples: the batch they came from (as a list, as the
    default collate returns for tuple samples), or the samples collated one by one."""
    batch = whole_batch(rows)
    if batch is not None:
        return leave_worker(list(batch))  # from a worker: through a reused slot
    samples = [r.as_tuple() if isinstance(r, BatchRow) else r for r in rows]
    return collate(samples, collate_fn_map=collate_fn_map)


default_collate_fn_map[BatchRow] = collate_rows
