"""LMDB container: one value per record, laid out so a batch of values becomes one array.

Layout (readable with plain ``lmdb``):

- key ``b"%010d" % i`` → record ``i``: the fixed fields' raw bytes in manifest order, then one
  little-endian uint64 row count per variable field, then the variable fields' raw bytes;
- key ``b"__lengths__/<field>"`` → the row counts of a variable field for all records (int64);
- key ``b"__manifest__"`` → the manifest JSON;
- ``records.npz`` beside ``data.mdb`` → the record keys and checksums (:mod:`packdata.recordmeta`,
  format version 2), uncompressed and mapped in place: LMDB's own ``get`` of a large value maps
  all its pages, which would make opening cost memory in proportion to the records;
- key ``b"__offsets__"`` (fixed-size records only, where found): each record's byte offset in
  data.mdb (int64), so a reader's :class:`RecordMap` is whole from the start.

LMDB values live in a memory map, so reads copy nothing until the batch is assembled.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from packdata.containers.base import (
    Batch,
    Reader,
    Select,
    ShardClosed,
    Writer,
    apply_select,
    attach_record_file,
    gather_rows,
    same_destination,
)
from packdata.containers.lmdbcheck import check_tree
from packdata.containers.lmdbmap import OFFSETS_KEY, RecordMap, record_key, record_offsets
from packdata.errors import DatasetError
from packdata.manifest import Field, Manifest, check_manifest
from packdata.recordmeta import save_npz

NAME = "lmdb"
NEW_SUFFIX = ".lmdb"
SUFFIXES = (".lmdb",)
MANIFEST_KEY = b"__manifest__"
MAP_SIZE = 1 << 40  # address space only; the file grows with the data
COMMIT_BYTES = 64 << 20
#: records per write transaction at most: LMDB holds a transaction's pages in memory, and small
#: records take several times their size in pages (key, node header, page slack)
COMMIT_RECORDS = 1 << 15


def lengths_key(name: str) -> bytes:
    return b"__lengths__/" + name.encode()


RECORDS = "records.npz"


class LMDBWriter(Writer):
    def __init__(
        self, path: Path, fields: dict[str, Field], options: dict[str, Any],
        on_shard_closed: ShardClosed | None = None,
    ) -> None:
        super().__init__(path, fields, options, on_shard_closed)
        self.env = lmdb.open(str(path), map_size=MAP_SIZE, subdir=True, sync=False)
        self.txn = self.env.begin(write=True)
        self.pending = self.pending_records = 0
        self.fixed = [n for n, f in fields.items() if not f.variable]
        self.variable = [n for n, f in fields.items() if f.variable]
        self.rows = {n: array("q") for n in self.variable}  # 8 bytes a record

    def append(self, key: str, record: dict[str, np.ndarray]) -> None:
        parts = [np.ascontiguousarray(record[n]).tobytes() for n in self.fixed]
        if self.variable:
            counts = [len(record[n]) for n in self.variable]
            for n, c in zip(self.variable, counts):
                self.rows[n].append(c)
            parts.append(np.asarray(counts, dtype="<u8").tobytes())
            parts.extend(np.ascontiguousarray(record[n]).tobytes() for n in self.variable)
        value = b"".join(parts)
        self.txn.put(record_key(self.count), value, append=True)
        self.count += 1
        self.pending += len(value)
        self.pending_records += 1
        if self.pending >= COMMIT_BYTES or self.pending_records >= COMMIT_RECORDS:
            self.txn.commit()
            self.txn = self.env.begin(write=True)
            self.pending = self.pending_records = 0

    def append_rows(self, keys: Sequence[str], rows: np.ndarray) -> None:
        if self.variable:  # rows hold fixed fields only: never the case, but stay correct
            return super().append_rows(keys, rows)
        # a row is exactly this layout's value (fixed fields' bytes in order): put as it lies
        width = rows.shape[1]
        flat = memoryview(np.ascontiguousarray(rows)).cast("B")
        first = self.count
        self.txn.cursor().putmulti(
            [(record_key(first + j), flat[j * width : (j + 1) * width]) for j in range(len(rows))],
            append=True)
        self.count += len(rows)
        self.pending += rows.nbytes
        self.pending_records += len(rows)
        if self.pending >= COMMIT_BYTES or self.pending_records >= COMMIT_RECORDS:
            self.txn.commit()
            self.txn = self.env.begin(write=True)
            self.pending = self.pending_records = 0

    def finish(self, manifest: Manifest) -> None:
        self.txn.commit()  # the records' pages are where they stay: later writes copy others
        self.txn = self.env.begin(write=True)
        offsets = None if self.variable else record_offsets(
            self.path, self.env, self.count, sum(f.nbytes for f in self.fields.values()))
        if offsets is not None:
            self.txn.put(OFFSETS_KEY, memoryview(offsets).cast("B"))
        for n in self.variable:
            lengths = np.frombuffer(self.rows[n], dtype=np.int64).astype("<i8", copy=False)
            self.txn.put(lengths_key(n), memoryview(lengths).cast("B"))  # no copies of ours
        save_npz(self.path / RECORDS, manifest.record_arrays())
        self.txn.put(MANIFEST_KEY, manifest.to_json().encode())
        self.txn.commit()
        self.env.sync(True)
        self.env.close()

    def abort(self) -> None:
        self.txn.abort()
        self.env.close()


# LMDB refuses a second open of the same files in one process (it knows them by device and
# inode, whatever the path: a dataset renamed into place is the same files), so readers share an
# environment per file; an entry made before a fork is closed and replaced in the child, and so
# is one whose file was replaced (a dataset converted again with --overwrite may get the same
# inode number back: its size and modification time tell it apart). Entries for files no
# longer at their path (deleted, replaced) are closed before another environment opens: LMDB
# also refuses files whose device and inode numbers an open environment's deleted files had.
_envs: dict[tuple[int, int], tuple[int, tuple[int, int], lmdb.Environment, str]] = {}


#: the files whose B-tree :func:`check_tree` found sound: (device, inode), (size, mtime)
_checked: set[tuple[tuple[int, int], tuple[int, int]]] = set()


def _close_stale_envs() -> None:
    """Close the environments whose ``data.mdb`` is no longer at their path."""
    for key, (_, _, env, where) in list(_envs.items()):
        try:
            st = os.stat(Path(where) / "data.mdb")
            current = (st.st_dev, st.st_ino) == key
        except OSError:
            current = False
        if not current:
            del _envs[key]
            env.close()


def shared_env(path: Path) -> lmdb.Environment:
    """This process's read-only environment for the LMDB at ``path``."""
    st = os.stat(path / "data.mdb")
    key, pid, version = (st.st_dev, st.st_ino), os.getpid(), (st.st_size, st.st_mtime_ns)
    entry = _envs.pop(key, None)
    if entry is not None and entry[:2] == (pid, version):
        _envs[key] = entry
        return entry[2]
    if entry is not None:
        entry[2].close()
    _close_stale_envs()
    try:
        env = lmdb.open(
            str(path), readonly=True, lock=False, readahead=False, subdir=True, max_readers=1024
        )
    except lmdb.Error as exc:
        raise DatasetError(f"{path}: LMDB cannot be opened ({exc}); the dataset is damaged") from None
    # LMDB maps the file and trusts its page count: reading past the end of a truncated file
    # would kill the process with SIGBUS instead of raising
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    if st.st_size < needed:
        env.close()
        raise DatasetError(f"{path}: truncated (data.mdb holds {st.st_size} bytes, its pages need "
                           f"{needed}); the dataset is damaged")
    if (key, version) not in _checked:  # once per file version: the result survives fork
        try:
            check_tree(path, env.info()["last_pgno"], env.info()["last_txnid"])
        except DatasetError:
            env.close()
            raise
        _checked.add((key, version))
    _envs[key] = (pid, version, env, str(path))
    return env


