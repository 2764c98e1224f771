"""A block of loaded records handed from a worker to the converting process as one table.

A worker that loaded a block of inputs, each one record of fixed-size fields alike in dtype and
shape, lays them out as the rows of one uint8 table (row ``j``: record ``j``'s fields' bytes in
the fields' order, which is both the record's checksum input and an LMDB value) and computes
their checksums there. The converting process then receives one array instead of a dict of
arrays per record, checks the block's fields once instead of each record's, and hands the table
to the writer in one call (:meth:`packdata.containers.base.Writer.append_rows`): the per-record
work left in the process that writes is the writer's own.

Anything else (a failed input, an input that makes several records, variable-length fields,
records that differ from one another) travels as before, a list of what each item loaded, and
is checked record by record, so errors name the same file with the same words.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packdata.checksum import rows_checksums
from packdata.containers.base import records_of
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


def pack(source: Source, loaded: list[Loaded]) -> Rows | list[Loaded]:
    """``loaded`` as :class:`Rows` where every item made one record whose fields (those
    ``source`` gives for the first) are all fixed-size and match the first's; otherwise
    ``loaded`` unchanged."""
    if not loaded or not all(isinstance(one, dict) for one in loaded):
        return loaded
    fields = source.fields(loaded[0])  # type: ignore[arg-type]
    if not fields or any(field.variable for field in fields.values()):
        return loaded
    n = len(loaded)
    table = np.empty((n, sum(field.nbytes for field in fields.values())), dtype=np.uint8)
    start = 0
    for name, field in fields.items():
        values = [one.get(name) for one in loaded]  # type: ignore[union-attr]
        dtype, shape = field.np_dtype, field.shape
        if not all(isinstance(v, np.ndarray) and v.dtype == dtype and v.shape == shape
                   for v in values):
            return loaded  # checked one by one, for the error that names the input
        table[:, start : start + field.nbytes] = np.stack(values).reshape(n, -1).view(np.uint8)
        start += field.nbytes
    return Rows(fields, table, rows_checksums(table))
