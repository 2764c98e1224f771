"""Per-record columns spooled to files while a dataset is written, and read back mapped: memory
flat in the record count, however many records a conversion writes.

:class:`ColumnSpool` appends one column's values; :func:`sort_hashes` sorts a column of hashes
on disk past :data:`SORT_IN_MEMORY`; :func:`copy_blocks` and :func:`save_npz` copy a mapped
column into its container a block at a time, letting go of the pages read.
"""

from __future__ import annotations

import contextlib
import mmap
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

FLUSH = 1 << 16  # values a ColumnSpool buffers between writes
#: key hashes sorted in memory up to this many records; beyond, bucket by bucket on disk
SORT_IN_MEMORY = 1 << 20
BUCKET_BITS = 8  # 256 buckets by the hashes' top bits: ~4 M records in 64 MiB a bucket at 10⁹
SORT_BLOCK = 1 << 20  # hashes read (and let go) at a time while bucketing

class ColumnSpool:
    """One column of per-record values (``dtype``, each of ``shape``) appended to a file as
    records are written, :data:`FLUSH` at a time, and mapped back by :meth:`finish`: memory
    stays at one buffer whatever the record count."""

    def __init__(self, path: Path, dtype: Any, shape: tuple[int, ...] = ()) -> None:
        self.path, self.dtype, self.shape = path, np.dtype(dtype), tuple(shape)
        self.file = open(path, "wb")  # noqa: SIM115 - closed by finish or remove
        self.pending: list[Any] = []

    def append(self, value: Any) -> None:
        self.pending.append(value)
        if len(self.pending) >= FLUSH:
            self.flush()

    def extend(self, values: Any) -> None:
        """Many values at once (an array, or a list of values), after those appended."""
        self.flush()
        # a copy, not a view: while a view's export of a caller's buffer lives, the buffer
        # cannot be emptied or resized (BufferError, seen once with a sampling thread)
        self.file.write(np.array(values, dtype=self.dtype).tobytes())

    def extend_raw(self, data: bytes) -> None:
        """Values given as their bytes (``dtype``'s, in order), after those appended: no array
        made (a key's UTF-8 bytes, record by record)."""
        self.flush()
        self.file.write(data)

    def flush(self) -> None:
        if self.pending:
            self.file.write(np.array(self.pending, dtype=self.dtype).tobytes())
            self.pending.clear()

    def finish(self) -> np.ndarray:
        """Every value written, as an array over the file (memory-mapped)."""
        if not self.file.closed:
            self.flush()
            self.file.close()
        return map_array(self.path, self.dtype.str).reshape(-1, *self.shape)

    def remove(self) -> None:
        """Close and delete the file (an array :meth:`finish` gave stays readable until dropped).
        Values still buffered are dropped: a close whose flush fails (a full disk) closes the
        file all the same, and the file goes."""
        with contextlib.suppress(OSError):
            self.file.close()
        self.path.unlink(missing_ok=True)


def sort_hashes(hashes: np.ndarray, stem: Path) -> tuple[np.ndarray, np.ndarray]:
    """``hashes`` sorted, and each one's position in ``hashes`` (equal hashes in their order),
    written to files (``stem`` + ``sorted``, ``order``) and mapped. Beyond
    :data:`SORT_IN_MEMORY` hashes in memory flat in their number: they are split by their top
    bits into bucket files (XXH3 spreads them evenly), filled in order, then each bucket is
    sorted alone and appended. :func:`remove_sorted` deletes the files."""
    if len(hashes) <= SORT_IN_MEMORY:
        order = np.argsort(hashes, kind="stable")
        np.asarray(hashes[order]).tofile(_named(stem, "sorted"))
        order.astype("<i8").tofile(_named(stem, "order"))
    else:
        _sort_in_buckets(hashes, stem)
    return map_array(_named(stem, "sorted"), "<u8"), map_array(_named(stem, "order"), "<i8")


