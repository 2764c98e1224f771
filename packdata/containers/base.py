"""The two halves every container implements: a Writer that appends records and a Reader whose
unit of work is the batch (``read(indices)``), never the single sample."""

from __future__ import annotations

import mmap
import os
import sys
import warnings
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from packdata import checksum
from packdata.containers.placement import Placement, Slot
from packdata.containers.plan import BatchPlan, Select, selected_entries
from packdata.errors import ArgumentError, DatasetError
from packdata.manifest import Field, Manifest
from packdata.options import Option
from packdata.recordmeta import map_npz

Batch = dict[str, "np.ndarray | list[np.ndarray]"]


#: what a writer announces when a shard is complete: its files (e.g. a tar file and its index)
ShardClosed = Callable[[list[Path]], None]


class Writer(ABC):
    """Appends records into a fresh path; :mod:`packdata.conversion` renames it into place."""

    #: container-specific options this writer accepts (``packdata convert`` has a flag for each)
    OPTIONS: ClassVar[tuple[Option, ...]] = ()
    #: whether :meth:`expect` lays out variable-length fields for the rows they will hold, when
    #: given them (conversion then asks its source, which may read each input's header)
    LAYS_OUT_ROWS: ClassVar[bool] = False

    def __init__(
        self, path: Path, fields: dict[str, Field], options: dict[str, Any],
        on_shard_closed: ShardClosed | None = None,
    ) -> None:
        unknown = set(options) - {o.name for o in self.OPTIONS}
        if unknown:
            accepted = ", ".join(o.name for o in self.OPTIONS) or "none"
            raise ArgumentError(
                f"options {sorted(unknown)} do not apply to this container (accepted: {accepted})"
            )
        self.path = path
        self.fields = fields
        self.options = {**{o.name: o.default for o in self.OPTIONS}, **options}
        self.on_shard_closed = on_shard_closed
        self.count = 0

    @abstractmethod
    def append(self, key: str, record: dict[str, np.ndarray]) -> None:
        """Store one record (every field of ``fields``, already checked)."""

    def expect(self, count: int, rows: dict[str, int] | None = None  # noqa: B027 - optional
               ) -> None:
        """How many records to expect, before the first is appended: conversion's count of
        inputs, and (to a writer that :attr:`LAYS_OUT_ROWS`) the rows each variable-length
        field will hold in all; hints (skipped inputs, or inputs that make several records, make
        them wrong). A writer may lay out its storage for them; whatever arrives is stored all
        the same."""

    #: whether :meth:`place` lays the output out for worker processes to write records into
    #: (see :mod:`packdata.containers.placement`)
    PLACES_ROWS: ClassVar[bool] = False
    #: the layout :meth:`place` made, while records still go there (None once given up)
    placement: Placement | None = None

    def place(self, count: int, rows: dict[str, int] | None = None) -> Placement | None:
        """Before the first record: lay the output out for ``count`` records (and ``rows`` of
        each variable-length field in all), and say where each goes (None where it cannot).
        Blocks written there are announced with :meth:`placed`, in order; records appended
        otherwise (an input skipped, a record that does not fit its slot) give the layout up
        (:attr:`placement` None): blocks written there afterwards are read back."""
        raise NotImplementedError(f"{type(self).__name__} does not declare PLACES_ROWS")

    def placed(self, slot: Slot) -> None:
        """The records of ``slot`` were written where :meth:`place` said: they are the next."""
        raise NotImplementedError(f"{type(self).__name__} does not declare PLACES_ROWS")

    def append_rows(self, keys: Sequence[str], rows: np.ndarray) -> None:
        """Store records ``keys`` given as the rows of one uint8 table, row ``j`` record
        ``keys[j]``'s fields' bytes in ``fields`` order (every field fixed-size, already
        checked): how conversion hands over a block of records at once. Record by record here;
        a container that can store rows as they are overrides it."""
        for key, record in zip(keys, records_of(rows, self.fields)):
            self.append(key, record)

    @abstractmethod
    def finish(self, manifest: Manifest) -> None:
        """Flush, store the manifest and close: the output is complete after this returns."""

    def abort(self) -> None:  # noqa: B027 - optional hook
        """Release handles after a failure; the caller deletes the partial output."""


