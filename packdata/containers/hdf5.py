"""HDF5 container: one contiguous dataset per field, read back through a memory map.

Layout (readable with plain h5py):

- ``/<field>``: a contiguous, uncompressed dataset of shape ``(count, *shape)`` for a fixed field;
  for a variable-length field, the rows of all records concatenated, shape ``(total_rows, *row)``,
  with ``/<field>_offsets`` (``count + 1`` int64) marking where record ``i`` starts and ends;
- ``/manifest``: the manifest JSON as a scalar fixed-length byte string (UTF-8);
- ``/__records__/<array>``: the record keys and checksums (:mod:`packdata.recordmeta`),
  contiguous, read through the same memory map (format version 2).

Contiguous layout is what makes the fast path possible: the byte offset of each dataset is known,
so a batch is one numpy gather from a memory map, with no HDF5 call per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from packdata import checksum
from packdata.blockchecks import TABLE
from packdata.containers import hdf5layout
from packdata.containers.base import (
    Batch,
    Reader,
    RowSources,
    Select,
    ShardClosed,
    Writer,
    columns_of,
    gather_rows,
    same_destination,
    selected_entries,
)
from packdata.containers.hdf5files import abandon, plain_errors
from packdata.containers.hdf5layout import (
    MANIFEST,
    RECORDS,
    check_field,
    check_rows,
    layout_of,
    mapped,
    offsets_name,
    record_offsets,
    view_of,
)
from packdata.containers.hdf5place import HDF5Placing
from packdata.containers.joined import map_kept
from packdata.containers.plan import BatchPlan
from packdata.containers.spool import BLOCK_BYTES, Spool
from packdata.errors import DatasetError, PackdataError
from packdata.manifest import HEADER_HASH, Field, Manifest, check_manifest
from packdata.recordmeta import DTYPES
from packdata.spooling import copy_blocks

if TYPE_CHECKING:
    import h5py
# h5py itself is imported where a file is opened: packdata.open of a tar or LMDB dataset asks
# every container whether the path is its own, and a process that never opens an HDF5 file (a
# spawned worker, a DDP rank) should not pay h5py's import in time and memory

NAME = "hdf5"
NEW_SUFFIX = ".h5"
SUFFIXES = (".h5", ".hdf5")
BLOCK = 1 << 18  # array entries written at a time (2 MiB of int64)


class HDF5Writer(HDF5Placing, Writer):
    """Fields spooled to files and copied into the HDF5 file at the end; or, given the record
    count (:meth:`expect`) and the rows of variable-length fields, written into datasets made at
    that size while the records fit them, here or by the workers that load them (:meth:`place`)."""

    LAYS_OUT_ROWS = True

    def __init__(self, path: Path, fields: dict[str, Field], options: dict[str, Any],
                 on_shard_closed: ShardClosed | None = None) -> None:
        super().__init__(path, fields, options, on_shard_closed)
        self.spools = {name: Spool(path.with_name(f"{path.name}.{name}.spool"), field)
                       for name, field in fields.items()}
        self.file: h5py.File | None = None  # while records go straight into it
        self.datasets: dict[str, h5py.Dataset] = {}
        self.expected = 0
        #: variable fields written in place: rows taken so far, their offsets datasets, and
        #: the ends of the records appended since the last flush
        self.rows: dict[str, int] = {}
        self.offsets: dict[str, h5py.Dataset] = {}
        self.ends: dict[str, list[int]] = {}
        #: records appended one by one, in place: each field's values since the last flush
        #: (written a block at a time: an h5py write per record and field costs more than
        #: the bytes), and where that block starts (record, and rows of variable fields)
        self.pending: dict[str, list[np.ndarray]] = {name: [] for name in fields}
        self.pending_bytes = 0
        self.flushed = 0
        self.flushed_rows: dict[str, int] = {}
        #: every h5py object made in the file, kept until the file is closed (see hdf5files.abandon)
        self.made: list[h5py.Dataset] = []

    def expect(self, count: int, rows: dict[str, int] | None = None) -> None:
        variable = [name for name, f in self.fields.items() if f.variable]
        if count <= 0 or self.count or any(name not in (rows or {}) for name in variable):
            return
        import h5py

        with plain_errors():
            self.file = h5py.File(self.path, "w", track_order=True)
            for name, f in self.fields.items():
                if f.variable:  # as finish() lays them out: the offsets, then the rows
                    self.offsets[name] = self._dataset(
                        offsets_name(name), shape=(count + 1,), dtype=np.int64)
                    self.offsets[name][0] = 0
                    self.rows[name], self.ends[name], self.flushed_rows[name] = 0, [], 0
                shape = (rows[name], *f.row_shape) if f.variable else (count, *f.shape)  # type: ignore[index]
                self.datasets[name] = self._dataset(name, shape=shape, dtype=f.np_dtype)
        self.expected = count

    def _in_place(self, n: int, record: dict[str, np.ndarray] | None = None) -> bool:
        """Whether ``n`` more records (``record``, for variable fields) fit the datasets made by
        :meth:`expect`; if they would overflow them, what was written moves to the spools,
        which take everything from then on (so do records of a placed layout: :meth:`place`)."""
        self.give_up_placement()
        if self.file is None:
            return False
        if self.count + n <= self.expected and all(
                self.rows[name] + len(record[name]) <= len(self.datasets[name])  # type: ignore[index]
                for name in self.rows):
            return True
        self._to_spools()
        return False

    def _flush(self, every: int = 4096) -> None:
        """The records appended one by one since the last flush, written once ``every`` of them
        (or ``BLOCK_BYTES``) are waiting (0: now): one write per field."""
        waiting = self.count - self.flushed
        if not waiting or (waiting < every and self.pending_bytes < BLOCK_BYTES):
            return
        with plain_errors():
            for name, values in self.pending.items():
                if name in self.rows:
                    a = self.flushed_rows[name]
                    self.datasets[name][a : self.rows[name]] = np.concatenate(values)
                    self.offsets[name][self.flushed + 1 : self.count + 1] = self.ends[name]
                    self.flushed_rows[name] = self.rows[name]
                    self.ends[name].clear()
                else:
                    self.datasets[name][self.flushed : self.count] = np.stack(values)
                values.clear()
        self.flushed, self.pending_bytes = self.count, 0

    def _to_spools(self) -> None:
        self._flush(0)
        for name, spool in self.spools.items():
            ds = self.datasets[name]
            if name in self.rows:  # record by record: their rows, from the offsets
                for a in range(0, self.count, BLOCK):
                    ends = self.offsets[name][a : min(a + BLOCK, self.count) + 1]
                    for lo, hi in zip(ends[:-1], ends[1:]):
                        spool.append(ds[lo:hi])
                continue
            step = max(1, BLOCK_BYTES // max(spool.field.nbytes, 1))
            for a in range(0, self.count, step):
                spool.append(ds[a : min(a + step, self.count)])
        with plain_errors():
            self._close()
        self.offsets, self.rows, self.ends = {}, {}, {}
        self.path.unlink()

    def append(self, key: str, record: dict[str, np.ndarray]) -> None:
        if self._in_place(1, record):
            for name, values in self.pending.items():
                value = record[name]
                values.append(value)
                self.pending_bytes += value.nbytes
                if name in self.rows:
                    self.rows[name] += len(value)
                    self.ends[name].append(self.rows[name])
            self.count += 1
            self._flush()
            return
        for name, spool in self.spools.items():
            spool.append(record[name])
        self.count += 1

    def append_rows(self, keys: Sequence[str], rows: np.ndarray) -> None:
        in_place = self._in_place(len(rows))
        if in_place:
            self._flush(0)  # records appended one by one before these
        for name, column in columns_of(rows, self.fields).items():  # one write per field
            if in_place:
                with plain_errors():
                    self.datasets[name][self.count : self.count + len(rows)] = column
            else:
                self.spools[name].append(column)
        self.count += len(rows)
        if in_place:
            self.flushed = self.count

    def finish(self, manifest: Manifest) -> None:
        self.let_go()
        if self.file is not None and (self.count != self.expected or any(
                rows != len(self.datasets[name]) for name, rows in self.rows.items())):
            self._to_spools()  # fewer records than expected (inputs skipped): datasets too long
        if self.file is not None:
            self._flush(0)
            for spool in self.spools.values():
                spool.remove()
            with plain_errors():
                self._finish_file(manifest, list(self.offsets.values()))  # in field order
                self._close()
            return
        import h5py

        tables = []  # the variable fields' offsets: under the block checksums too
        with plain_errors():
            self.file = h5py.File(self.path, "w", track_order=True)
            for name, spool in self.spools.items():
                field = spool.field
                if field.variable:  # offsets block by block from the spooled row counts
                    ends = self._dataset(offsets_name(name), shape=(self.count + 1,),
                                         dtype=np.int64)
                    tables.append(ends)
                    ends[0], total, a = 0, 0, 0
                    for counts in copy_blocks(spool.row_counts(), BLOCK):
                        block = np.cumsum(counts) + total
                        ends[a + 1 : a + 1 + len(block)] = block
                        total, a = int(block[-1]), a + len(block)
                    shape = (total, *field.row_shape)
                else:
                    shape = (self.count, *field.shape)
                ds = self._dataset(name, shape=shape, dtype=field.np_dtype)
                start = 0
                row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * field.np_dtype.itemsize
                for block in spool.blocks(max(row_bytes, 1)):
                    rows = block.view(field.np_dtype).reshape(-1, *shape[1:])
                    ds[start : start + len(rows)] = rows
                    start += len(rows)
                spool.remove()
            self._finish_file(manifest, tables)
            self._close()

    def _dataset(self, name: str, **how: Any) -> h5py.Dataset:
        """A dataset made in the file, kept alive until the file is closed: freeing one of a
        file whose writes fail makes libhdf5 write from h5py's finaliser, which drops the
        error (and, on a full disk, ends in SIGSEGV)."""
        made = self.file.create_dataset(name, **how)  # type: ignore[union-attr]
        self.made.append(made)
        return made

    def _finish_file(self, manifest: Manifest, tables: list[h5py.Dataset]) -> None:
        """The record keys and checksums (with the block checksums of those and of the
        variable fields' offsets, ``tables``, read back), then the manifest: what makes the
        file a dataset."""
        for name, array in manifest.record_arrays(tables).items():
            ds = self._dataset(f"{RECORDS}/{name}", shape=array.shape, dtype=array.dtype)
            for a, part in zip(range(0, len(array), BLOCK), copy_blocks(array, BLOCK)):
                ds[a : a + len(part)] = part  # block by block: memory stays flat
        # fixed-length bytes stored in the dataset itself: a variable-length string lives in
        # HDF5's global heap, and a damaged heap makes libhdf5 loop forever when it is read
        self._dataset(MANIFEST, data=np.bytes_(manifest.to_json().encode()))

    def _close(self) -> None:
        """Close the file, kept for :meth:`abort` if that fails. Flushed first: a flush that
        fails raises and leaves the file as it was, while a close that fails leaves it half
        closed (h5py has released some of its objects), which nothing can close safely any
        more."""
        self.file.flush()  # type: ignore[union-attr]
        self.file.close()  # type: ignore[union-attr]
        self.file, self.datasets, self.made = None, {}, []

    def abort(self) -> None:
        self.let_go()
        if self.file is not None:
            abandon(self.file)  # before any of its objects is freed
            self.file, self.datasets, self.made = None, {}, []
            self.offsets = {}
        for spool in self.spools.values():
            spool.remove()


class HDF5Reader(Reader):
    GATHERS_ROWS = True

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.arrays: dict[str, np.ndarray] = {}
        self.offsets: dict[str, np.ndarray] = {}
        self.rows: dict[str, np.ndarray] = {}  # fixed fields as (records, bytes) uint8 views
        self._plan: BatchPlan | None = None
        try:
            self._open()
        except PackdataError:
            raise
        except Exception as exc:  # h5py's errors on a damaged file name neither file nor cause
            raise DatasetError(f"{self.path}: HDF5 file cannot be read ({type(exc).__name__}: "
                               f"{exc}); the dataset is damaged") from None

    def _open(self) -> None:
        whole = map_kept(self.path)  # reopened in this process: the last open's map
        layout = layout_of(self.path)  # and, the file unchanged, what h5py read then
        raw = None if layout is None else layout.manifest(whole)
        if raw is None:
            raise DatasetError(f"{self.path}: HDF5 file has no packdata manifest")
        self.manifest = Manifest.from_json(raw, str(self.path))
        if self.manifest.version >= 2:
            arrays = {n: mapped(layout, whole, self.path, f"{RECORDS}/{n}")
                      for n in (*DTYPES, TABLE, HEADER_HASH)}
            # the variable fields' offsets, under their blocks' checksums (format 3)
            offsets = {offsets_name(n): mapped(layout, whole, self.path, offsets_name(n))
                       for n, f in self.manifest.fields.items() if f.variable}
            self.manifest.attach_records(
                {n: a for n, a in arrays.items() if a is not None}, self.path,
                {n: (a, True) for n, a in offsets.items() if a is not None})
        check_manifest(self.manifest, self.path)
        for name, field in self.manifest.fields.items():
            if field.variable:
                stored = check_rows(layout, self.path, name, None)
                check_rows(layout, self.path, offsets_name(name), self.manifest.count + 1)
            else:
                stored = check_rows(layout, self.path, name, self.manifest.count)
            check_field(stored, self.path, name, field)
            view = view_of(stored, whole, self.path, name)
            # small fixed fields (labels) are worth a private copy in RAM
            self.arrays[name] = np.array(view) if view.nbytes < (16 << 20) else view
            if field.variable:
                self.offsets[name] = record_offsets(layout, whole, self.path, name, stored.shape[0])
            else:  # each record's bytes as a row: what gather_rows takes
                self.rows[name] = self.arrays[name].view(np.uint8).reshape(
                    stored.shape[0], field.nbytes)

    @staticmethod
    def detect(path: Path) -> bool:
        if not path.is_file():  # tar and LMDB datasets are folders: no h5py import for them
            return False
        try:
            layout = layout_of(path)
            return layout is not None and Manifest.is_packdata(layout.manifest(map_kept(path)))
        except Exception as exc:  # h5py's message for a damaged file, with ours in front
            raise DatasetError(f"{path}: HDF5 file cannot be opened ({exc})") from None

    def read_records(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        idx = self.check_indices(indices)
        batch = self.read_gathered(idx, select)  # every field fixed: one gather
        if batch is not None:
            return batch
        select = select or {}
        batch = {}
        for name, field in self.manifest.fields.items():
            if field.variable:
                data, off = self.arrays[name], self.offsets[name]
                batch[name] = [np.array(data[off[i] : off[i + 1]]) for i in idx]
            else:
                view, rows = self._field_rows(name, field, idx, select)
                shape = field.shape[1:] if name in select else field.shape
                batch[name] = gather_rows(view, rows, dtype=field.np_dtype, shape=shape)
        return batch

    def row_sources(self, idx: np.ndarray, select: Select | None = None) -> RowSources | None:
        if self.manifest.variable_fields:
            return None
        return [(name, *self._field_rows(name, field, idx, select or {}))
                for name, field in self.manifest.fields.items()]

    def _field_rows(self, name: str, field: Field, idx: np.ndarray,
                    select: Select) -> tuple[np.ndarray, np.ndarray]:
        """(view, rows): where fixed field ``name`` of records ``idx`` lies; only the selected
        entry of each where ``select`` names it (the other entries' bytes are not touched)."""
        if name not in select:
            return self.rows[name], idx
        parts = field.shape[0]
        entries = selected_entries(select, name, field, len(idx))
        return self.rows[name].reshape(-1, field.nbytes // parts), idx * parts + entries

    def batch_plan(self) -> BatchPlan | None:
        # from open: record i is row i of each field's view, which holds exactly the records
        if (self._plan is None and checksum.NATIVE_ROWS and self.rows
                and not self.manifest.variable_fields):
            self._plan = BatchPlan(
                self.manifest.fields, [(name, self.rows[name], None) for name in self.rows],
                self.check_indices, f"{self.path}: a record lies outside its field; the "
                "dataset is damaged")
        return self._plan

    def lengths(self, name: str) -> np.ndarray:
        self.check_variable(name)
        return np.diff(self.offsets[name])

    def close(self) -> None:
        self.arrays.clear()
        self.rows.clear()
        self._plan = None


WRITER = HDF5Writer
READER = HDF5Reader
detect = HDF5Reader.detect
destination = same_destination
damaged = hdf5layout.damaged
