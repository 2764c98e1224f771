"""Checksums of the per-record arrays, block by block (format version 3).

A dataset keeps beside its records arrays with an entry per record: the keys with their
offsets, hashes and order and the records' checksums (:mod:`packdata.recordmeta`), and each
container's own tables (LMDB's record offsets and length tables, HDF5's offsets of variable
fields, tar's index). Each array is cut into blocks of :data:`BLOCK_BYTES`, and each block has
a checksum: XXH3-64 of its bytes, seeded with the block's position among all of them (a block
moved elsewhere fails). The checksums, the arrays in the order the container lists them, are
one more array, the table (:data:`TABLE`), which the manifest's checksum covers together with
the manifest's JSON (:func:`packdata.manifest.header_hash`): an array rewritten together with
its blocks' checksums is refused at open.

Opening checks the table against the manifest's checksum and its length against the arrays
(8 bytes per 64 KiB of them), nothing else: :class:`BlockChecks` checks each block the first
time something reads it (a key, a record's table entries), so opening stays flat in the record
count, as reading records does (:mod:`packdata.containers.integrity`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from packdata.errors import DatasetError
from packdata.spooling import copy_blocks

BLOCK_BYTES = 1 << 16
#: the name of the table of block checksums among a dataset's record arrays
TABLE = "blocks"


def as_bytes(array: np.ndarray) -> np.ndarray:
    """``array``'s bytes as a flat uint8 array (a view: the arrays are contiguous)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def block_table(arrays: Sequence[Any]) -> np.ndarray:
    """The checksums of the blocks of ``arrays``, in order: what a writer stores as
    :data:`TABLE`. Each array (a numpy array, or anything sliced into one along its first
    axis: an HDF5 dataset) is read about 1 MiB at a time, a mapped one's pages let go."""
    digests: list[int] = []
    for array in arrays:
        row = int(array.dtype.itemsize * np.prod(array.shape[1:], dtype=np.int64)) or 1
        carry = np.zeros(0, dtype=np.uint8)  # the bytes of a block a slice ended inside
        for part in copy_blocks(array, max(1, 16 * BLOCK_BYTES // row)):
            data = np.concatenate([carry, as_bytes(part)]) if len(carry) else as_bytes(part)
            whole = len(data) // BLOCK_BYTES * BLOCK_BYTES
            for a in range(0, whole, BLOCK_BYTES):
                digests.append(xxhash.xxh3_64_intdigest(data[a : a + BLOCK_BYTES],
                                                        seed=len(digests)))
            carry = data[whole:].copy()
        if len(carry):
            digests.append(xxhash.xxh3_64_intdigest(carry, seed=len(digests)))
    return np.array(digests, dtype="<u8")


@dataclass(frozen=True)
class Section:
    """One array under the table: its bytes, the bytes of one row (its first axis), whether
    row ``i`` is record ``i``'s (``per_record``; with ``count + 1`` rows, rows ``i`` and
    ``i + 1``: offsets), and where its blocks start in the table."""

    name: str
    data: np.ndarray
    row: int
    per_record: bool
    first: int

    @property
    def blocks(self) -> int:
        return -(-len(self.data) // BLOCK_BYTES)


class BlockChecks:
    """The record arrays of one dataset (``arrays``: name → (array, per_record), in the table's
    order) and the table of their blocks' checksums (already matched with the manifest's
    checksum): each block is checked on its first read and remembered (a read-only map, as the
    records' bitmap), so later reads cost a lookup. A block that fails raises a DatasetError
    naming the dataset, the array and the entries it holds."""

    def __init__(self, table: np.ndarray, arrays: dict[str, tuple[np.ndarray, bool]],
                 count: int, where: str | Path) -> None:
        self.table, self.count, self.where = table, count, where
        self.sections: dict[str, Section] = {}
        first = 0
        for name, (array, per_record) in arrays.items():
            row = int(array.itemsize * np.prod(array.shape[1:], dtype=np.int64))
            self.sections[name] = Section(name, as_bytes(array), max(row, 1), per_record, first)
            first += self.sections[name].blocks
        if first != len(table):
            raise DatasetError(
                f"{where}: the record arrays ({', '.join(arrays)}) hold {first} blocks, their "
                f"checksums {len(table)}: an array is missing, cut or of another size; the "
                "dataset is damaged (run `packdata verify`)")
        self.ok = np.zeros(len(table), dtype=bool)
        #: blocks of the per-record arrays not checked yet (0: :meth:`records` returns at once)
        self.records_left = sum(s.blocks for s in self.sections.values() if s.per_record)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:  # pickled with its manifest (the lock is this process's)
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def bytes(self, name: str, lo: int, hi: int) -> None:
        """Check the blocks holding bytes ``lo`` to ``hi`` (excluded) of array ``name``."""
        s = self.sections[name]
        if hi <= lo:
            return
        first, last = s.first + lo // BLOCK_BYTES, s.first + (hi - 1) // BLOCK_BYTES
        if first == last and first < len(self.ok) and self.ok[first]:  # (a key, once checked)
            return
        self._check(s, np.arange(first, last + 1))

    def rows(self, name: str, rows: np.ndarray | Sequence[int]) -> None:
        """Check the blocks holding rows ``rows`` of array ``name`` (within its length)."""
        s = self.sections[name]
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows):
            first = rows * s.row // BLOCK_BYTES
            last = ((rows + 1) * s.row - 1) // BLOCK_BYTES
            self._check(s, s.first + np.union1d(first, last))

    def records(self, idx: np.ndarray) -> None:
        """Check the blocks of every per-record array holding the entries of records ``idx``
        (checked indices): what a read of them looks up before a record's bytes."""
        if not self.records_left:
            return
        for s in self.sections.values():
            if s.per_record:
                self.rows(s.name, idx)
                if len(s.data) // s.row == self.count + 1:  # offsets: record i ends at i + 1
                    self.rows(s.name, idx + 1)

    def all_records(self) -> None:
        """Check every block of the per-record arrays (a read of all of one: lengths)."""
        for s in self.sections.values():
            if s.per_record:
                self._check(s, np.arange(s.first, s.first + s.blocks))

    def _check(self, s: Section, blocks: np.ndarray) -> None:
        # the array's own length is its reader's to check (a block past it is no block of it)
        blocks = blocks[(blocks >= s.first) & (blocks < s.first + s.blocks)]
        todo = blocks[~self.ok[blocks]]
        for b in todo.tolist():
            lo = (b - s.first) * BLOCK_BYTES
            if xxhash.xxh3_64_intdigest(s.data[lo : lo + BLOCK_BYTES], seed=b) != \
                    int(self.table[b]):
                raise DatasetError(f"{self.where}: {damaged(s, b)}; the dataset is damaged "
                                   "(run `packdata verify`)")
            with self._lock:  # loader threads check blocks at once: each counted once
                if not self.ok[b]:
                    self.ok[b] = True
                    self.records_left -= s.per_record

    def damaged(self) -> list[str]:
        """Every block checked (``packdata verify``): what is damaged, one line per array."""
        found = []
        for s in self.sections.values():
            bad = []
            for b in range(s.first, s.first + s.blocks):
                lo = (b - s.first) * BLOCK_BYTES
                if xxhash.xxh3_64_intdigest(s.data[lo : lo + BLOCK_BYTES], seed=b) != \
                        int(self.table[b]):
                    bad.append(b)
            if bad:
                more = f" and {len(bad) - 1} more of its {s.blocks} blocks" if len(bad) > 1 else ""
                found.append(f"{damaged(s, bad[0])}{more}")
        return found


def damaged(s: Section, b: int) -> str:
    """What failing block ``b`` of section ``s`` holds, in words."""
    lo = (b - s.first) * BLOCK_BYTES
    hi = min(lo + BLOCK_BYTES, len(s.data))
    if s.row > 1:
        return (f"the record array '{s.name}' does not match its checksum (entries "
                f"{lo // s.row:,}-{(hi - 1) // s.row:,})")
    return f"the record array '{s.name}' does not match its checksum (bytes {lo:,}-{hi - 1:,})"
