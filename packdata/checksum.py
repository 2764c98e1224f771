"""The per-record checksum: one implementation, used when writing, reading and verifying.

A record's checksum is XXH3-64 (:mod:`xxhash`) over its fields' bytes in manifest order (for a
variable field, its rows' bytes): any single-byte change alters it, and it hashes at memory
speed, cheap enough to check every record a read returns (docs/reliability.md gives what that
costs a read, from bench/bench_verify.py, and what CRC-32 cost). Datasets of format version 1 carry CRC-32
checksums; :func:`algorithm_of` names the one a manifest's version uses.

Why XXH3 and not a vectorised sum: a numpy position-weighted sum over each record's 64-bit
words (one call for a whole batch) would need no work per record, at the cost of a weaker check
(changes in two words can cancel out), several passes of numpy over the batch, and a second
algorithm to keep for datasets already written. The native batch routine below takes the work
per record out of Python instead.

:func:`batch_checksums` computes a whole batch's and :func:`rows_checksums` those of records
laid out as the rows of one table; :func:`chunks_checksum` a record whose bytes arrive as
separate buffers; :func:`gather_checked` checks records as a read gathers them.

**The native batch routine.** Where packdata's C extension :mod:`packdata._rowhash` was built
(:data:`NATIVE_ROWS`), a batch's XXH3 checksums take one call, which loops over the records
without the GIL (reads run in loader threads) and hashes each where it lies: a record whose
bytes come from several fields (an image and its label) through XXH3's streaming state, one
update per field, or, when it is small, copied into one scratch buffer first (the state's set-up
costs more than that copy; bench/bench_rowhash.py). From Python each record costs a numpy row
view and a call, and fields stored apart were first copied side by side into one table of the
whole batch, another pass over every byte. The routine calls xxhash's own XXH3-64 (its C
functions, looked up once at import, and checked there against
:func:`xxhash.xxh3_64_intdigest`), so the digests are bit for bit those of the pure path, which
is what an install without a C compiler uses, and what CRC-32 (format version 1) always uses.

**Checked as gathered.** The same routine gathers a batch (:func:`gather`: each record's rows
copied from the mapped file into the batch's arrays, one call without the GIL), and the default
read (:class:`packdata.containers.integrity.ChecksummedReader`) has it check each record not
yet checked while the bytes it just copied are in the CPU's cache (:func:`gather_checked`): the
hash, the comparison and the bitmap of checked records, in that one call, not a second pass
over the batch and a dozen numpy calls after it.

**Entry checksums.** A record may hold K entries of some fields (K presampled variants of a
point cloud) of which a read serves one. Its checksum covers all K, so checking a read of one
entry would mean reading and hashing K times the bytes served. Such a record also stores, in a
uint64 field of K values declared in the manifest (:class:`EntryChecks`), one checksum per
entry: entry ``k``'s is XXH3-64 over the record's other fields' bytes, then each entry field's
entry ``k``, in manifest order (:func:`entry_checksums`). What a read of entry ``k`` returns is
then checked by hashing it alone (as it is gathered, where the routine was built); the record
checksum covers the entry checksums in turn.
"""

from __future__ import annotations

import ctypes
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

Buffer = Any  # anything exposing the buffer protocol: bytes, memoryview, a contiguous ndarray

XXH3 = "xxh3_64"
CRC32 = "crc32"  # format version 1


def _bound_rowhash():
    """:mod:`packdata._rowhash` bound to xxhash's own XXH3-64 functions, or None where it was not
    built (an install without a C compiler) or this xxhash does not export them by name."""
    try:
        import packdata._rowhash as _rowhash

        library = ctypes.CDLL(xxhash._xxhash.__file__)

        def address(*names: str) -> int:
            # the first name found: xxhash's *_dispatch entry points run the CPU's widest vector
            # code, as its Python calls do; the plain names are the baseline (SSE2 on x86-64) build
            name = next((n for n in names if hasattr(library, n)), names[-1])
            return ctypes.cast(getattr(library, name), ctypes.c_void_p).value

        _rowhash.bind(address("XXH3_64bits_dispatch", "XXH3_64bits"), address("XXH3_createState"),
                      address("XXH3_freeState"), address("XXH3_64bits_reset"),
                      address("XXH3_64bits_update_dispatch", "XXH3_64bits_update"),
                      address("XXH3_64bits_digest"))
        # one record in one piece, and in two pieces copied and streamed, past 240 bytes (XXH3's
        # long path)
        probe = np.frombuffer(b"packdata" * 200, dtype=np.uint8).reshape(1, -1)
        digests = np.empty(3, dtype=np.uint64)
        _rowhash.rows([probe], digests[:1])
        for j, stream_above in ((1, len(probe[0])), (2, 0)):
            _rowhash.rows([probe[:, :700], probe[:, 700:]], digests[j:j + 1], stream_above)
    except (ImportError, OSError, AttributeError):
        return None
    return _rowhash if set(digests.tolist()) == {xxhash.xxh3_64_intdigest(probe)} else None