#: where each fixed field of a batch lies: (name, view, rows) per field, ``view[rows]`` its bytes
RowSources = list[tuple[str, np.ndarray, np.ndarray]]


class Reader(ABC):
    """Batched random access to a container. Open one per process (handles do not survive fork)."""

    manifest: Manifest
    #: whether :meth:`row_sources` says where a batch's records lie (the fast path: one gather
    #: for every field, which checking fuses into)
    GATHERS_ROWS: ClassVar[bool] = False

    def read(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        """Records ``indices`` (in that order): fixed fields stacked into one array each,
        variable-length fields as a list of arrays.

        ``select`` names fixed fields of which only one entry of the first axis is wanted per
        record (e.g. one of K stored variants): ``select["points"][j]`` for record
        ``indices[j]``. A container reads only those bytes where its layout allows.

        Through the reader's :meth:`batch_plan` where it has one, else :meth:`read_records`."""
        plan = self.batch_plan()
        if plan is not None:
            return plan.read(indices, select)
        return self.read_records(indices, select)

    @abstractmethod
    def read_records(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        """:meth:`read` without a batch plan: what every container implements."""

    def read_into(self, indices: np.ndarray, out: dict[str, np.ndarray]) -> Batch:
        """:meth:`read`, with the fixed fields named in ``out`` placed in those arrays (each
        C-contiguous, shape ``(len(indices), *field.shape)``, the field's dtype), e.g. a
        shared-memory slot a DataLoader worker sends the batch through. Gathered straight into
        them where :meth:`row_sources` says where the records lie; else read, then copied."""
        if self.GATHERS_ROWS and set(out) == set(self.manifest.fields):
            plan = self.batch_plan()
            if plan is not None:
                return plan.read(indices, out=out)
            idx = self.check_indices(indices)
            sources = self.row_sources(idx)
            if sources is not None:
                return gather_sources(sources, out)
        batch = self.read(indices)
        for name, array in out.items():
            np.copyto(array, batch[name])
            batch[name] = array
        return batch

    def row_sources(self, idx: np.ndarray, select: Select | None = None) -> RowSources | None:
        """Where the fields of records ``idx`` (checked indices) lie, every field fixed-size, in
        the manifest's order: ``view[rows]`` is a field's bytes (``view`` 2-D uint8, rows
        along its first axis); for a field in ``select``, one entry of its first axis
        (``select[name][j]`` of record ``idx[j]``). None where this batch cannot be read that
        way (it is read otherwise). Readers that declare :attr:`GATHERS_ROWS` implement it."""
        raise NotImplementedError(f"{type(self).__name__} does not declare GATHERS_ROWS")

    def batch_plan(self) -> BatchPlan | None:
        """Where every record's fixed fields lie, once this reader knows and has checked that
        for all of its records (see :mod:`packdata.containers.plan`): :meth:`read` (with or
        without ``select``) and :meth:`read_into` of whole records then take it. None until
        then, where it never knows (e.g. LMDB datasets read through LMDB's own lookups), and
        where packdata's C extension was not built."""
        return None

    def read_gathered(self, idx: np.ndarray, select: Select | None = None) -> Batch | None:
        """Records ``idx`` (checked indices) gathered into new arrays in one call, where
        :meth:`row_sources` says where they lie; else None."""
        sources = self.row_sources(idx, select) if self.GATHERS_ROWS else None
        if sources is None:
            return None
        names = [name for name, _, _ in sources]
        return gather_sources(sources, new_arrays(self.manifest.fields, names, len(idx), select))

    @abstractmethod
    def lengths(self, name: str) -> np.ndarray:
        """Per-record length of the variable field ``name``, without reading the records."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release file handles."""

    def prefetch(self, starts: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """Where the coming reads begin (sample indices, in reading order). A reader that fetches
        ahead (object storage) plans its fetches by them; a local one has nothing to do."""

    def allow_truncated_shards(self) -> None:  # noqa: B027 - optional hook
        """Read the records that lie wholly before the end of a truncated shard (``packdata
        verify``: they are intact). A container without shards has nothing to allow."""

    def truncated(self) -> dict[str, tuple[int, int, int | None]]:
        """Shards found truncated so far (with :meth:`allow_truncated_shards`): name → (bytes
        there, bytes its records need, bytes conversion recorded or None). None in a container
        without shards."""
        return {}

    def second_copies_match(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """For each field this container stores twice, whether the second copy of records
        ``indices`` holds what reads return (a bool each): ``packdata verify`` names those
        that do not. A container that stores each field once has none."""
        return {}

    def check_indices(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """``indices`` as int64, negative ones counted from the end; IndexError if out of range."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if not idx.size:
            return idx
        n = self.manifest.count
        lo, hi = idx.min(), idx.max()
        if lo < -n or hi >= n:
            bad = idx[(idx < -n) | (idx >= n)][0]
            raise IndexError(f"index {bad} out of range for a dataset of {n} records")
        return idx if lo >= 0 else np.where(idx < 0, idx + n, idx)

    def check_variable(self, name: str) -> Field:
        field = self.manifest.fields.get(name)
        if field is None or not field.variable:
            variable = list(self.manifest.variable_fields) or "none"
            raise DatasetError(f"'{name}' is not a variable-length field (those are: {variable})")
        return field


def counted_down(left: int, done: int, recount: Callable[[], int]) -> int:
    """What is ``left`` to do once ``done`` more are (a count that may take a repeat twice, so
    ``left`` only runs ahead of the truth): the exact ``recount()`` once it would reach 0, so it
    never reads 0 while something is left."""
    left -= done
    return left if left > 0 else recount()


def columns_of(rows: np.ndarray, fields: dict[str, Field]) -> dict[str, np.ndarray]:
    """Each field of a table of records' bytes (see :meth:`Writer.append_rows`) as a view of
    the table, shaped (records, *field shape)."""
    columns, start = {}, 0
    for name, field in fields.items():
        column = rows[:, start : start + field.nbytes]
        columns[name] = column.view(field.np_dtype).reshape(len(rows), *field.shape)
        start += field.nbytes
    return columns


def records_of(rows: np.ndarray, fields: dict[str, Field]) -> list[dict[str, np.ndarray]]:
    """The records of a table of records' bytes, as dicts of views of the table."""
    columns = columns_of(rows, fields)
    return [{name: column[j] for name, column in columns.items()} for j in range(len(rows))]


def apply_select(batch: Batch, select: Select | None, fields: dict[str, Field]) -> Batch:
    """``select`` applied after a full read: for containers that cannot read less. Its entries
    are checked as where only they are read (:func:`selected_entries`): numpy would take entry
    -1 as the last one."""
    for name in select or {}:
        entries = selected_entries(select, name, fields[name], len(batch[name]))  # type: ignore[arg-type]
        batch[name] = batch[name][np.arange(len(entries)), entries]  # type: ignore[index]
    return batch


def gather_rows(view: np.ndarray, rows: np.ndarray, out: np.ndarray | None = None,
                dtype: Any = np.uint8, shape: Sequence[int] | None = None) -> np.ndarray:
    """``view[rows]``: ``view`` a 2-D uint8 array of byte rows (strided, even overlapping, over
    a mapped file), written into ``out`` (a C-contiguous array of as many bytes) or, without
    ``out``, into a new array of ``dtype`` shaped ``(len(rows), *shape)`` (by default a row of
    ``dtype`` items per record).

    On one core, always. Where packdata's C extension was built, one native call
    (:func:`packdata.checksum.gather`: a copy per row, without the GIL). Otherwise, into a given
    ``out``: torch's ``index_select`` where torch is loaded and set to one thread (DataLoader's
    workers are), which writes into it (numpy's gathers first copy a non-contiguous source
    whole, ``np.take``, or make a new one); numpy's fancy indexing otherwise. Not on torch's
    intra-op threads, though they gather 1.6× as fast as numpy on an idle 2-core machine: beside
    busy processes they fell to 0.09× numpy's (bench/bench_gather.py), and a child forked after they
    ran hangs in them (tests/test_containers.py). ``packdata verify`` reads without importing
    torch."""
    if shape is None:
        shape = (view.shape[1] // np.dtype(dtype).itemsize,)
    if not len(rows):
        return np.empty((0, *shape), dtype=dtype) if out is None else out
    if checksum.NATIVE_ROWS:
        target = np.empty((len(rows), *shape), dtype=dtype) if out is None else out
        checksum.gather([view], [np.ascontiguousarray(rows, dtype=np.int64)], [target])
        return target
    torch = sys.modules.get("torch")
    if out is None or torch is None or view.shape[1] < 64 or torch.get_num_threads() > 1:
        gathered = view[rows]  # not np.take: that copies a strided source whole first
        if out is None:
            return gathered.view(dtype).reshape(len(rows), *shape)
        out.reshape(len(rows), -1).view(np.uint8)[...] = gathered
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a read-only map, only read here
        source = torch.from_numpy(view)
    target = torch.from_numpy(out.reshape(len(rows), -1).view(np.uint8))
    torch.index_select(source, 0, torch.from_numpy(np.ascontiguousarray(rows, np.int64)),
                       out=target)
    return out


def gather_sources(sources: RowSources, out: dict[str, np.ndarray]) -> Batch:
    """Each field of ``sources`` gathered into ``out[name]``: one native call for them all
    where packdata's C extension was built."""
    if not checksum.NATIVE_ROWS:
        return {name: gather_rows(view, rows, out[name]) for name, view, rows in sources}
    checksum.gather(*native_arguments(sources, out))
    return {name: out[name] for name, _, _ in sources}


def native_arguments(sources: RowSources, out: dict[str, np.ndarray]) -> tuple[list, list, list]:
    """``sources`` and ``out`` as the native gather takes them: the views, the rows (int64,
    contiguous) and the output arrays, field by field."""
    return ([view for _, view, _ in sources],
            [np.ascontiguousarray(rows, dtype=np.int64) for _, _, rows in sources],
            [out[name] for name, _, _ in sources])


def new_arrays(fields: dict[str, Field], names: Sequence[str], count: int,
               select: Select | None = None) -> dict[str, np.ndarray]:
    """Empty arrays for ``count`` records of fixed fields ``names``: one entry of the first
    axis of those in ``select``."""
    select = select or {}
    arrays = {}
    for name in names:
        field = fields[name]
        shape = field.shape[1:] if name in select else field.shape
        arrays[name] = np.empty((count, *shape), dtype=field.np_dtype)
    return arrays


def map_file(path: Path) -> np.ndarray:
    """The whole file as a read-only uint8 array backed by a memory map.

    A plain ndarray over :mod:`mmap` rather than ``np.memmap``: the subclass adds Python-level
    work to every indexing call, which shows at hundreds of thousands of samples per second.
    """
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return np.empty(0, dtype=np.uint8)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mapped, dtype=np.uint8)


def same_destination(dst: Path, options: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """A container's ``destination`` where the output is exactly the path given."""
    return dst, options


def attach_record_file(manifest: Manifest, where: Path,
                       tables: dict[str, tuple[np.ndarray, bool]] | None = None) -> None:
    """Attach the record keys and checksums a dataset of format 2 or later keeps in the
    ``.npz`` at ``where`` (mapped in place, never loaded) to its ``manifest``, once the
    manifest's JSON matched the checksum stored there (:meth:`Manifest.attach_records`, with
    the container's own per-record ``tables``); a DatasetError naming the file if it cannot be
    read."""
    try:
        arrays = map_npz(where, map_file(where))
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"{where}: the record keys and checksums cannot be read "
                           f"({type(exc).__name__}); the dataset is damaged") from None
    manifest.attach_records(arrays, where, tables)


def unreadable(raw: bytes | str | None, where: Path) -> str:
    """Why a dataset whose files are packdata's cannot be read, given its manifest as stored
    (``raw``; None where it is missing), in a sentence naming ``where``."""
    if raw is None:
        return (f"{where}: a packdata dataset without its manifest; the dataset is damaged: "
                "convert it again (--overwrite replaces it)")
    try:
        Manifest.from_json(raw, str(where))
    except DatasetError as exc:
        return (f"{exc}; the files are a packdata dataset's, its manifest is damaged: convert "
                "it again (--overwrite replaces it)")
    return f"{where}: a packdata dataset that cannot be read; the dataset is damaged"


def holds_record_arrays(npz: Path, prefix: str = "") -> bool:
    """Whether ``npz`` is an archive holding packdata's record arrays (their members' names
    prefixed with ``prefix``): what marks a dataset whose manifest is damaged as packdata's."""
    try:
        with zipfile.ZipFile(npz) as z:
            names = set(z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
    return {f"{prefix}keys.npy", f"{prefix}checksums.npy"} <= names


def disk_size(path: Path) -> int:
    """Bytes on disk of a file or of everything under a directory."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
