"""Records written straight into their final place by the worker processes that load them.

A writer that lays its output out ahead (``Writer.place``: the record count known, and the rows
each variable-length field will hold) says where every record goes with a :class:`Placement`,
which travels to the workers: each writes its block of records there (:meth:`Placement.write`,
a :class:`Slot`) and the converting process, which received no record, is told only that the
block is in place (``Writer.placed``). The records' bytes cross no pipe and are copied once, from
the decoded arrays into the file's pages.

:class:`FilePlacement` is the layout of fields stored as contiguous arrays at known byte offsets
of one file (HDF5's contiguous datasets): each field's records one after another, and each
variable field's record ends (int64, ``count + 1`` of them from 0) in an array of their own.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from packdata.manifest import Field

#: one field's values for a block of records: stacked (a fixed field), or one array a record
Column = np.ndarray | list[np.ndarray]


@dataclass(frozen=True)
class Slot:
    """Where one block of records goes: records ``first`` to ``first + count`` of the layout,
    and of each variable field ``rows[name] = (first row, rows)``."""

    first: int
    count: int
    rows: dict[str, tuple[int, int]]


class Placement(ABC):
    """Where a writer laid out every record of a conversion (see the module docstring):
    picklable, for the worker processes."""

    fields: dict[str, Field]

    @abstractmethod
    def write(self, slot: Slot, columns: dict[str, Column]) -> bool:
        """Write the records of ``slot``: ``columns[name]``, each field's values (checked
        against ``fields``, as many rows as the slot holds). False where the layout is gone
        (the writer gave it up): the records were not written."""


@dataclass(frozen=True)
class FilePlacement(Placement):
    """Fields as contiguous arrays of the file at ``path``: field ``name``'s records from byte
    ``starts[name]``, a variable field's record ends from byte ``ends[name]``."""

    path: str
    fields: dict[str, Field]
    starts: dict[str, int]
    ends: dict[str, int]

    def row_bytes(self, name: str) -> int:
        """Bytes of one record of a fixed field, of one row of a variable one."""
        field = self.fields[name]
        if not field.variable:
            return field.nbytes
        return int(np.prod(field.row_shape, dtype=np.int64)) * field.np_dtype.itemsize

    def write(self, slot: Slot, columns: dict[str, Column]) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY)
        except FileNotFoundError:  # given up: the file is no longer there (see the writer)
            return False
        try:
            for name, field in self.fields.items():
                column = columns[name]
                if not field.variable:
                    write_at(fd, column, self.starts[name] + slot.first * field.nbytes)
                    continue
                first_row = slot.rows[name][0]
                write_at(fd, np.concatenate(column) if len(column) > 1 else column[0],
                         self.starts[name] + first_row * self.row_bytes(name))
                ends = first_row + np.cumsum([len(v) for v in column], dtype=np.int64)
                write_at(fd, ends.astype("<i8"), self.ends[name] + (slot.first + 1) * 8)
        finally:
            os.close(fd)
        return True

    def start(self) -> None:
        """Each variable field's first record start (0), before any record is written."""
        fd = os.open(self.path, os.O_WRONLY)
        try:
            for name in self.ends:
                write_at(fd, np.zeros(1, "<i8"), self.ends[name])
        finally:
            os.close(fd)

    def read(self, fd: int, slot: Slot) -> dict[str, Column]:
        """The records of ``slot`` as written there, from ``fd`` (the file, open for reading):
        what a writer that gave its layout up reads back of the blocks workers wrote."""
        columns: dict[str, Column] = {}
        for name, field in self.fields.items():
            if not field.variable:
                data = read_at(fd, slot.count * field.nbytes, self.starts[name] + slot.first * field.nbytes)
                columns[name] = data.view(field.np_dtype).reshape(slot.count, *field.shape)
                continue
            first_row, rows = slot.rows[name]
            ends = read_at(fd, slot.count * 8, self.ends[name] + (slot.first + 1) * 8).view("<i8")
            data = read_at(fd, rows * self.row_bytes(name),
                           self.starts[name] + first_row * self.row_bytes(name))
            data = data.view(field.np_dtype).reshape(rows, *field.row_shape)
            bounds = np.concatenate([[first_row], ends]) - first_row
            columns[name] = [data[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        return columns


def write_at(fd: int, array: np.ndarray, offset: int) -> None:
    """All of ``array``'s bytes at ``offset`` of ``fd`` (a write may take fewer at once)."""
    view = memoryview(np.ascontiguousarray(array)).cast("B")
    while view.nbytes:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def read_at(fd: int, nbytes: int, offset: int) -> np.ndarray:
    """``nbytes`` bytes at ``offset`` of ``fd``, as a uint8 array."""
    out = np.empty(nbytes, dtype=np.uint8)
    view, done = memoryview(out), 0
    while done < nbytes:
        got = os.preadv(fd, [view[done:]], offset + done)
        if not got:
            raise OSError(f"{nbytes - done} bytes missing at {offset + done}: the file was cut")
        done += got
    return out