_rowhash = _bound_rowhash()
#: whether XXH3 checksums of several records are computed by the native batch routine
#: (:mod:`packdata._rowhash`), else record by record from Python; the digests are the same
NATIVE_ROWS = _rowhash is not None


def _native_rows(columns: list, n: int) -> np.ndarray:
    """XXH3-64 of ``n`` records, each the bytes of its row in every column in order (an array of
    ``n`` rows, or a list of one contiguous array per record), in one native call."""
    out = np.empty(n, dtype=np.uint64)
    _rowhash.rows(columns, out)
    return out


def xxh3_each(buffers: list) -> np.ndarray:
    """XXH3-64 (uint64) of each of ``buffers`` (bytes, or contiguous arrays): one native call
    where the routine was built, else one xxhash call per buffer."""
    if not buffers:
        return np.zeros(0, dtype=np.uint64)
    if NATIVE_ROWS:
        return _native_rows([buffers], len(buffers))
    return np.fromiter(map(xxhash.xxh3_64_intdigest, buffers), dtype=np.uint64,
                       count=len(buffers))


def gather(columns: list[np.ndarray], rows: list[np.ndarray], outs: list[np.ndarray]) -> None:
    """Row ``rows[k][j]`` of each of ``columns`` (2-D uint8 arrays of byte rows, strided, even
    overlapping, over a mapped file) into row ``j`` of ``outs[k]`` (C-contiguous, as many
    bytes), in one native call without the GIL; an IndexError for a row outside its column.
    Only where the routine was built (:data:`NATIVE_ROWS`):
    :func:`packdata.containers.base.gather_rows` gathers otherwise."""
    _rowhash.gather(columns, rows, outs)


def gather_checked(columns: list[np.ndarray], rows: list[np.ndarray], outs: list[np.ndarray],
                   bits: np.ndarray, expected: np.ndarray,
                   verified: np.ndarray) -> tuple[int, int]:
    """:func:`gather`, and each record whose bit is not yet set in ``verified`` (a bitmap: bit
    ``b`` of byte ``b >> 3``; record ``j``'s is ``bits[j]``: its number, or its entry's where
    entries are checked apart) checked as it is copied: XXH3-64 of its rows (in column order)
    against ``expected[j]``, then marked. Returns (the position of the first record that does
    not match, or -1; how many bits were set). Only where the routine was built:
    :class:`packdata.containers.integrity.ChecksummedReader` checks after the gather
    otherwise."""
    first, checked = _rowhash.gather(columns, rows, outs, bits, expected, verified)
    return first, checked


def algorithm_of(version: int) -> str:
    """The checksum a manifest of format ``version`` stores."""
    return CRC32 if version == 1 else XXH3


def _crc32(chunks: Iterable[Buffer]) -> int:
    crc = 0
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    return crc


def _xxh3(chunks: Iterable[Buffer]) -> int:
    h = xxhash.xxh3_64()  # streaming gives the digest of the concatenated bytes
    for chunk in chunks:
        h.update(chunk)
    return h.intdigest()


def chunks_checksum(chunks: Iterable[Buffer], algorithm: str = XXH3) -> int:
    """The checksum of a record given its fields' bytes in manifest order."""
    return _xxh3(chunks) if algorithm == XXH3 else _crc32(chunks)


def record_checksum(record: Mapping[str, np.ndarray], fields: Iterable[str],
                    algorithm: str = XXH3) -> int:
    """The checksum of one record, fields in ``fields``' (the manifest's) order."""
    return chunks_checksum((np.ascontiguousarray(record[name]).data for name in fields), algorithm)


def batch_checksums(batch: Mapping[str, Any], fields: Mapping[str, Any], n: int,
                    algorithm: str = XXH3) -> np.ndarray:
    """Each record's checksum (uint64) over a batch of ``n`` records read in one go.

    Fixed fields only (the fast path): the records' bytes as one (records, bytes) table (the
    field itself where there is one, else its columns side by side), hashed by
    :func:`rows_checksums`; natively, the columns as they are, without that table."""
    if not n:
        return np.zeros(0, dtype=np.uint64)
    native = NATIVE_ROWS and algorithm == XXH3
    if any(f.variable for f in fields.values()):
        parts = [list(map(np.ascontiguousarray, batch[name])) if field.variable
                 else _byte_rows(np.asarray(batch[name]), n) for name, field in fields.items()]
        if native:
            return _native_rows(parts, n)
        return np.fromiter((chunks_checksum((part[j] for part in parts), algorithm)
                            for j in range(n)), dtype=np.uint64, count=n)
    columns = [_byte_rows(np.asarray(batch[name]), n) for name in fields]
    if native:
        return _native_rows(columns, n)
    return rows_checksums(columns[0] if len(columns) == 1 else np.concatenate(columns, axis=1),
                          algorithm)


