"""LMDB container: one value per record, laid out so a batch of values becomes one array.

Layout (readable with plain ``lmdb``):

- key ``b"%010d" % i`` → record ``i``: the fixed fields' raw bytes in manifest order, then one
  little-endian uint64 row count per variable field, then the variable fields' raw bytes;
- key ``b"__lengths__/<field>"`` → the row counts of a variable field for all records (int64);
- key ``b"__manifest__"`` → the manifest JSON;
- ``records.npz`` beside ``data.mdb`` → the record keys and checksums (:mod:`packdata.recordmeta`,
  format version 2), uncompressed and mapped in place: LMDB's own ``get`` of a large value maps
  all its pages, which would make opening cost memory in proportion to the records;
- key ``b"__offsets__"`` (where found): each record's byte offset in data.mdb (int64).

A reader looks up the few keys it needs itself (:class:`Tree`: only the pages on each key's
path are read, each bounded) and reads records at their stored offsets from its own map of
data.mdb, so opening costs the same whatever the number of records and no damaged page can make
a read leave the file. Datasets without stored offsets are read through LMDB's lookups, once
:func:`check_tree` has walked their whole tree.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from packdata import checksum
from packdata.containers import lmdbenv
from packdata.containers.base import (
    Batch,
    Reader,
    RowSources,
    Select,
    ShardClosed,
    Writer,
    apply_select,
    attach_record_file,
    same_destination,
    selected_entries,
)
from packdata.containers.lmdbcheck import Tree
from packdata.containers.lmdbenv import MANIFEST_KEY, RECORDS, checked_env, shared_env, shared_tree
from packdata.containers.lmdbmap import (
    OFFSETS_KEY,
    RecordMap,
    StoredMap,
    record_key,
    write_offsets,
)
from packdata.containers.plan import BatchPlan
from packdata.errors import DatasetError
from packdata.manifest import Field, Manifest, check_manifest
from packdata.spooling import ColumnSpool, save_npz

NAME = "lmdb"
NEW_SUFFIX = ".lmdb"
SUFFIXES = (".lmdb",)
MAP_SIZE = 1 << 40  # address space only; the file grows with the data
COMMIT_BYTES = 64 << 20
#: records per write transaction at most: LMDB holds a transaction's pages in memory, and small
#: records take several times their size in pages (key, node header, page slack)
COMMIT_RECORDS = 1 << 15


def lengths_key(name: str) -> bytes:
    return b"__lengths__/" + name.encode()



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
        # each record's row count of each variable field, spooled beside the data (removed
        # before the manifest is written): memory stays flat in the records
        self.rows = {n: ColumnSpool(path / f".{n}.rows.spool", "<i8") for n in self.variable}

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
        self.txn.commit()
        self.txn = self.env.begin(write=True)
        if self.count:  # room for the offsets (zeros from calloc: no pages of ours touched),
            # written once no record moves any more
            self.txn.put(OFFSETS_KEY, memoryview(np.zeros(self.count, "<i8")).cast("B"))
        lengths = [rows.finish() for rows in self.rows.values()]  # mapped, no copy
        for n, rows in zip(self.rows, lengths):
            self.txn.put(lengths_key(n), memoryview(rows).cast("B"))
        self.txn.put(MANIFEST_KEY, manifest.to_json().encode())
        self.txn.commit()
        offsets = write_offsets(self.path, self.env, self.count) if self.count else None
        if self.count and offsets is None:
            with self.env.begin(write=True) as txn:
                txn.delete(OFFSETS_KEY)
        # the record arrays and the checksums of their blocks, and of the offsets and length
        # tables as stored (in the order the reader lists them: LMDBReader.tables)
        tables = ([] if offsets is None else [offsets]) + lengths
        save_npz(self.path / RECORDS, manifest.record_arrays(tables))
        for rows in self.rows.values():
            rows.remove()
        self.env.sync(True)
        self.env.close()

    def abort(self) -> None:
        self.txn.abort()
        self.env.close()
        for rows in self.rows.values():
            rows.remove()


class LMDBReader(Reader):
    GATHERS_ROWS = True

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.env = shared_env(self.path)
        tree = shared_tree(self.path)
        raw = tree.get(MANIFEST_KEY)
        if raw is None:
            raise DatasetError(f"{self.path}: LMDB has no packdata manifest")
        m = self.manifest = Manifest.from_json(raw.tobytes(), str(self.path))
        if m.version >= 2:
            attach_record_file(m, self.path / RECORDS, self.tables(tree))  # checks the header
        check_manifest(m, self.path)
        self._lengths = {n: _lengths(tree, self.path, n, m.count) for n in m.variable_fields}
        self._sane_lengths: set[str] = set()
        fixed = m.fixed_fields
        self.fixed_bytes = sum(f.nbytes for f in fixed.values())
        self.columns: list[tuple[str, Field, int, int]] = []  # name, field, start, end (bytes)
        start = 0
        for name, field in fixed.items():
            self.columns.append((name, field, start, start + field.nbytes))
            start += field.nbytes
        self.row_bytes = {n: int(np.prod(f.row_shape, dtype=np.int64)) * f.np_dtype.itemsize
                          for n, f in m.variable_fields.items()}
        self._stored = self._check_layout(tree)
        if self._stored is None:  # read through LMDB's lookups: its whole tree checked first
            checked_env(self.path)
        self._record_map: RecordMap | bool = False
        self._record_map_pid = -1
        self._plan: BatchPlan | None = None

    def tables(self, tree: Tree) -> dict[str, tuple[np.ndarray, bool]]:
        """The per-record tables LMDB keeps (the offsets, where stored; the length tables), in
        the order of their blocks' checksums (format 3), each a view of data.mdb."""
        found = {"__offsets__": tree.get(OFFSETS_KEY),
                 **{lengths_key(n).decode(): tree.get(lengths_key(n))
                    for n in self.manifest.variable_fields}}
        return {name: (raw.view("<i8") if len(raw) % 8 == 0 else raw, True)
                for name, raw in found.items() if raw is not None}

    def _size(self, i: int) -> int:
        """Bytes of record ``i``'s value, from its fields and length tables."""
        return self.fixed_bytes + 8 * len(self.row_bytes) + sum(
            int(self._lengths[n][i]) * b for n, b in self.row_bytes.items())

    def _check_layout(self, tree: Tree) -> StoredMap | None:
        """The records the manifest promises, and no more: one entry per record plus the
        manifest, the length tables and the offsets; the first and last record of the right
        size. The map of the stored offsets where they hold (the first and last record where
        the tree has them: a compacted copy moves records), else None."""
        m, where = self.manifest, self.path
        offsets = tree.get(OFFSETS_KEY)
        expected = m.count + len(m.variable_fields) + 1 + (offsets is not None)
        entries = self.env.stat()["entries"]
        if entries != expected:
            raise DatasetError(f"{where}: LMDB holds {entries} entries, the manifest's {m.count} "
                               f"records need {expected}; the dataset is damaged")
        stored = offsets is not None and len(offsets) == 8 * m.count and m.count > 0
        for i in {0, m.count - 1} if m.count else ():
            found = tree.locate(record_key(i))
            if found is None:
                raise DatasetError(f"{where}: record {i} is missing; the dataset is damaged")
            size = self._size(i)
            if found[1] != size:
                raise DatasetError(f"{where}: record {i} holds {found[1]} bytes, its fields "
                                   f"{size}; the dataset is damaged (or the manifest edited)")
            stored = stored and int(offsets[8 * i : 8 * i + 8].view("<i8")[0]) == found[0]
        return StoredMap(where, tree.whole, offsets.view("<i8"), self._size(0)) if stored else None

    @staticmethod
    def detect(path: Path) -> bool:
        if not (path / "data.mdb").is_file():
            return False
        raw = shared_tree(path).get(MANIFEST_KEY)
        return raw is not None and Manifest.is_packdata(raw.tobytes())

    def read_records(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        try:
            idx = self.check_indices(indices)
            batch = self.read_gathered(idx, select)  # fixed-size records located: one gather
            if batch is not None:
                return batch
            if self.row_bytes and self._stored is not None:
                batch = self._read_stored(idx)
            else:
                batch = self._lookup(idx)  # lookups copy whole values
            return apply_select(batch, select, self.manifest.fields)
        except lmdb.Error as exc:  # a damaged B-tree found by a lookup: name the dataset
            raise DatasetError(f"{self.path}: LMDB cannot be read ({type(exc).__name__}: {exc}); "
                               "the dataset is damaged") from None

    def batch_plan(self) -> BatchPlan | None:
        # fixed-size records at the offsets conversion stored: a damaged offset is a row outside
        # the file, which the gather refuses
        stored = self._stored
        if (self._plan is None and stored is not None and checksum.NATIVE_ROWS
                and not self.row_bytes):
            self._plan = BatchPlan(
                self.manifest.fields,
                [(name, stored.column(a, b), stored.offsets) for name, _, a, b in self.columns],
                self.check_indices, f"{self.path}: a record lies outside data.mdb; the dataset "
                "is damaged")
        return self._plan

    def _read_stored(self, idx: np.ndarray) -> Batch:
        """Variable-size records ``idx`` (checked) read at their stored offsets."""
        stored, head = self._stored, self.fixed_bytes + 8 * len(self.row_bytes)
        rows = {n: self._lengths[n][idx].astype(np.int64) for n in self.row_bytes}
        sizes: np.ndarray | int = head
        for name, r in rows.items():
            if len(r) and (r.min() < 0 or r.max() > len(stored.whole)):
                raise DatasetError(f"{self.path}: the length table of '{name}' holds lengths "
                                   "outside the file; the dataset is damaged")
            sizes = sizes + r * self.row_bytes[name]
        offsets = stored.locate(idx, sizes)
        table = stored.column(0, head)[offsets]  # one gather: the fixed fields and row counts
        batch = self._columns(table)
        counts = table[:, self.fixed_bytes :].copy().view("<u8").astype(np.int64)
        if not np.array_equal(counts, np.stack(list(rows.values()), axis=1)):
            raise DatasetError(f"{self.path}: a record's row counts differ from the length "
                               "tables; the dataset is damaged")
        whole, starts = stored.whole, offsets + head
        for name, field in self.manifest.variable_fields.items():
            ends = starts + rows[name] * self.row_bytes[name]
            batch[name] = [whole[a:b].copy().view(field.np_dtype).reshape(-1, *field.row_shape)
                           for a, b in zip(starts.tolist(), ends.tolist())]
            starts = ends
        return batch

    def row_sources(self, idx: np.ndarray, select: Select | None = None) -> RowSources | None:
        if self.manifest.variable_fields:
            return None
        try:
            located = self._fixed_map()
            if located is None:
                return None
            offsets = located.locate(idx)
        except lmdb.Error as exc:
            raise DatasetError(f"{self.path}: LMDB cannot be read ({type(exc).__name__}: {exc}); "
                               "the dataset is damaged") from None
        sources: RowSources = []
        for name, field, a, b in self.columns:
            if select and name in select:  # only the selected entries' bytes are gathered
                entries = selected_entries(select, name, field, len(idx))
                part = (b - a) // field.shape[0]  # bytes of one entry: entry k is at a + k * part
                sources.append((name, located.column(a, a + part), offsets + entries * part))
            else:
                sources.append((name, located.column(a, b), offsets))
        return sources

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

    def _fixed_map(self) -> StoredMap | RecordMap | None:
        """Where each fixed-size record lies: the stored offsets, else a :class:`RecordMap`."""
        return self._located() if self._stored is None else self._stored

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
        lengths = self._lengths[name]
        if name not in self._sane_lengths:  # all of them asked for: checked all at once
            if len(lengths) and lengths.min() < 0:
                raise DatasetError(f"{self.path}: negative lengths in '{name}'; the dataset is "
                                   "damaged")
            self._sane_lengths.add(name)
        return lengths

    def close(self) -> None:
        pass  # the environment is shared by this process's readers (see shared_env)


WRITER = LMDBWriter
READER = LMDBReader
detect = LMDBReader.detect
destination = same_destination
damaged = lmdbenv.damaged



def _lengths(tree: Tree, where: Path, name: str, count: int) -> np.ndarray:
    """The length table of ``name``: a view of the file, its values checked where they are used
    (a batch's, or all of them by :meth:`LMDBReader.lengths`): opening reads none of them."""
    raw = tree.get(lengths_key(name))
    if raw is None or len(raw) != 8 * count:
        raise DatasetError(f"{where}: the length table of '{name}' does not hold {count} "
                           "records; the dataset is damaged")
    return raw.view("<i8")
