"""Where each record of an LMDB lies in data.mdb: the map that lets a batch be read from a
memory map of the file (one numpy gather for fixed-size records) instead of a B-tree lookup per
record.

Conversion stores every record's offset (``__offsets__``, found by a cursor scan once the
records are committed: :func:`record_offsets`); a reader reads through them
(:class:`StoredMap`) where they still hold. Datasets without them (or whose records moved: a
compacted copy) are read through LMDB, fixed-size records from a :class:`RecordMap` that learns
each record's offset on its first read.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import mmap
import os
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from packdata.containers.base import map_file
from packdata.containers.lmdbcheck import Tree
from packdata.errors import DatasetError

OFFSETS_KEY = b"__offsets__"
SCAN_BYTES = 16 << 20  # record bytes located between two page releases


def record_key(i: int) -> bytes:
    return b"%010d" % i


class RecordMap:
    """Where each fixed-size record of an LMDB lies in data.mdb, learnt once per record from the
    address LMDB itself returns for it, so a batch is then one numpy gather from a memory map of
    the file (as HDF5's) instead of a B-tree lookup per record from Python.

    Only the address LMDB gives is used, not its page format: the file offset is that address
    less the start of LMDB's mapping of data.mdb (found in ``/proc/self/maps``, so Linux only;
    elsewhere, or if a record's bytes are not where they are expected, reads look keys up).
    """

    def __init__(self, path: Path, env: lmdb.Environment, size: int, count: int,
                 map_start: int, map_offset: int, missing: Any) -> None:
        self.path, self.env, self.size = path, env, size
        self.map_start, self.map_offset = map_start, map_offset
        self.missing = missing
        self.whole = map_file(path / "data.mdb")
        self._columns: dict[tuple[int, int], np.ndarray] = {}
        self.offsets = np.full(count, -1, dtype=np.int64)
        self.txn = env.begin(buffers=True)  # read-only: its buffers point into LMDB's map

    @classmethod
    def open(cls, path: Path, env: lmdb.Environment, size: int, count: int,
             missing: Any) -> RecordMap | bool:
        """A map, or False where records cannot be located this way."""
        if count == 0 or size == 0 or not os.path.exists("/proc/self/maps"):
            return False
        with env.begin(buffers=True) as txn:
            value = txn.get(record_key(0))
            if value is None or len(value) != size:
                return False
            address = _address(value)
        found = _mapping_of(address, os.stat(path / "data.mdb").st_ino)
        if found is None:
            return False
        located = cls(path, env, size, count, *found, missing)
        try:  # the bytes found there must be the record's own
            start = located.locate(np.zeros(1, np.int64))
            row = located.column(0, size)[start][0]
        except (LookupError, ValueError):
            return False
        if row.tobytes() != bytes(located.txn.get(record_key(0))):
            return False
        located._use_stored()
        return located

    def _use_stored(self) -> None:
        """The offsets conversion stored, where they hold: within the file, and the first and
        last record's bytes found there (a copied or compacted LMDB moves records: then each
        record is located on its first read, as without them). Any other stale offset gives
        bytes that fail the record's checksum (checked on every read by default)."""
        stored = self.txn.get(OFFSETS_KEY)
        count = len(self.offsets)
        if stored is None or len(stored) != 8 * count:
            return
        offsets = np.frombuffer(stored, dtype="<i8")
        if offsets.min() < 0 or offsets.max() > len(self.whole) - self.size:
            return
        for i in (0, count - 1):
            if self.whole[offsets[i] : offsets[i] + self.size].tobytes() != \
                    bytes(self.txn.get(record_key(i))):
                return
        self.offsets = offsets.astype(np.int64)  # a private copy: locate() fills it in

    def column(self, start: int, end: int) -> np.ndarray:
        """Bytes ``start:end`` of every record, as rows of a view of the file: row ``o`` is
        bytes ``o + start : o + end``, so ``column(a, b)[offsets]`` is one gather."""
        view = self._columns.get((start, end))
        if view is None:
            view = self._columns[start, end] = byte_rows(self.whole, start, end)
        return view

    def locate(self, idx: np.ndarray) -> np.ndarray:
        """File offsets of records ``idx`` (checked indices)."""
        offsets = self.offsets[idx]
        unknown = np.flatnonzero(offsets < 0)
        if len(unknown):
            get, first = self.txn.get, self.map_offset - self.map_start
            for j in unknown.tolist():
                key = record_key(int(idx[j]))
                value = get(key)
                if value is None:
                    self.missing(idx[j])
                if len(value) != self.size:
                    raise DatasetError(f"{self.path}: record {idx[j]} has {len(value)} bytes, not "
                                       f"{self.size}; the dataset is damaged")
                offsets[j] = _address(value) + first
            if offsets[unknown].max() > len(self.whole) - self.size or offsets[unknown].min() < 0:
                raise DatasetError(f"{self.path}: a record lies outside data.mdb; the dataset is "
                                   "damaged")
            self.offsets[idx[unknown]] = offsets[unknown]
        return offsets


