"""Per-record metadata as arrays: record keys and checksums, stored inside the container
(format version 2) and read lazily through memory maps, never as Python lists.

The arrays (:data:`DTYPES`, byte order pinned):

- ``keys``: every key's UTF-8 bytes, concatenated (uint8); ``key_offsets``: where key ``i``
  starts and ends (``count + 1`` int64);
- ``key_hashes``: XXH3-64 of each key, sorted; ``key_order``: the record of each sorted hash, so
  :meth:`Keys.index_of` is a binary search, with no dict of all keys built;
- ``checksums``: each record's checksum (uint64, :mod:`packdata.checksum`).

:class:`MetaSpool` streams them to files during conversion (memory stays flat in the record
count); :func:`map_npz` maps the members of an uncompressed ``.npz`` in place (tar and sharded
datasets keep their arrays in one).
"""

from __future__ import annotations

import operator
import struct
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np
import xxhash

from packdata.blockchecks import BlockChecks
from packdata.checksum import xxh3_each
from packdata.errors import ArgumentTypeError, DatasetError
from packdata.kept import KeptByFiles
from packdata.spooling import FLUSH, ColumnSpool, remove_sorted, sort_hashes

DTYPES = {"keys": "|u1", "key_offsets": "<i8", "key_hashes": "<u8", "key_order": "<i8",
          "checksums": "<u8"}


def key_hash(key: str) -> int:
    return xxhash.xxh3_64_intdigest(key.encode())


def packed(strings: Sequence[str]) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """``strings`` as UTF-8: each one's bytes, all of them back to back (uint8) and where each
    ends (``offsets``, int64, one more than the strings, from 0)."""
    encoded = [s.encode() for s in strings]
    offsets = np.zeros(len(encoded) + 1, dtype="<i8")
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)),
              out=offsets[1:])
    return encoded, np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets


def packed_keys(keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``keys`` as a :class:`MetaSpool` takes them: their bytes and offsets (:func:`packed`)
    and their hashes; made where they are known (a conversion's worker, for its block)."""
    encoded, data, offsets = packed(keys)
    return data, offsets, key_hashes(encoded)


def key_hashes(encoded: Sequence[Any]) -> np.ndarray:
    """:func:`key_hash` of each of keys ``encoded`` (UTF-8 bytes, or uint8 arrays of them), for
    a block of keys at once (one native call where packdata's C extension was built)."""
    return xxh3_each(encoded)


class Keys(Sequence[str]):
    """Record keys over arrays (see the module docstring): ``keys[i]``, ``len``, iteration and
    :meth:`index_of` touch only the bytes they need.

    Keys read from a dataset never serve an entry unchecked: with ``checks`` (format 3), each
    block of the arrays a read touches is checked against its checksum first
    (:class:`~packdata.blockchecks.BlockChecks`); without (format 2, ``where`` given), a key is
    served only if its hash is found at its record in the sorted hashes. Damage is a
    DatasetError naming the dataset (``where``), never another key."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray, hashes: np.ndarray | None = None,
                 order: np.ndarray | None = None, checks: BlockChecks | None = None,
                 where: str | Path | None = None) -> None:
        self.data, self.offsets, self.hashes, self.order = data, offsets, hashes, order
        self.checks, self.where = checks, where

    @classmethod
    def from_list(cls, keys: Iterable[str]) -> Keys:
        """Keys held in memory (a version-1 manifest's, or a test's)."""
        encoded, data, offsets = packed(list(keys))
        hashes = key_hashes(encoded)
        order = np.argsort(hashes, kind="stable")
        return cls(data, offsets, hashes[order], order)

    def __len__(self) -> int:
        return max(len(self.offsets) - 1, 0)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        i = operator.index(i)  # as a list's: a float or a string is a TypeError, not a key
        if not -n <= i < n:
            raise IndexError(f"key {i} out of range for {n} records")
        i %= n
        if self.checks is not None:
            self.checks.bytes("key_offsets", 8 * i, 8 * i + 16)
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        if not 0 <= a <= b <= len(self.data):
            raise self._damaged(f"key {i} lies outside the keys")
        if self.checks is not None:
            self.checks.bytes("keys", a, b)
        raw = self.data[a:b].tobytes()
        if self.checks is None and self.where is not None:
            self._confirm(i, raw)
        return raw.decode(errors="replace")

    def _confirm(self, i: int, raw: bytes) -> None:
        """Key ``i`` (``raw``) is found at record ``i`` in the sorted hashes (format 2, whose
        arrays have no checksums of their own: a damaged byte of the keys or their offsets
        gives a key whose hash is not there)."""
        if self.hashes is None or self.order is None:
            return
        h = np.uint64(xxhash.xxh3_64_intdigest(raw))
        lo, hi = np.searchsorted(self.hashes, h, "left"), np.searchsorted(self.hashes, h, "right")
        if i not in self.order[lo:hi]:
            raise self._damaged(f"key {i} is not in the key index")

    def _damaged(self, what: str) -> DatasetError:
        return DatasetError(f"{self.where or 'keys'}: {what}; the record keys are damaged "
                            "(run `packdata verify`)")

    def label(self, i: int) -> str:
        """Key ``i`` for a message: the key, or what stops it from being read."""
        try:
            return repr(self[i])
        except DatasetError:
            return "its key damaged"

    def __iter__(self) -> Iterator[str]:
        for a in range(0, len(self), FLUSH):  # the blocks of a run of keys checked at once
            b = min(a + FLUSH, len(self))
            if self.checks is not None:
                self.checks.bytes("key_offsets", 8 * a, 8 * b + 8)
                lo, hi = int(self.offsets[a]), int(self.offsets[b])
                if 0 <= lo <= hi <= len(self.data):
                    self.checks.bytes("keys", lo, hi)
            yield from (self[i] for i in range(a, b))

    def index_of(self, key: str) -> int:
        """The record whose key is ``key``; KeyError if none (TypeError for a key that is not
        a string)."""
        if not isinstance(key, str):
            raise ArgumentTypeError(f"keys are strings (each sample's path), got {key!r:.60}")
        if self.hashes is None or self.order is None:
            raise KeyError(key)
        h = np.uint64(key_hash(key))
        n = len(self.hashes)
        lo, hi = np.searchsorted(self.hashes, h, "left"), np.searchsorted(self.hashes, h, "right")
        if self.checks is not None:
            # a binary search's answer holds once the entries beside it are checked: they are
            # those it compared last, and the checked array is sorted
            self.checks.rows("key_hashes", np.arange(max(lo - 1, 0), min(hi + 1, n)))
            if (lo > 0 and self.hashes[lo - 1] >= h) or (hi < n and self.hashes[hi] <= h):
                raise self._damaged("the key index is out of order")
            self.checks.rows("key_order", np.arange(lo, hi))
        for i in self.order[lo:hi].tolist():
            if not 0 <= i < len(self):
                raise self._damaged(f"the key index names record {i} of {len(self)}")
            if self[i] == key:
                return int(i)
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        try:
            self.index_of(key)  # type: ignore[arg-type]
        except (KeyError, TypeError):
            return False
        return True

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Keys):
            return np.array_equal(self.offsets, other.offsets) and np.array_equal(
                self.data, other.data)
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Keys({len(self)} keys)"


def arrays_of(keys: Keys, checksums: np.ndarray) -> dict[str, np.ndarray]:
    """The arrays a container stores for ``keys`` and ``checksums``."""
    if keys.hashes is None or keys.order is None:
        keys = Keys.from_list(keys)
    arrays = {"keys": keys.data, "key_offsets": keys.offsets, "key_hashes": keys.hashes,
              "key_order": keys.order, "checksums": checksums}
    return {k: np.asarray(v).astype(DTYPES[k], copy=False) for k, v in arrays.items()}


def from_arrays(arrays: dict[str, np.ndarray], count: int, where: Any,
                checks: BlockChecks | None = None) -> tuple[Keys, np.ndarray]:
    """Keys and checksums from stored arrays, checked in O(1): sizes and dtypes, the offsets'
    ends; each entry is checked when it is read (see :class:`Keys`), against ``checks`` where
    the dataset has them."""
    for name, dtype in DTYPES.items():
        a = arrays.get(name)
        if a is None or a.ndim != 1 or a.dtype != np.dtype(dtype):
            raise DatasetError(f"{where}: the record metadata '{name}' is missing or damaged; "
                               "the dataset is damaged")
    offsets, data = arrays["key_offsets"], arrays["keys"]
    sizes = {"key_offsets": count + 1, "key_hashes": count, "key_order": count,
             "checksums": count}
    bad = [n for n, size in sizes.items() if len(arrays[n]) != size]
    if bad or offsets[0] != 0 or offsets[-1] != len(data):
        raise DatasetError(f"{where}: the record metadata ({', '.join(bad) or 'key_offsets'}) "
                           f"does not describe {count} records; the dataset is damaged")
    keys = Keys(data, offsets, arrays["key_hashes"], arrays["key_order"], checks, where)
    return keys, arrays["checksums"]


class MetaSpool:
    """Keys and checksums appended record by record to files beside the output (``stem`` +
    ``.<array>``), buffered a few thousand records at a time."""

    def __init__(self, stem: Path) -> None:
        self.stem = stem
        self.columns = {n: ColumnSpool(self.path(n), dtype) for n, dtype in
                        (("keys", "|u1"), ("offsets", "<i8"), ("hashes", "<u8"),
                         ("checksums", "<u8"))}
        self.count, self.nbytes = 0, 0
        self.columns["offsets"].append(0)

    def path(self, name: str) -> Path:
        return self.stem.with_name(f"{self.stem.name}.{name}")

    def append(self, key: str, checksum: int) -> None:
        encoded = key.encode()
        self.columns["keys"].extend_raw(encoded)
        self.nbytes += len(encoded)
        self.columns["offsets"].append(self.nbytes)
        self.columns["hashes"].append(xxhash.xxh3_64_intdigest(encoded))
        self.columns["checksums"].append(checksum)
        self.count += 1

    def append_block(self, keys: Sequence[str], checksums: np.ndarray) -> None:
        """Records ``keys`` with their ``checksums``, as many :meth:`append` calls would."""
        self.append_packed(*packed_keys(keys), checksums)

    def append_packed(self, data: np.ndarray, offsets: np.ndarray, hashes: np.ndarray,
                      checksums: np.ndarray) -> None:
        """Records whose keys come packed (:func:`packed_keys`), with their ``checksums``."""
        self.columns["keys"].extend_raw(data.data)
        self.columns["offsets"].extend(offsets[1:] + self.nbytes)
        self.columns["hashes"].extend(hashes)
        self.columns["checksums"].extend(checksums)
        self.nbytes += int(offsets[-1])
        self.count += len(offsets) - 1

    def extend(self, keys: Keys, checksums: np.ndarray, block: int = FLUSH) -> None:
        """Another dataset's keys and checksums appended (a part's), block by block."""
        for a in range(0, len(keys), block):
            b = min(a + block, len(keys))
            lo, hi = int(keys.offsets[a]), int(keys.offsets[b])
            self.columns["keys"].extend(keys.data[lo:hi])
            self.columns["offsets"].extend(keys.offsets[a + 1 : b + 1] - lo + self.nbytes)
            self.nbytes += hi - lo
            ends = keys.offsets[a : b + 1].tolist()
            self.columns["hashes"].extend(key_hashes(
                [keys.data[s:e] for s, e in zip(ends, ends[1:])]))
            self.columns["checksums"].extend(checksums[a:b])
            self.count += b - a

    def finish(self) -> tuple[Keys, np.ndarray]:
        """Keys and checksums over the spooled files (memory-mapped), hashes sorted."""
        data, offsets, hashes, checksums = (c.finish() for c in self.columns.values())
        sorted_hashes, order = sort_hashes(hashes, self.path(""))
        return Keys(data, offsets, sorted_hashes, order), checksums

    def remove(self) -> None:
        for column in self.columns.values():
            column.remove()
        remove_sorted(self.path(""))


def map_npz(path: Path, whole: np.ndarray) -> dict[str, np.ndarray]:
    """The members of the uncompressed ``.npz`` at ``path`` as arrays over ``whole`` (the whole
    file, memory-mapped): nothing is read but the zip directory and the ``.npy`` headers, and
    those once per file and process (:mod:`packdata.kept`: found again while the file is
    unchanged). A damaged file is a DatasetError naming it, whatever zipfile or numpy's header
    parser raised."""
    try:
        members = _KEPT_MEMBERS.get([path], lambda _: _members(path, len(whole)))
    except DatasetError:
        raise
    except Exception as exc:  # e.g. zipfile.BadZipFile, tokenize.TokenError from a header
        raise DatasetError(f"{path}: cannot be read ({type(exc).__name__}: {exc}); the dataset "
                           "is damaged") from None
    if len(whole) < members.size:
        raise DatasetError(f"{path}: holds {len(whole)} bytes, its members end at "
                           f"{members.size}; the dataset is damaged")
    return {name: whole[start : start + size].view(dtype).reshape(shape)
            for name, (start, size, dtype, shape) in members.arrays.items()}


class _Members:
    """Where each member's array lies in an ``.npz``: (start, bytes, dtype, shape) by name, and
    the bytes the file must hold for all of them."""

    def __init__(self, arrays: dict[str, tuple[int, int, np.dtype, tuple[int, ...]]]) -> None:
        self.arrays = arrays
        self.size = max((start + size for start, size, _, _ in arrays.values()), default=0)


def _members(path: Path, file_bytes: int) -> _Members:
    arrays = {}
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
                raise DatasetError(f"{path}: '{info.filename}' is compressed or not an array; "
                                   "the dataset is damaged")
            f.seek(info.header_offset)
            head = f.read(30)
            if len(head) < 30 or head[:4] != b"PK\x03\x04":
                raise DatasetError(f"{path}: a damaged zip entry; the dataset is damaged")
            name_len, extra_len = struct.unpack("<HH", head[26:30])
            start = info.header_offset + 30 + name_len + extra_len
            f.seek(start)
            version = np.lib.format.read_magic(f)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise DatasetError(f"{path}: '{info.filename}' is no .npy array; the dataset "
                                   "is damaged")
            shape, fortran, dtype = read_header(f)
            data = f.tell()
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if fortran or dtype.hasobject or data + size > file_bytes or \
                    size > info.file_size:
                raise DatasetError(f"{path}: '{info.filename}' does not fit the file; the "
                                   "dataset is damaged")
            arrays[info.filename[:-4]] = (data, size, dtype, tuple(shape))
    return _Members(arrays)


#: the member layouts of the ``.npz`` files opened last (an index, the record keys and checksums)
_KEPT_MEMBERS: KeptByFiles[_Members] = KeptByFiles(keep=8)