def rows_checksums(table: np.ndarray, algorithm: str = XXH3) -> np.ndarray:
    """The checksum (uint64) of each row of ``table``, a (records, bytes) uint8 array whose row
    ``j`` is record ``j``'s bytes in manifest order.

    Natively, one call for the table; else one native hash call per row, driven from C (``map``
    over the table's rows): no Python bytecode runs per record."""
    if not len(table):
        return np.zeros(0, dtype=np.uint64)
    if NATIVE_ROWS and algorithm == XXH3:
        return _native_rows([_byte_rows(table, len(table))], len(table))
    digest = xxhash.xxh3_64_intdigest if algorithm == XXH3 else zlib.crc32
    return np.fromiter(map(digest, np.ascontiguousarray(table)), dtype=np.uint64,
                       count=len(table))


@dataclass(frozen=True)
class EntryChecks:
    """Where a record's per-entry checksums are (see the module's docstring): ``field`` holds K
    uint64 values, one per entry of the fields ``entries_of`` (each K on its first axis);
    ``shared`` are the record's other fields, hashed with every entry."""

    field: str
    entries_of: tuple[str, ...]
    shared: tuple[str, ...]
    count: int  # K

    @classmethod
    def over(cls, field: str, entries_of: Iterable[str], names: Iterable[str],
             count: int) -> EntryChecks:
        """Entry checks in ``field`` of ``entries_of``, every other of the record's field
        ``names`` (in their order) shared."""
        entries = tuple(entries_of)
        return cls(field, entries, tuple(n for n in names if n != field and n not in entries),
                   count)

    @classmethod
    def declared(cls, fields: Mapping[str, Any]) -> EntryChecks | None:
        """The entry checks a manifest's ``fields`` declare (a field's ``checks_entries_of``),
        or None. The declaration itself is checked by :func:`packdata.manifest.check_manifest`."""
        for name, field in fields.items():
            if field.checks_entries_of:
                return cls.over(name, field.checks_entries_of, fields, int(field.shape[0]))
        return None

    def selects_one_entry(self, select: Mapping[str, Any] | None) -> bool:
        """Whether ``select`` picks the same entry of every entry field per record (as the
        point-cloud kind does): a read that entry checksums can check."""
        if not select or set(select) != set(self.entries_of):
            return False
        first, *others = (np.asarray(select[name]) for name in self.entries_of)
        return all(np.array_equal(first, other) for other in others)


#: records' bytes laid side by side at a time for entry checksums: a table that stays in the
#: CPU's caches while it is hashed (a whole batch of point-cloud variants does not)
ENTRY_TABLE_BYTES = 1 << 20


def entry_checksums(batch: Mapping[str, Any], checks: EntryChecks, n: int,
                    one_entry: bool = False) -> np.ndarray:
    """The entry checksums (uint64) of ``n`` records read in one go: (n, K) where ``batch``
    holds every entry, or (n,) with ``one_entry``, where it holds one entry of each record (a
    read through ``select``). Fixed fields only (:func:`packdata.manifest.check_manifest`
    refuses entry checks beside a variable field). Natively, each entry of the whole batch in
    one call, from the fields where they lie; else records are hashed a few at a time, each
    entry's bytes laid after the shared fields' (:data:`ENTRY_TABLE_BYTES`)."""
    entries = [None] if one_entry else range(checks.count)
    out = np.empty((n, len(entries)), dtype=np.uint64)
    shared = [np.asarray(batch[name]) for name in checks.shared]
    entry_fields = [np.asarray(batch[name]) for name in checks.entries_of]
    row = sum(a[:1].nbytes for a in shared) + sum(
        (a[:1] if one_entry else a[:1, 0]).nbytes for a in entry_fields)
    step = max(1, n) if NATIVE_ROWS else max(1, ENTRY_TABLE_BYTES // max(row, 1))
    for a in range(0, n, step):
        b = min(n, a + step)
        head = [_byte_rows(v[a:b], b - a) for v in shared]
        for column, k in enumerate(entries):
            tail = [_byte_rows(v[a:b] if k is None else v[a:b, k], b - a) for v in entry_fields]
            out[a:b, column] = _native_rows(head + tail, b - a) if NATIVE_ROWS else \
                rows_checksums(np.concatenate(head + tail, axis=1))
    return out[:, 0] if one_entry else out


def _byte_rows(values: np.ndarray, n: int) -> np.ndarray:
    """``values`` as ``n`` uint8 rows, one per record: a view where each row's bytes lie in
    order (a whole record, or one entry of it), else a copy."""
    rows = values.reshape(n, -1)
    if rows.strides[1] != rows.itemsize:
        rows = np.ascontiguousarray(rows)
    return rows.view(np.uint8)