class StoredMap:
    """Records read from packdata's own map of data.mdb (``whole``) at the offsets conversion
    stored (``offsets``: a view of the stored value, never copied whole), each batch's offsets
    and sizes bounded by the file's size before a byte is read: a damaged offset is a
    DatasetError (or bytes that fail the record's checksum), never a read past the file."""

    def __init__(self, path: Path, whole: np.ndarray, offsets: np.ndarray, size: int) -> None:
        self.path, self.whole, self.offsets, self.size = path, whole, offsets, size
        self._columns: dict[tuple[int, int], np.ndarray] = {}

    def locate(self, idx: np.ndarray, sizes: np.ndarray | int | None = None) -> np.ndarray:
        """File offsets of records ``idx`` (checked indices) of ``sizes`` bytes (each record's,
        or ``size``: fixed-size records), checked to lie inside data.mdb."""
        sizes = self.size if sizes is None else sizes
        offsets = self.offsets[idx].astype(np.int64, copy=False)
        end = len(self.whole)
        if not len(offsets):
            return offsets
        # fixed sizes: one bound (end - size, not max + size, which a damaged offset overflows)
        past = offsets.max() > end - sizes if isinstance(sizes, (int, np.integer)) else (
            offsets.max() > end or (offsets + sizes).max() > end)
        if past or offsets.min() < 0:
            raise DatasetError(f"{self.path}: a record lies outside data.mdb; the dataset is "
                               "damaged")
        return offsets

    def column(self, start: int, end: int) -> np.ndarray:
        """Bytes ``start:end`` of every record (see :meth:`RecordMap.column`)."""
        view = self._columns.get((start, end))
        if view is None:
            view = self._columns[start, end] = byte_rows(self.whole, start, end)
        return view


def byte_rows(whole: np.ndarray, start: int, end: int) -> np.ndarray:
    """Rows of a read-only view of ``whole``: row ``o`` is bytes ``o + start : o + end``."""
    return np.lib.stride_tricks.as_strided(
        whole[start:], shape=(max(len(whole) - end + 1, 0), end - start), strides=(1, 1),
        writeable=False)


def write_offsets(path: Path, env: lmdb.Environment, count: int) -> np.ndarray | None:
    """Write each record's offset into the ``__offsets__`` value committed (``8 * count``
    bytes, in place in data.mdb: storing them through LMDB would copy the last leaf page, and
    move the records it holds); the offsets written, or None where they cannot be found.

    Records that are small enough to sit in leaf pages move whenever a later write touches
    their page (copy on write): the keys after them (the length tables, manifest, offsets) are
    written first, then the records' final places are found and written into bytes LMDB
    already placed."""
    size = os.stat(path / "data.mdb").st_size // count  # the records' mean size, about
    offsets = record_offsets(path, env, count, max(size, 1))
    if offsets is None:
        return None
    info = env.info()
    found = Tree(path, info["last_pgno"], info["last_txnid"]).locate(OFFSETS_KEY)
    if found is None or found[1] != 8 * count:
        return None
    with open(path / "data.mdb", "r+b") as f:
        os.pwrite(f.fileno(), offsets, found[0])  # the array's own buffer, not a copy
        os.fsync(f.fileno())
    return offsets


def record_offsets(path: Path, env: lmdb.Environment, count: int, size: int
                   ) -> np.ndarray | None:
    """Each record's byte offset in data.mdb, from a cursor scan of the committed records of
    about ``size`` bytes each (the addresses LMDB returns, less its mapping's start); None where
    they cannot be found."""
    if not count or not os.path.exists("/proc/self/maps"):
        return None
    with env.begin(buffers=True) as txn:
        cursor = txn.cursor()
        if not cursor.set_key(record_key(0)):
            return None
        values = itertools.islice(cursor.iternext(keys=False, values=True), count)
        addresses = np.empty(count, dtype=np.int64)
        step = max(1, SCAN_BYTES // max(size, 1))
        for a in range(0, count, step):
            got = np.fromiter((_address(v) for v in itertools.islice(values, step)),
                              dtype=np.int64)
            addresses[a : a + len(got)] = got
            # the scan reads every page of the file: let them go as it moves on, or all of
            # data.mdb stays resident in this process (counted, though the kernel may drop it)
            _let_go(int(got.min()), int(got.max()) + size)
    found = _mapping_of(int(addresses[0]), os.stat(path / "data.mdb").st_ino)
    if found is None:
        return None
    start, file_offset = found
    addresses -= start - file_offset  # in place: at 10⁷ records each copy is 80 MB more
    return addresses.astype("<i8", copy=False)


def _let_go(lo: int, hi: int) -> None:
    """Drop this process's pages of LMDB's read-only file mapping between addresses ``lo``
    and ``hi``: their data stays in the page cache and is mapped again if touched."""
    lo -= lo % mmap.PAGESIZE
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo),
                                                  mmap.MADV_DONTNEED)


def _address(buffer: Any) -> int:
    return np.frombuffer(buffer, dtype=np.uint8).__array_interface__["data"][0]


def _mapping_of(address: int, inode: int) -> tuple[int, int] | None:
    """(start, file offset) of this process's mapping of the file ``inode`` holding
    ``address``, from /proc/self/maps; None if there is none."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) < 6 or int(fields[4]) != inode:
                    continue
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if start <= address < end:
                    return start, int(fields[2], 16)
    except (OSError, ValueError):
        return None
    return None