class LMDBReader(Reader):
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.env = shared_env(self.path)
        try:
            self._open()
        except lmdb.Error as exc:  # a damaged B-tree: LMDB's message, with the path in front
            raise DatasetError(f"{self.path}: LMDB cannot be read ({type(exc).__name__}: {exc}); "
                               "the dataset is damaged") from None

    def _open(self) -> None:
        with self.env.begin() as txn:
            raw = txn.get(MANIFEST_KEY)
            if raw is None:
                raise DatasetError(f"{self.path}: LMDB has no packdata manifest")
            self.manifest = Manifest.from_json(raw, str(self.path))
            if self.manifest.version >= 2:
                attach_record_file(self.manifest, self.path / RECORDS)  # checks the header
            check_manifest(self.manifest, self.path)
            self._lengths = {
                n: _lengths(txn, self.path, n, self.manifest.count)
                for n in self.manifest.variable_fields
            }
            self._check_layout(txn)
        self._record_map: RecordMap | bool = False
        self._record_map_pid = -1
        fixed = self.manifest.fixed_fields
        self.fixed_bytes = sum(f.nbytes for f in fixed.values())
        self.columns: list[tuple[str, Field, int, int]] = []  # name, field, start, end (bytes)
        start = 0
        for name, field in fixed.items():
            self.columns.append((name, field, start, start + field.nbytes))
            start += field.nbytes

    def _check_layout(self, txn: lmdb.Transaction) -> None:
        """The records the manifest promises, and no more: one entry per record plus the
        manifest and the length tables; the first and last record of the right size."""
        m, where = self.manifest, self.path
        expected = m.count + len(m.variable_fields) + 1 + (txn.get(OFFSETS_KEY) is not None)
        entries = self.env.stat()["entries"]
        if entries != expected:
            raise DatasetError(f"{where}: LMDB holds {entries} entries, the manifest's {m.count} "
                               f"records need {expected}; the dataset is damaged")
        fixed = sum(f.nbytes for f in m.fixed_fields.values())
        for i in {0, m.count - 1} if m.count else ():
            value = txn.get(record_key(i))
            if value is None:
                raise DatasetError(f"{where}: record {i} is missing; the dataset is damaged")
            size = fixed + 8 * len(m.variable_fields) + sum(
                int(self._lengths[n][i]) * int(np.prod(f.row_shape, dtype=np.int64))
                * f.np_dtype.itemsize for n, f in m.variable_fields.items())
            if len(value) != size:
                raise DatasetError(f"{where}: record {i} holds {len(value)} bytes, its fields "
                                   f"{size}; the dataset is damaged (or the manifest edited)")

    @staticmethod
    def detect(path: Path) -> bool:
        if not (path / "data.mdb").is_file():
            return False
        try:
            with shared_env(path).begin() as txn:
                raw = txn.get(MANIFEST_KEY)
                return raw is not None and Manifest.is_packdata(raw)
        except lmdb.Error as exc:
            raise DatasetError(f"{path}: LMDB cannot be read ({type(exc).__name__}: {exc}); "
                               "the dataset is damaged") from None

    def read(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        try:
            return apply_select(self._read(indices), select)  # LMDB copies whole values anyway
        except lmdb.Error as exc:  # a damaged B-tree found by a lookup: name the dataset
            raise DatasetError(f"{self.path}: LMDB cannot be read ({type(exc).__name__}: {exc}); "
                               "the dataset is damaged") from None

    def _read(self, indices: np.ndarray) -> Batch:
        idx = self.check_indices(indices)
        if not self.manifest.variable_fields:
            located = self._located()
            if located is not None:  # each field gathered straight from the file: one copy
                offsets = located.locate(idx)
                return {name: located.column(a, b)[offsets].view(field.np_dtype).reshape(
                            len(idx), *field.shape) for name, field, a, b in self.columns}
        return self._lookup(idx)

    def read_into(self, indices: np.ndarray, out: dict[str, np.ndarray]) -> Batch:
        whole = set(out) == set(self.manifest.fixed_fields) and not self.manifest.variable_fields
        try:
            located = self._located() if whole else None
            if located is None:
                return super().read_into(indices, out)
            offsets = located.locate(self.check_indices(indices))
        except lmdb.Error as exc:
            raise DatasetError(f"{self.path}: LMDB cannot be read ({type(exc).__name__}: {exc}); "
                               "the dataset is damaged") from None
        return {name: gather_rows(located.column(a, b), offsets, out[name])
                for name, _, a, b in self.columns}

    def _lookup(self, idx: np.ndarray) -> Batch:
        """Records ``idx`` (checked) looked up key by key."""
        keys = [b"%010d" % i for i in idx.tolist()]  # per batch: opening stays flat in records
        with self.env.begin(buffers=True) as txn:
            get = txn.get
            values = [get(k) for k in keys]
            if None in values:
                self._missing(idx[values.index(None)])
            if self.manifest.variable_fields:
                return self._split_variable(values)
            # all records have the same size: one join makes the whole batch one (writable) array
            flat = np.frombuffer(bytearray().join(values), dtype=np.uint8)
        return self._columns(flat.reshape(len(keys), self.fixed_bytes))

    def _columns(self, table: np.ndarray) -> Batch:
        return {
            name: np.ascontiguousarray(table[:, a:b]).view(field.np_dtype).reshape(
                len(table), *field.shape
            )
            for name, field, a, b in self.columns
        }

    def _missing(self, index: int) -> None:
        raise DatasetError(f"{self.path}: record {index} is missing; the dataset is damaged")

    def _located(self) -> RecordMap | None:
        """This process's map of where each record's bytes lie in data.mdb, or None where
        records cannot be located (then every read looks each key up)."""
        if self._record_map_pid != os.getpid():
            self._record_map = RecordMap.open(self.path, self.env, self.fixed_bytes,
                                              self.manifest.count, self._missing)
            self._record_map_pid = os.getpid()
        return self._record_map or None

    def _split_variable(self, values: list) -> Batch:
        variable = self.manifest.variable_fields
        nvar = len(variable)
        head = self.fixed_bytes + 8 * nvar
        table = np.empty((len(values), head), dtype=np.uint8)
        pieces: dict[str, list[np.ndarray]] = {n: [] for n in variable}
        for j, v in enumerate(values):
            buf = np.frombuffer(v, dtype=np.uint8)
            table[j] = buf[:head]
            counts = buf[self.fixed_bytes : head].view("<u8")
            pos = head
            for (name, field), rows in zip(variable.items(), counts.tolist()):
                nbytes = rows * int(np.prod(field.row_shape, dtype=np.int64)) * field.np_dtype.itemsize
                pieces[name].append(buf[pos : pos + nbytes].copy())
                pos += nbytes
        batch: Batch = {
            name: np.ascontiguousarray(table[:, a:b]).view(field.np_dtype).reshape(
                len(values), *field.shape
            )
            for name, field, a, b in self.columns
        }
        for name, field in variable.items():
            batch[name] = [p.view(field.np_dtype).reshape(-1, *field.row_shape) for p in pieces[name]]
        return batch

    def lengths(self, name: str) -> np.ndarray:
        self.check_variable(name)
        return self._lengths[name]

    def close(self) -> None:
        pass  # the environment is shared by this process's readers (see shared_env)


WRITER = LMDBWriter
READER = LMDBReader
detect = LMDBReader.detect
destination = same_destination


def _lengths(txn: lmdb.Transaction, where: Path, name: str, count: int) -> np.ndarray:
    raw = txn.get(lengths_key(name))
    if raw is None or len(raw) != 8 * count:
        raise DatasetError(f"{where}: the length table of '{name}' does not hold {count} "
                           "records; the dataset is damaged")
    lengths = np.frombuffer(raw, dtype="<i8")
    if count and lengths.min() < 0:
        raise DatasetError(f"{where}: negative lengths in '{name}'; the dataset is damaged")
    return lengths