def _sort_in_buckets(hashes: np.ndarray, stem: Path) -> None:
    pair = np.dtype([("hash", "<u8"), ("record", "<i8")])
    buckets = 1 << BUCKET_BITS
    with contextlib.ExitStack() as stack:
        parts = [stack.enter_context(open(_bucket(stem, b), "wb")) for b in range(buckets)]
        start = 0
        for block in copy_blocks(hashes, SORT_BLOCK):
            bucket = (block >> np.uint64(64 - BUCKET_BITS)).astype(np.intp)
            by = np.argsort(bucket, kind="stable")  # record order kept within a bucket
            pairs = np.empty(len(block), dtype=pair)
            pairs["hash"], pairs["record"] = block[by], by + start
            cuts = np.cumsum(np.bincount(bucket, minlength=buckets))[:-1]
            for part, pairs_of_bucket in zip(parts, np.split(pairs, cuts)):
                part.write(pairs_of_bucket)  # a view's buffer: no copy
            start += len(block)
    with open(_named(stem, "sorted"), "wb") as out, open(_named(stem, "order"), "wb") as records:
        for b in range(buckets):
            pairs = np.fromfile(_bucket(stem, b), dtype=pair)
            _bucket(stem, b).unlink()
            by = np.argsort(pairs["hash"], kind="stable")
            out.write(pairs["hash"][by].tobytes())
            records.write(pairs["record"][by].tobytes())


def remove_sorted(stem: Path) -> None:
    """The files of :func:`sort_hashes`, and those an interrupted sort left."""
    for name in ("sorted", "order", *(f"bucket-{b:03d}" for b in range(1 << BUCKET_BITS))):
        _named(stem, name).unlink(missing_ok=True)


def _bucket(stem: Path, b: int) -> Path:
    return _named(stem, f"bucket-{b:03d}")


def _named(stem: Path, name: str) -> Path:
    return stem.with_name(stem.name + name)


def copy_blocks(array: np.ndarray, block: int = 1 << 20) -> Iterator[np.ndarray]:
    """``array`` as consecutive in-memory copies of ``block`` entries. Where it is a view of a
    file mapping (the spooled arrays), the pages of each block are let go once it is copied:
    writing a spooled array into a container then costs one block of resident memory, not the
    whole array (mapped pages read stay resident, and counted, until the map is dropped)."""
    mapping = _file_map(array)
    for a in range(0, len(array), block):
        part = np.array(array[a : a + block])
        yield part
        if mapping is not None and len(part):
            _let_go(mapping, array[a : a + block])


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """What ``np.savez(path, **arrays)`` writes (an uncompressed ``.npz``), written block by
    block through :func:`copy_blocks`."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, array in arrays.items():
            with z.open(f"{name}.npy", "w", force_zip64=True) as f:
                header = np.lib.format.header_data_from_array_1_0(np.asarray(array))
                np.lib.format.write_array_header_1_0(f, header)
                for part in copy_blocks(np.asarray(array)):
                    f.write(part.tobytes())


def _file_map(array: np.ndarray) -> mmap.mmap | None:
    """The file mapping ``array`` is a view of, if any (np.memmap's and map_file's arrays are
    views of an ``mmap.mmap``)."""
    base: Any = array
    while isinstance(base, np.ndarray):
        base = base.base
    return base if isinstance(base, mmap.mmap) else None


def _let_go(mapping: mmap.mmap, part: np.ndarray) -> None:
    """Drop the pages under ``part`` (a view of ``mapping``) from this process: the file's data
    stays in the page cache and is read back if touched again."""
    start = np.frombuffer(mapping, dtype=np.uint8).ctypes.data
    lo = part.ctypes.data - start
    lo -= lo % mmap.PAGESIZE
    hi = part.ctypes.data - start + part.nbytes
    with contextlib.suppress(OSError, ValueError, AttributeError):  # advice only (e.g. macOS)
        mapping.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def map_array(path: Path, dtype: str) -> np.ndarray:
    """The 1-D array of ``dtype`` a spooled file holds, memory-mapped (empty for an empty file)."""
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")
