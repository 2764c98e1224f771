"""Integrity on the read path: records checked against the manifest's checksums.

- ``verify="sample"`` (the default): the checksums of a few records spread over the dataset,
  checked once at open (:func:`check_sample`);
- ``verify="full"``: every batch read is checked (:class:`ChecksummedReader`);
- ``verify="off"``: neither. The structural checks every Reader makes when it opens (the manifest,
  sizes and offsets: :func:`packdata.manifest.check_manifest`) always run.

``packdata verify`` (:mod:`packdata.verify`) builds on these to check a whole dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from packdata.checksum import batch_checksums
from packdata.containers.base import Batch, Reader, Select, apply_select
from packdata.errors import ArgumentError, DatasetError, PackdataError

LEVELS = ("off", "sample", "full")
SAMPLED_RECORDS = 8  # records checksummed at open with verify="sample"


def bad_checksums(reader: Reader, idx: np.ndarray, batch: Batch) -> list[int]:
    """The indices among ``idx`` whose record in ``batch`` does not match its checksum."""
    m = reader.manifest
    if not m.checksums:
        return []
    expected = m.checksums
    return [i for i, crc in zip(idx.tolist(), batch_checksums(batch, m.fields, len(idx)))
            if crc != expected[i]]


def read_checked(reader: Reader, idx: np.ndarray, where: str | Path,
                 select: Select | None = None) -> Batch:
    """``reader.read``, with any failure that is not packdata's turned into a DatasetError
    naming the dataset (a damaged file makes numpy or a backend raise its own errors)."""
    try:
        return reader.read(idx, select)
    except (PackdataError, IndexError):
        raise
    except Exception as exc:
        raise DatasetError(f"{where}: records cannot be read ({type(exc).__name__}: {exc}); "
                           "the dataset is damaged") from None


def check_sample(reader: Reader, where: str | Path, records: int = SAMPLED_RECORDS) -> None:
    """The checksums of ``records`` records spread over the dataset (first and last included)."""
    n = reader.manifest.count
    if not n or not reader.manifest.checksums:
        return
    idx = np.unique(np.linspace(0, n - 1, min(records, n)).astype(np.int64))
    batch = read_checked(reader, idx, where)
    bad = bad_checksums(reader, idx, batch)
    if bad:
        raise DatasetError(f"{where}: record {bad[0]} ('{reader.manifest.keys[bad[0]]}') does not "
                           "match its checksum; the dataset is damaged (run `packdata verify`)")


class ChecksummedReader(Reader):
    """A Reader whose every batch is checked against the manifest's checksums (``verify="full"``).

    A wrapper, so the plain readers' hot paths stay as they are. A ``select`` read fetches whole
    records (the checksum covers all of a record), then selects."""

    def __init__(self, inner: Reader, where: str | Path) -> None:
        self.inner = inner
        self.where = where
        self.manifest = inner.manifest

    def read(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        idx = self.inner.check_indices(indices)
        batch = read_checked(self.inner, idx, self.where)
        bad = bad_checksums(self.inner, idx, batch)
        if bad:
            raise DatasetError(f"{self.where}: record {bad[0]} ('{self.manifest.keys[bad[0]]}') "
                               "does not match its checksum; the dataset is damaged")
        return apply_select(batch, select)

    def lengths(self, name: str) -> np.ndarray:
        return self.inner.lengths(name)

    def prefetch(self, starts: Sequence[int]) -> None:
        self.inner.prefetch(starts)

    def close(self) -> None:
        self.inner.close()


def at_open(reader: Reader, where: str | Path, level: str) -> Reader:
    """The reader to use for ``level``: checked now (``"sample"``) or wrapped (``"full"``)."""
    if level not in LEVELS:
        raise ArgumentError(f"verify={level!r}: expected one of {', '.join(LEVELS)}")
    if level == "sample":
        check_sample(reader, where)
    return ChecksummedReader(reader, where) if level == "full" else reader
