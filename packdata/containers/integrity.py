"""Integrity on the read path: records checked against the manifest's checksums.

- ``verify="full"`` (the default): every record a read returns has been checked
  (:class:`ChecksummedReader`): hashed on its first read in this process, then remembered in a
  bitmap of verified records (the data is a read-only map), so later epochs cost a bit test;
- ``verify="sample"``: the checksums of a few records spread over the dataset, checked once at
  open (:func:`check_sample`);
- ``verify="off"``: neither. The structural checks every Reader makes when it opens (the manifest,
  sizes and offsets: :func:`packdata.manifest.check_manifest`) always run.

``packdata verify`` (:mod:`packdata.verify`) builds on these to check a whole dataset.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from packdata.checksum import algorithm_of, batch_checksums
from packdata.containers.base import Batch, Reader, Select, apply_select
from packdata.errors import ArgumentError, DatasetError, PackdataError

LEVELS = ("off", "sample", "full")
SAMPLED_RECORDS = 8  # records checksummed at open with verify="sample"
_BIT = (1 << np.arange(8)).astype(np.uint8)  # record i is bit i & 7 of byte i >> 3
_BITS_SET = np.array([bin(b).count("1") for b in range(256)], dtype=np.int64)


def bad_checksums(reader: Reader, idx: np.ndarray, batch: Batch) -> list[int]:
    """The indices among ``idx`` whose record in ``batch`` does not match its checksum."""
    m = reader.manifest
    if not len(m.checksums):
        return []
    got = batch_checksums(batch, m.fields, len(idx), algorithm_of(m.version))
    return idx[got != m.checksums[idx]].tolist()


def mismatch(where: str | Path, reader: Reader, index: int) -> DatasetError:
    """The error for record ``index`` failing its checksum: names the dataset and the record."""
    return DatasetError(f"{where}: record {index} ('{reader.manifest.keys[index]}') does not "
                        "match its checksum; the dataset is damaged (run `packdata verify`)")


def read_checked(reader: Reader, idx: np.ndarray, where: str | Path,
                 select: Select | None = None, out: dict[str, np.ndarray] | None = None) -> Batch:
    """``reader.read`` (``reader.read_into``, given ``out``), with any failure that is not
    packdata's turned into a DatasetError naming the dataset (a damaged file makes numpy or a
    backend raise its own errors)."""
    try:
        return reader.read(idx, select) if out is None else reader.read_into(idx, out)
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
    readers are opened per process); a batch of records all marked is the inner read itself. A
    ``select`` read of records not all checked yet fetches whole records (the checksum covers
    all of a record), then selects."""

    def __init__(self, inner: Reader, where: str | Path) -> None:
        self.inner = inner
        self.where = where
        self.manifest = inner.manifest
        # calloc'd: pages are touched only as records are checked
        self.verified = np.zeros((self.manifest.count + 7) // 8, dtype=np.uint8)
        #: at most the records not checked yet (exact once it reaches 0: see _mark); at 0 (after
        #: an epoch) a read is the inner read itself
        self.remaining = self.manifest.count if len(self.manifest.checksums) else 0
        self._lock = threading.Lock()  # loader threads share a reader: the count must stay exact

    def _unchecked(self, idx: np.ndarray) -> np.ndarray:
        """Whether each of ``idx`` is still to be checked."""
        return self.verified[idx >> 3] & _BIT[idx & 7] == 0

    def _mark(self, fresh: np.ndarray) -> None:
        """Mark records ``fresh`` checked. The count drops by their number, a duplicate counted
        twice (exact for a batch without duplicates, with no sort to find them): reaching 0 it
        is recounted from the bitmap, so it never reads 0 while a record is unchecked."""
        with self._lock:
            np.bitwise_or.at(self.verified, fresh >> 3, _BIT[fresh & 7])
            self.remaining -= len(fresh)
            if self.remaining <= 0:
                self.remaining = self.manifest.count - int(_BITS_SET[self.verified].sum())

    def read(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        if not self.remaining:
            return read_checked(self.inner, indices, self.where, select)
        idx = self.inner.check_indices(indices)
        unchecked = self._unchecked(idx)
        if not unchecked.any():
            return read_checked(self.inner, idx, self.where, select)
        batch = read_checked(self.inner, idx, self.where)
        self._check(idx, unchecked, batch)
        return apply_select(batch, select)

    def read_into(self, indices: np.ndarray, out: dict[str, np.ndarray]) -> Batch:
        if not self.remaining:
            return read_checked(self.inner, indices, self.where, out=out)
        idx = self.inner.check_indices(indices)
        batch = read_checked(self.inner, idx, self.where, out=out)
        unchecked = self._unchecked(idx)
        if unchecked.any():  # hashed where they were gathered (e.g. the slot they leave by)
            self._check(idx, unchecked, batch)
        return batch

    def _check(self, idx: np.ndarray, unchecked: np.ndarray, batch: Batch) -> None:
        """Check the records of ``batch`` (records ``idx``) that are ``unchecked``, then mark
        them; a DatasetError naming the first that fails."""
        if unchecked.all():  # the usual case (a first epoch): the batch as read is hashed
            bad = bad_checksums(self.inner, idx, batch)
            fresh = idx
        else:  # only the records not checked yet: their rows taken out first
            at = np.flatnonzero(unchecked)
            fresh = idx[at]
            bad = bad_checksums(self.inner, fresh, {
                name: [value[j] for j in at.tolist()] if isinstance(value, list) else value[at]
                for name, value in batch.items()})
        if bad:
            raise mismatch(self.where, self.inner, bad[0])
        self._mark(fresh)

    def lengths(self, name: str) -> np.ndarray:
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


def at_open(reader: Reader, where: str | Path, level: str) -> Reader:
    """The reader to use for ``level``: a sample checked now (``"sample"``, ``"full"``: damage
    is named at open where it can be), and every read checked (``"full"``)."""
    if level not in LEVELS:
        raise ArgumentError(f"verify={level!r}: expected one of {', '.join(LEVELS)}")
    if level != "off":
        check_sample(reader, where)
    return ChecksummedReader(reader, where) if level == "full" else reader
