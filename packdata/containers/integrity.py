"""Integrity on the read path: records checked against the manifest's checksums.

- ``verify="full"`` (the default): every record a read returns has been checked
  (:class:`ChecksummedReader`): hashed on its first read in this process (as it is gathered,
  where the reader says where its records lie and packdata's C extension was built:
  :func:`packdata.checksum.gather_checked`), then remembered in a bitmap of verified records
  (the data is a read-only map), so later epochs cost a bit test;
  where records declare entry checksums (:class:`packdata.checksum.EntryChecks`), a read of one
  entry per record (a point cloud's variant) is checked, and remembered, entry by entry;
- ``verify="sample"``: the checksums of a few records spread over the dataset, checked once at
  open (:func:`check_sample`);
- ``verify="off"``: neither. The structural checks every Reader makes when it opens (the manifest,
  sizes and offsets: :func:`packdata.manifest.check_manifest`) always run.

``packdata verify`` (:mod:`packdata.verification`) builds on these to check a whole dataset.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from packdata import checksum
from packdata.checksum import XXH3, algorithm_of, batch_checksums, entry_checksums
from packdata.containers.base import (
    Batch,
    Reader,
    RowSources,
    Select,
    apply_select,
    counted_down,
    native_arguments,
    new_arrays,
    selected_entries,
)
from packdata.errors import ArgumentError, DatasetError, PackdataError

LEVELS = ("off", "sample", "full")
SAMPLED_RECORDS = 8  # records checksummed at open with verify="sample"
_BIT = (1 << np.arange(8)).astype(np.uint8)  # record i is bit i & 7 of byte i >> 3
_BITS_SET = np.array([bin(b).count("1") for b in range(256)], dtype=np.int64)
T = TypeVar("T")


def bad_checksums(reader: Reader, idx: np.ndarray, batch: Batch) -> list[int]:
    """The indices among ``idx`` whose record in ``batch`` does not match its checksum (nor,
    where declared, its entries their entry checksums)."""
    m = reader.manifest
    if not len(m.checksums):
        return []
    bad = batch_checksums(batch, m.fields, len(idx), algorithm_of(m.version)) != m.checksums[idx]
    checks = m.entry_checks
    if checks is not None:
        bad |= (entry_checksums(batch, checks, len(idx)) != batch[checks.field]).any(axis=1)
    return idx[bad].tolist()


def mismatch(where: str | Path, reader: Reader, index: int) -> DatasetError:
    """The error for record ``index`` failing its checksum: names the dataset and the record."""
    return DatasetError(f"{where}: record {index} ({reader.manifest.keys.label(index)}) does not "
                        "match its checksum; the dataset is damaged (run `packdata verify`)")


def read_checked(reader: Reader, idx: np.ndarray, where: str | Path,
                 select: Select | None = None, out: dict[str, np.ndarray] | None = None) -> Batch:
    """``reader.read`` (``reader.read_into``, given ``out``), with any failure that is not
    packdata's turned into a DatasetError naming the dataset (a damaged file makes numpy or a
    backend raise its own errors)."""
    if out is None:
        return _named(where, reader.read, idx, select)
    return _named(where, reader.read_into, idx, out)


def _named(where: str | Path, call: Callable[..., T], *args: Any) -> T:
    """``call(*args)``, a failure that is not packdata's (nor an IndexError: a bad index)
    turned into a DatasetError naming the dataset."""
    try:
        return call(*args)
    except (PackdataError, IndexError):
        raise
    except Exception as exc:
        raise DatasetError(f"{where}: records cannot be read ({type(exc).__name__}: {exc}); "
                           "the dataset is damaged") from None


def check_sample(reader: Reader, where: str | Path, records: int = SAMPLED_RECORDS) -> None:
    """The checksums of ``records`` records spread over the dataset (first and last included)."""
    n = reader.manifest.count
    if not n or not len(reader.manifest.checksums):
        return
    idx = np.unique(np.linspace(0, n - 1, min(records, n)).astype(np.int64))
    batch = read_checked(reader, idx, where)
    bad = bad_checksums(reader, idx, batch)
    if bad:
        raise mismatch(where, reader, bad[0])


class ChecksummedReader(Reader):
    """A Reader whose every record read has been checked against the manifest's checksums.

    A wrapper, so the plain readers' hot paths stay as they are. Each record is hashed the first
    time this reader returns it and marked in a bitmap (one bit a record, this process's own:
    readers are opened per process); a batch of records all marked is the inner read itself.
    Where records declare entry checksums, the bitmap holds a bit per entry: a ``select`` read
    of one entry per record hashes and marks only those entries; a ``select`` read otherwise
    (of records not all checked yet) fetches whole records (the checksum covers all of a
    record), then selects."""

    def __init__(self, inner: Reader, where: str | Path) -> None:
        self.inner = inner
        self.where = where
        self.manifest = inner.manifest
        checked = len(self.manifest.checksums) > 0
        self.entry_checks = self.manifest.entry_checks if checked else None
        #: bits a record has in the bitmap: one, or one per entry (entry checksums)
        self.bits_per_record = self.entry_checks.count if self.entry_checks else 1
        bits = self.manifest.count * self.bits_per_record
        # calloc'd: pages are touched only as records are checked
        self.verified = np.zeros((bits + 7) // 8, dtype=np.uint8)
        #: at most the bits not set yet (exact once it reaches 0: see _count); at 0 (after an
        #: epoch) a read is the inner read itself
        self.remaining = bits if checked else 0
        self._lock = threading.Lock()  # loader threads share a reader: the count must stay exact
        #: whether reads are checked as they are gathered (one native call: each record, or
        #: each entry read, hashed while its bytes are in cache, its bit set there too)
        self.gathers_checked = (checked and checksum.NATIVE_ROWS and inner.GATHERS_ROWS
                                and algorithm_of(self.manifest.version) == XXH3)
        #: whole records too (one checksum a record; entries' bits are set entry by entry)
        self._gathers_records = self.gathers_checked and self.entry_checks is None
        self._expected = np.ascontiguousarray(self.manifest.checksums, dtype=np.uint64)

    def _unchecked(self, bits: np.ndarray) -> np.ndarray:
        """Whether each of ``bits`` is still to be checked (record ``i``'s bits are
        ``i * bits_per_record`` onwards)."""
        return self.verified[bits >> 3] & _BIT[bits & 7] == 0

    def _unchecked_records(self, idx: np.ndarray) -> np.ndarray:
        """Whether each of records ``idx`` has a bit still to be checked."""
        if self.bits_per_record == 1:
            return self._unchecked(idx)
        return self._unchecked(self._record_bits(idx)).any(axis=1)

    def _record_bits(self, idx: np.ndarray) -> np.ndarray:
        """Every bit of records ``idx``, one row per record."""
        return idx[:, None] * self.bits_per_record + np.arange(self.bits_per_record)

    def _mark(self, fresh: np.ndarray) -> None:
        """Set bits ``fresh``; see :meth:`_count`."""
        with self._lock:
            np.bitwise_or.at(self.verified, fresh >> 3, _BIT[fresh & 7])
            self._count(len(fresh))

    def _count(self, marked: int) -> None:
        """The count drops by the bits just ``marked`` (a duplicate counted twice, with no sort
        to find them; a bit set natively while :meth:`_mark` rewrote its byte lost): reaching 0
        it is recounted from the bitmap, so it never reads 0 while a bit is unset. Called
        holding the lock."""
        self.remaining = counted_down(self.remaining, marked, lambda: (
            self.manifest.count * self.bits_per_record - int(_BITS_SET[self.verified].sum())))

    def read_records(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        if not self.remaining:
            return read_checked(self.inner, indices, self.where, select)
        idx = self.inner.check_indices(indices)
        self._check_tables(idx)
        if self._gathers_records and not select:
            batch = self._gather_records(idx)
            if batch is not None:
                return batch
        if self.entry_checks is not None and self.entry_checks.selects_one_entry(select):
            return self._read_entries(idx, select)  # type: ignore[arg-type]
        unchecked = self._unchecked_records(idx)
        if not unchecked.any():
            return read_checked(self.inner, idx, self.where, select)
        batch = read_checked(self.inner, idx, self.where)
        self._check(idx, unchecked, batch)
        return apply_select(batch, select, self.manifest.fields)

    def read_into(self, indices: np.ndarray, out: dict[str, np.ndarray]) -> Batch:
        if not self.remaining:
            return read_checked(self.inner, indices, self.where, out=out)
        idx = self.inner.check_indices(indices)
        self._check_tables(idx)
        if self._gathers_records and set(out) == set(self.manifest.fields):
            batch = self._gather_records(idx, out)
            if batch is not None:
                return batch
        batch = read_checked(self.inner, idx, self.where, out=out)
        unchecked = self._unchecked_records(idx)
        if unchecked.any():  # hashed where they were gathered (e.g. the slot they leave by)
            self._check(idx, unchecked, batch)
        return batch

    def _check_tables(self, idx: np.ndarray) -> None:
        """The blocks of the per-record arrays that say where records ``idx`` lie and what
        they hold (their checksums, offsets, index entries), checked before the records are
        read (format 3; each block once: after a first epoch, a read checks none)."""
        checks = self.manifest.checks
        if checks is not None and checks.records_left:
            checks.records(idx)

    def _gather_records(self, idx: np.ndarray, out: dict[str, np.ndarray] | None = None
                        ) -> Batch | None:
        """Whole records ``idx`` gathered (into ``out``, or new arrays) and checked as they are
        copied; None where the inner reader cannot gather this batch by rows."""
        sources = _named(self.where, self.inner.row_sources, idx)
        if sources is None:
            return None
        if out is None:
            out = new_arrays(self.manifest.fields, [name for name, _, _ in sources], len(idx))
        _named(self.where, self._gather_checked, idx, sources, out, idx, self._expected[idx])
        return {name: out[name] for name, _, _ in sources}

    def _gather_checked(self, idx: np.ndarray, sources: RowSources, out: dict[str, np.ndarray],
                        bits: np.ndarray, expected: np.ndarray) -> None:
        """Records ``idx`` gathered from ``sources`` into ``out``, those whose ``bits`` are not
        set yet hashed as they are copied, checked against ``expected`` (one checksum per
        record) and marked (:func:`packdata.checksum.gather_checked`)."""
        first, marked = checksum.gather_checked(*native_arguments(sources, out),
                                                np.ascontiguousarray(bits), expected,
                                                self.verified)
        if first >= 0:
            raise mismatch(self.where, self.inner, int(idx[first]))
        if marked:
            with self._lock:
                self._count(marked)

    def _gather_entries(self, idx: np.ndarray, select: Select, entries: np.ndarray
                        ) -> Batch | None:
        """One entry of each of records ``idx`` (``entries``), gathered and checked as copied:
        the entry checksums first (a field of a few bytes a record, not hashed itself), then
        the shared fields and the entries, hashed in that order; None where the inner reader
        cannot gather this batch by rows."""
        checks = self.entry_checks
        assert checks is not None
        sources = _named(self.where, self.inner.row_sources, idx, select)
        if sources is None:
            return None
        out = new_arrays(self.manifest.fields, [name for name, _, _ in sources], len(idx),
                         select)
        by_name = {source[0]: source for source in sources}
        _named(self.where, checksum.gather, *native_arguments([by_name[checks.field]], out))
        expected = out[checks.field][np.arange(len(idx)), entries]
        hashed = [by_name[name] for name in (*checks.shared, *checks.entries_of)]
        _named(self.where, self._gather_checked, idx, hashed, out,
               idx * self.bits_per_record + entries, expected)
        return {name: out[name] for name in self.manifest.fields}

    def _check(self, idx: np.ndarray, unchecked: np.ndarray, batch: Batch) -> None:
        """Check the whole records of ``batch`` (records ``idx``) that are ``unchecked``, then
        mark them; a DatasetError naming the first that fails."""
        fresh, fresh_batch = _taken(idx, unchecked, batch)
        bad = bad_checksums(self.inner, fresh, fresh_batch)
        if bad:
            raise mismatch(self.where, self.inner, bad[0])
        self._mark(self._record_bits(fresh).reshape(-1))

    def _read_entries(self, idx: np.ndarray, select: Select) -> Batch:
        """One entry of each of records ``idx`` (the same of every entry field: ``select``),
        each checked by its entry checksum the first time it is read here."""
        checks = self.entry_checks
        assert checks is not None
        first = checks.entries_of[0]
        # checked here too: an entry past K would name another record's bit
        entries = selected_entries(select, first, self.manifest.fields[first], len(idx))
        if self.gathers_checked:
            batch = self._gather_entries(idx, select, entries)
            if batch is not None:
                return batch
        batch = read_checked(self.inner, idx, self.where, select)
        bits = idx * self.bits_per_record + entries
        unchecked = self._unchecked(bits)
        if unchecked.any():
            fresh, fresh_batch = _taken(idx, unchecked, batch)
            fresh_entries = entries[unchecked] if not unchecked.all() else entries
            stored = np.asarray(fresh_batch[checks.field])[np.arange(len(fresh)), fresh_entries]
            bad = fresh[entry_checksums(fresh_batch, checks, len(fresh), one_entry=True) != stored]
            if len(bad):
                raise mismatch(self.where, self.inner, int(bad[0]))
            self._mark(bits[unchecked])
        return batch

    def lengths(self, name: str) -> np.ndarray:
        if self.manifest.checks is not None:  # every record's: all their tables' blocks
            self.manifest.checks.all_records()
        return self.inner.lengths(name)

    def prefetch(self, starts: Sequence[int]) -> None:
        self.inner.prefetch(starts)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str):
        # what is not about reading (a container's own helpers, e.g. prefetch) is the inner's
        if name == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def _taken(idx: np.ndarray, wanted: np.ndarray, batch: Batch) -> tuple[np.ndarray, Batch]:
    """Records ``idx[wanted]`` and their rows of ``batch`` (the batch itself when all are)."""
    if wanted.all():  # the usual case (a first epoch): the batch as read
        return idx, batch
    at = np.flatnonzero(wanted)
    return idx[at], {name: [value[j] for j in at.tolist()] if isinstance(value, list) else value[at]
                     for name, value in batch.items()}


def at_open(reader: Reader, where: str | Path, level: str) -> Reader:
    """The reader to use for ``level``: a sample checked now (``"sample"``, ``"full"``: damage
    is named at open where it can be), and every read checked (``"full"``)."""
    if level not in LEVELS:
        raise ArgumentError(f"verify={level!r}: expected one of {', '.join(LEVELS)}")
    if level != "off":
        check_sample(reader, where)
    return ChecksummedReader(reader, where) if level == "full" else reader
