"""A block of loaded records handed from a worker to the converting process as one table.

A worker that loaded a block of inputs, each one record of fixed-size fields alike in dtype and
shape, lays them out as the rows of one uint8 table (row ``j``: record ``j``'s fields' bytes in
the fields' order, which is both the record's checksum input and an LMDB value) and computes
their checksums there. The converting process then receives one array instead of a dict of
arrays per record, checks the block's fields once instead of each record's, and hands the table
to the writer in one call (:meth:`packdata.containers.base.Writer.append_rows`): the per-record
work left in the process that writes is the writer's own.

Anything else (a failed input, an input that makes several records, variable-length fields)
travels as what each item loaded, with each record's checksum computed in the worker too
(:class:`Hashed`), and is checked record by record, so errors name the same file with the same
words; records of one block that differ from one another travel unhashed, to be named so.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from packdata.checksum import record_checksum, rows_checksums
from packdata.containers.base import records_of
from packdata.conversion.costs import WorkerClock
from packdata.errors import SampleError
from packdata.manifest import Field
from packdata.sources.base import Loaded, Record, Source


@dataclass
class Rows:
    """Records of fixed-size fields as the rows of one table, with their checksums."""

    fields: dict[str, Field]  # the source's fields for the block's first record
    table: np.ndarray  # (records, bytes) uint8
    checksums: np.ndarray  # uint64, one per row

    def __len__(self) -> int:
        return len(self.table)

    def fit(self, fields: dict[str, Field]) -> bool:
        """Whether these are records of ``fields``, in that order (the conversion's, set by its
        first record): then every row was checked against them."""
        return list(self.fields.items()) == list(fields.items())

    def records(self) -> list[Record]:
        """The records, as views of the table."""
        return records_of(self.table, self.fields)


@dataclass
class Hashed:
    """Records that are not one table (variable-length fields, several records from one input,
    failed inputs), as each item loaded them, with every record's checksum computed in the
    worker over ``names`` (the fields the source gives for the block's first record, in order):
    where those are the conversion's, the process that writes hashes nothing."""

    names: list[str]
    loaded: list[Loaded]
    checksums: list[list[int] | None]  # per item: its records' checksums (None: a failure)

    def fit(self, fields: dict[str, Field]) -> bool:
        return self.names == list(fields)


def pack(source: Source, loaded: list[Loaded], clock: WorkerClock | None = None
         ) -> Rows | Hashed | list[Loaded]:
    """``loaded`` as :class:`Rows` where every item made one record whose fields (those
    ``source`` gives for the first) are all fixed-size and match the first's; otherwise as
    :class:`Hashed` where some record was loaded (``loaded`` unchanged where none was).
    ``clock`` times the hashing."""
    first = next((one if isinstance(one, dict) else one[0][1] for one in loaded
                  if isinstance(one, dict) or (isinstance(one, list) and one)), None)
    if first is None:
        return loaded
    fields = source.fields(first)
    if not all(isinstance(one, dict) for one in loaded) or not fields or any(
            field.variable for field in fields.values()):
        with clock.phase("hashing") if clock else contextlib.nullcontext():
            return Hashed(list(fields), loaded, [_checksums(one, list(fields)) for one in loaded])
    n = len(loaded)
    table = np.empty((n, sum(field.nbytes for field in fields.values())), dtype=np.uint8)
    start = 0
    for name, field in fields.items():
        values = [one.get(name) for one in loaded]  # type: ignore[union-attr]
        dtype, shape = field.np_dtype, field.shape
        if not all(isinstance(v, np.ndarray) and v.dtype == dtype and v.shape == shape
                   for v in values):
            return loaded  # checked one by one, for the error that names the input (and hashed
            # by the process that writes: a block of records unlike its first is an error)
        table[:, start : start + field.nbytes] = np.stack(values).reshape(n, -1).view(np.uint8)
        start += field.nbytes
    with clock.phase("hashing") if clock else contextlib.nullcontext():
        checksums = rows_checksums(table)
    return Rows(fields, table, checksums)


def _checksums(one: Loaded, names: list[str]) -> list[int] | None:
    """The checksums of the records one item loaded, over fields ``names``; None for a failure,
    or records that lack one of them (the process that writes names that input)."""
    if isinstance(one, SampleError):
        return None
    try:
        return [record_checksum(record, names) for _, record in _pairs_of(one)]
    except (KeyError, TypeError, ValueError):
        return None


def _pairs_of(one: Record | list[tuple[str, Record]]) -> list[tuple[str, Record]]:
    return [("", one)] if isinstance(one, dict) else one


def handed_over(loaded: Rows | Hashed | list[Loaded]) -> int:
    """The bytes of records a block carries from a worker to the parent."""
    if isinstance(loaded, Rows):
        return loaded.table.nbytes + loaded.checksums.nbytes
    if isinstance(loaded, Hashed):
        loaded = loaded.loaded
    total = 0
    for one in loaded:
        records = one if isinstance(one, list) else [("", one)] if isinstance(one, dict) else []
        total += sum(v.nbytes for _, record in records for v in record.values()
                     if isinstance(v, np.ndarray))
    return total
