"""The samples of a batch already read, as ``PackedDataset.__getitems__`` hands them to DataLoader.

Torch's DataLoader asks the dataset for a batch of samples (``__getitems__``) and gives the list
to its ``collate_fn``. A packed dataset reads the batch in a few vectorised calls; rebuilding it
from the samples in the default collate (``torch.stack`` per part) would cost several times the
read. So each sample is a :class:`BatchRow`, a plain tuple of views of the batch (what ``ds[i]``
gives, ``isinstance(row, tuple)`` included, with 0 workers as in workers), in a
:class:`BatchRows` list that remembers the batch and builds its rows on first use: torch's
default collate looks at the first row's type only and, through the type registered in its
``default_collate_fn_map``, returns that batch itself when given the list unchanged, so the
other rows are never built. Any other list (rows of different batches, reordered, a subset, mixed with other
samples) is collated from the samples as usual.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch.utils.data._utils.collate import collate, default_collate_fn_map

from packdata.loading.transfer import leave_worker


class BatchRow(tuple):
    """One sample of a batch: a tuple of views of the batch's parts."""

    __slots__ = ()

    def __reduce__(self) -> tuple:
        # pickled as a plain tuple of the sample's own values: a view would write the whole batch
        return tuple, (tuple(map(_own, self)),)


def _own(part: Any) -> Any:
    """``part`` in memory of its own, where it is a view of a larger tensor."""
    if isinstance(part, torch.Tensor) and part.untyped_storage().nbytes() > part.nbytes:
        return part.clone()
    return part


class BatchRows(list):
    """The rows of one batch, as ``__getitems__`` returns them: a plain list (of
    :class:`BatchRow` tuples) whose rows are built on first use. Torch's default collate looks at
    ``rows[0]`` alone (one row, built on its own) and, through :func:`collate_rows`, gets the batch
    back: the other rows are never made (building them costs twice the read of a CIFAR batch).
    Any other use of the list builds them all first, and any change clears ``intact``, so the
    collate recognises its own batch without looking at every row.

    C code that reads a list's storage directly, bypassing its methods (numpy's ``np.array(rows)``),
    sees the rows only once Python code has used the list (``list(rows)`` gives a plain one)."""

    __slots__ = ("batch", "intact", "_pending")

    def __init__(self, batch: tuple, size: int) -> None:
        super().__init__()
        self.batch = batch
        self.intact = True
        self._pending = size  # rows not built yet (0 once built)

    def _built(self) -> BatchRows:
        """This list with its rows in it."""
        if self._pending:
            self._pending = 0
            parts = [p.unbind(0) if isinstance(p, torch.Tensor) else p for p in self.batch]
            list.extend(self, map(_row, zip(*parts)))
        return self

    def __len__(self) -> int:
        return self._pending or list.__len__(self)

    def __getitem__(self, index: Any) -> Any:
        if self._pending and isinstance(index, int) and -self._pending <= index < self._pending:
            return _row(tuple(part[index] for part in self.batch))  # this row alone
        return list.__getitem__(self._built(), index)

    def __reduce__(self) -> tuple:  # pickled as the plain list of samples
        return list, (list(self),)


def _reads(name: str) -> Any:
    method = getattr(list, name)

    def read(self: BatchRows, *args: Any, **kwargs: Any) -> Any:
        return method(self._built(), *args, **kwargs)

    read.__name__ = name
    return read


def _changes(name: str) -> Any:
    method = getattr(list, name)

    def changed(self: BatchRows, *args: Any, **kwargs: Any) -> Any:
        self.intact = False
        return method(self._built(), *args, **kwargs)

    changed.__name__ = name
    return changed


for _name in ("__iter__", "__reversed__", "__contains__", "__eq__", "__ne__", "__lt__", "__le__",
              "__gt__", "__ge__", "__add__", "__mul__", "__rmul__", "__repr__", "copy", "count",
              "index"):
    setattr(BatchRows, _name, _reads(_name))
for _name in ("__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend",
              "insert", "pop", "remove", "clear", "sort", "reverse"):
    setattr(BatchRows, _name, _changes(_name))

_row = partial(tuple.__new__, BatchRow)


def rows_of(batch: tuple) -> BatchRows:
    """One row per sample of ``batch`` (a tuple of batched parts: tensors or lists), built when
    first used."""
    return BatchRows(batch, len(batch[0]))


def whole_batch(rows: Sequence[Any]) -> tuple | None:
    """The batch ``rows`` came from, when they are its rows as ``__getitems__`` made them."""
    if type(rows) is BatchRows and rows.intact:
        return rows.batch
    return None


def collate_rows(rows: Sequence[BatchRow], *, collate_fn_map: dict | None = None) -> list:
    """Default collate of :class:`BatchRow` samples: the batch they came from (as a list, as the
    default collate returns for tuple samples), or the samples collated one by one."""
    batch = whole_batch(rows)
    if batch is not None:
        return leave_worker(list(batch))  # from a worker: through a reused slot
    samples = [tuple(r) if type(r) is BatchRow else r for r in rows]
    return collate(samples, collate_fn_map=collate_fn_map)


default_collate_fn_map[BatchRow] = collate_rows
