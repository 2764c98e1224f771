"""Reading a tar dataset: shards memory-mapped, a batch one numpy gather.

Where every shard can be mapped back to back in one address range (Linux), a batch drawn from
several shards is one gather over byte addresses; otherwise, where a shard's records sit at a
constant stride (the usual case for fixed-shape fields), one gather per shard through a strided
view. Every offset is checked against the shard sizes before any view is laid over a shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from packdata import checksum
from packdata.containers.base import (
    Batch,
    Reader,
    RowSources,
    Select,
    counted_down,
    gather_rows,
    map_file,
    selected_entries,
)
from packdata.containers.joined import byte_window, map_joined
from packdata.containers.plan import BatchPlan
from packdata.containers.tar.copies import second_copies_match
from packdata.containers.tar.layout import (
    INDEX,
    MANIFEST,
    check_index,
    checked_entries,
    load_index,
    read_manifest,
    shard_list,
)
from packdata.errors import DatasetError, PackdataError
from packdata.manifest import Field, check_manifest

#: records whose index entries are checked together (see TarReader._check_records): 4,096
#: records' entries are ~100 KB of index a field, checked in one vectorised pass
ENTRY_BLOCK = 4096


class TarReader(Reader):
    """Batched reads from memory-mapped shards (see the module docstring)."""

    GATHERS_ROWS = True
    #: whether all shards may be mapped back to back up front (:meth:`_joined_map`); readers
    #: that fetch shards on demand say no
    JOINS_SHARDS: ClassVar[bool] = True
    #: bytes left of each truncated shard, when reads of the records before the cut are allowed
    #: (:meth:`allow_truncated_shards`); None: a truncated shard fails every read of it
    _cut: dict[int, int] | None = None
    _stored: dict[str, tuple[Field, int]] | None = None  # see _stored_fields

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not (self.path / MANIFEST).is_file():
            raise DatasetError(f"{self.path}: no {MANIFEST}; not a packdata tar dataset")
        try:
            self._open()
        except PackdataError:
            raise
        except Exception as exc:  # numpy or the OS on a damaged index or shard list
            raise DatasetError(f"{self.path}: the dataset cannot be read ({type(exc).__name__}: "
                               f"{exc}); the dataset is damaged") from None

    def _open(self) -> None:
        self.manifest = read_manifest(self.path)
        self.index = load_index(self.path / INDEX, self.manifest)  # attaches keys, checksums
        check_manifest(self.manifest, self.path)
        shards = shard_list(self.path, self.manifest)
        self.shard_names = [s["name"] for s in shards]
        self.shard_start = np.concatenate([[0], np.cumsum([s["count"] for s in shards])]).astype(
            np.int64)
        check_index(self.path / INDEX, self.index, self.manifest)
        if self.manifest.count:  # the first and last entries: a manifest edited (a field's
            # dtype or shape) is refused at open, as is an index of another dataset
            self.check_entries(np.unique([0, self.manifest.count - 1]))
        self._shards = shards
        # records whose entries were checked (calloc'd: pages are touched only as records are
        # read, so opening stays flat), and each shard's bytes once it is mapped (-1: not yet)
        self._entries_ok = np.zeros(self.manifest.count, dtype=bool)
        self._unchecked, self._plan = self.manifest.count, None  # records not in _entries_ok
        # each fixed field's records' addresses in the joined map, found as they are checked
        # (np.empty: untouched pages cost no memory), so that a batch looks them up in one step
        self._addresses: dict[str, np.ndarray] = {}
        self._block_bad = np.zeros(-(-self.manifest.count // ENTRY_BLOCK), dtype=bool)
        self._shard_bytes = np.full(len(self.shard_names), -1, dtype=np.int64)
        self._maps: dict[int, np.ndarray] = {}
        self._ends: dict[int, int] = {}  # bytes each shard's records need (from the index)
        self._views: dict[tuple[str, int], np.ndarray | None] = {}
        self._joined: tuple[np.ndarray, np.ndarray] | None | bool = False  # False: not tried
        self._windows: dict[Any, np.ndarray] = {}

    def _needed(self, shard: int) -> int:
        """The bytes shard ``shard``'s records need, from its part of the index (read once, on
        demand: opening reads no per-record entry)."""
        if shard not in self._ends:
            a, b = int(self.shard_start[shard]), int(self.shard_start[shard + 1])
            self._ends[shard] = max([int((self.index[f"{n}.offset"][a:b]
                                          + self.index[f"{n}.nbytes"][a:b]).max(initial=0))
                                     for n in self.manifest.fields], default=0)
        return self._ends[shard]

    def _map(self, shard: int) -> np.ndarray:
        if shard not in self._maps:
            path = self.path / self.shard_names[shard]
            if not path.is_file():
                raise DatasetError(f"{path}: shard missing; the dataset is incomplete")
            mapped = map_file(path)
            # the size conversion recorded (O(1)); else what the shard's records need
            size = self._shards[shard].get("bytes")
            exact = isinstance(size, int)
            needed = size if exact else self._needed(shard)
            if len(mapped) < needed and self._cut is not None:  # verify: reads before the cut
                self._cut[shard] = len(mapped)
            elif len(mapped) < needed:
                what = "the manifest records" if exact else "the index needs"
                raise DatasetError(f"{path}: shard truncated ({len(mapped)} bytes, {what} "
                                   f"{needed}); the dataset is damaged")
            self._maps[shard] = mapped
        return self._maps[shard]

    def _strided(self, name: str, shard: int) -> np.ndarray | None:
        """A (records, nbytes) view of one field in one shard, if its records sit at a fixed stride."""
        if (name, shard) not in self._views:
            a, b = self.shard_start[shard], self.shard_start[shard + 1]
            offsets = self.index[f"{name}.offset"][a:b]
            nbytes = int(self.manifest.fields[name].nbytes)
            view = None
            steps = np.diff(offsets)
            mm = self._map(shard)
            inside = len(offsets) and min(offsets[0], offsets[-1]) >= 0 and \
                max(offsets[0], offsets[-1]) + nbytes <= len(mm)  # so every row is, if strided
            if inside and (len(steps) == 0 or (steps == steps[0]).all()):
                stride = int(steps[0]) if len(steps) else nbytes
                view = np.lib.stride_tricks.as_strided(
                    mm[offsets[0] :], shape=(len(offsets), nbytes), strides=(stride, 1),
                    writeable=False,
                )
            self._views[name, shard] = view
        return self._views[name, shard]

    def allow_truncated_shards(self) -> None:
        """Read the records that lie wholly before the end of a truncated shard (``packdata
        verify``: they are intact); reading one past the cut raises a DatasetError naming it."""
        self._cut = {}
        self.JOINS_SHARDS = False  # type: ignore[misc]  # joined maps assume whole shards
        self._joined, self._plan = False, None

    def truncated(self) -> dict[str, tuple[int, int, int | None]]:
        """Shards found truncated so far (with :meth:`allow_truncated_shards`): name → (bytes
        there, bytes its records need, bytes conversion recorded or None)."""
        return {self.shard_names[s]: (n, self._needed(s), self._shards[s].get("bytes"))
                for s, n in sorted((self._cut or {}).items())}

    def shards_of(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The shard holding each of these records."""
        return np.searchsorted(self.shard_start, indices, side="right") - 1

    def check_entries(self, idx: np.ndarray) -> dict[str, tuple[np.ndarray, ...]]:
        """The index entries of records ``idx`` by field, checked (:func:`checked_entries`)."""
        return checked_entries(self.path / INDEX, self.index, self._stored_fields(), idx,
                               self.shards_of(idx))

    def second_copies_match(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """The members of the fields kept in the index against the index's values (see
        :func:`~packdata.containers.tar.copies.second_copies_match`)."""
        idx = self.check_indices(indices)
        return second_copies_match(self.manifest.fields, self.index, idx, self.shards_of(idx),
                                   self._map)

    def _stored_fields(self) -> dict[str, tuple[Field, int]]:
        """The fields stored in shards (not kept in the index), each with its record's bytes
        (fixed) or a row's bytes (variable)."""
        if self._stored is None:
            self._stored = {
                name: (field, int(np.prod(field.row_shape, dtype=np.int64))
                       * field.np_dtype.itemsize if field.variable else field.nbytes)
                for name, field in self.manifest.fields.items()
                if f"{name}.values" not in self.index}
        return self._stored

    def _check_records(self, idx: np.ndarray) -> None:
        """:meth:`check_entries`, and every record's bytes within its shard's file (a record
        past a truncated shard's cut raises, naming it); once per record in this reader, which
        then keeps each fixed field's address in the joined map (:meth:`_located`).

        The blocks of :data:`ENTRY_BLOCK` records around the batch are checked in one call, so
        a first epoch pays a few checks, not one per batch; a block that fails is left to the
        records read from it, which name what is damaged."""
        if self._entries_ok[idx].all():
            return
        blocks = np.unique(idx // ENTRY_BLOCK)
        blocks = blocks[~self._block_bad[blocks]]
        if len(blocks):
            try:
                self._check_bytes(self._block_records(blocks))
            except DatasetError:
                for b in blocks.tolist():
                    try:
                        self._check_bytes(self._block_records(np.array([b])))
                    except DatasetError:
                        self._block_bad[b] = True
        if not self._entries_ok[idx].all():
            self._check_bytes(idx)

    def _block_records(self, blocks: np.ndarray) -> np.ndarray:
        rows = (blocks[:, None] * ENTRY_BLOCK + np.arange(ENTRY_BLOCK)).ravel()
        return rows[rows < self.manifest.count]

    def _check_bytes(self, idx: np.ndarray) -> None:
        entries = self.check_entries(idx)
        for shard, offset, nbytes in entries.values():
            sizes = self._shard_bytes
            # shards these records lie in, not mapped yet (a count per shard, not a sort)
            for s in np.flatnonzero(np.bincount(shard, minlength=len(sizes)) * (sizes < 0)):
                sizes[s] = len(self._map(int(s)))
            ends = offset + nbytes
            past = np.flatnonzero(ends > sizes[shard])
            if len(past):
                j = int(past[0])
                where = self.path / self.shard_names[int(shard[j])]
                raise DatasetError(f"{where}: shard truncated ({len(self._map(int(shard[j])))} "
                                   f"bytes); record {int(idx[j])} lies past the cut (it needs "
                                   f"{int(ends[j])}); the dataset is damaged")
        joined = self._joined_map()
        for name, (shard, offset, _) in entries.items() if joined is not None else ():
            if not self.manifest.fields[name].variable:  # each record's address, found once
                self._addresses.setdefault(name, np.empty(self.manifest.count, np.int64))[idx] = \
                    joined[1][shard] + offset
        fresh = int(np.count_nonzero(~self._entries_ok[idx]))  # a repeated index counted twice
        self._entries_ok[idx] = True  # (a plan needs every record: the count is exact at 0)
        self._unchecked = counted_down(self._unchecked, fresh,
                                       lambda: int(np.count_nonzero(~self._entries_ok)))

    def _joined_map(self) -> tuple[np.ndarray, np.ndarray] | None:
        """All shards mapped back to back (see :mod:`packdata.containers.joined`), once each
        was checked as :meth:`_map` checks it; None where that is not available, where a shard
        is damaged (the others still read, one by one), or for readers that fetch shards on
        demand (they override ``_map``)."""
        if self._joined is False:
            self._joined = None
            if self.JOINS_SHARDS:
                try:
                    for shard in range(len(self.shard_names)):
                        self._map(shard)
                except DatasetError:
                    return None
                self._joined = map_joined([self.path / n for n in self.shard_names])
        return self._joined  # type: ignore[return-value]

    def _located(self, name: str, nbytes: int, idx: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray] | None:
        """(a window of ``nbytes`` rows over the joined map, the address of field ``name`` of
        each of records ``idx`` in it), or None where shards are not joined. The records must
        have been checked (:meth:`_check_records`), which finds their addresses."""
        if self._joined_map() is None:
            return None
        return self._window(nbytes), self._addresses[name][idx]

    def _window(self, nbytes: int) -> np.ndarray:
        """Rows of ``nbytes`` at every byte of the joined map (which must be there)."""
        if nbytes not in self._windows:
            self._windows[nbytes] = byte_window(self._joined[0], nbytes)  # type: ignore[index]
        return self._windows[nbytes]

    def _index_rows(self, name: str, parts: int = 1) -> np.ndarray:
        """Field ``name``'s values kept in the index, as rows of bytes (``parts`` a record)."""
        values = self.index[f"{name}.values"]
        return values.reshape(len(values) * parts, -1).view(np.uint8)

    def _entry_located(self, name: str, field: Field, idx: np.ndarray,
                       entries: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`_located` for fixed field ``name``; given ``entries``, for entry ``entries[j]``
        of its first axis in record ``idx[j]`` (rows one entry wide)."""
        nbytes = field.nbytes if entries is None else field.nbytes // field.shape[0]
        located = self._located(name, nbytes, idx)
        if located is None or entries is None:
            return located
        return located[0], located[1] + entries * nbytes  # entry k: k * nbytes into the field

    def _payloads(self, name: str, idx: np.ndarray) -> list[np.ndarray]:
        shard = self.index[f"{name}.shard"][idx]
        offset = self.index[f"{name}.offset"][idx]
        nbytes = self.index[f"{name}.nbytes"][idx]
        return [np.array(self._map(s)[o : o + n])
                for s, o, n in zip(shard.tolist(), offset.tolist(), nbytes.tolist())]

    def _gather_fixed(self, name: str, field: Field, idx: np.ndarray,
                      rows: np.ndarray | None = None) -> np.ndarray:
        """Field ``name`` of records ``idx``; with ``rows``, only entry ``rows[j]`` of the first
        axis of record ``idx[j]`` (the other entries' bytes are not touched)."""
        shape = field.shape if rows is None else field.shape[1:]
        parts = 1 if rows is None else field.shape[0]
        nbytes = field.nbytes // parts

        def gather(view: np.ndarray, local: np.ndarray, sel: np.ndarray | None) -> np.ndarray:
            if sel is None:
                return view[local]
            return view.reshape(len(view), parts, nbytes)[local, sel]

        located = self._entry_located(name, field, idx, rows) if len(idx) else None
        if located is not None:  # records of any shards at any offsets: one gather
            return gather_rows(*located, dtype=field.np_dtype, shape=shape)
        shards = self.index[f"{name}.shard"][idx]
        first = int(shards[0]) if len(shards) else 0
        view = self._strided(name, first)
        if view is not None and (shards == first).all():  # one shard: one gather, no masks
            out = gather(view, idx - self.shard_start[first], rows)
        else:
            out = np.empty((len(idx), nbytes), dtype=np.uint8)
            for s in np.unique(shards).tolist():
                mask = shards == s
                view = self._strided(name, s)
                if view is None:
                    view = np.stack(self._payloads(name, idx[mask]))
                    local = np.arange(len(view))
                else:
                    local = idx[mask] - self.shard_start[s]
                out[mask] = gather(view, local, None if rows is None else rows[mask])
        return out.view(field.np_dtype).reshape(len(idx), *shape)

    def batch_plan(self) -> BatchPlan | None:
        # once every record's entries were checked, which found its fields' addresses
        if (self._plan is None and not self._unchecked and self.manifest.count
                and self._cut is None and checksum.NATIVE_ROWS
                and not self.manifest.variable_fields and self._joined_map() is not None):
            columns = [(name, self._index_rows(name), None) if f"{name}.values" in self.index
                       else (name, self._window(field.nbytes), self._addresses[name])
                       for name, field in self.manifest.fields.items()]
            self._plan = BatchPlan(self.manifest.fields, columns, self.check_indices,
                                   f"{self.path}: a record lies outside its shards; the dataset "
                                   "is damaged")
        return self._plan

    def read_records(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        idx = self.check_indices(indices)
        batch = self.read_gathered(idx, select)  # shards joined, every field fixed: one gather
        if batch is not None:
            return batch
        self._check_records(idx)
        select = {name: selected_entries(select, name, self.manifest.fields[name], len(idx))
                  for name in select or {}}
        batch = {}
        for name, field in self.manifest.fields.items():
            if f"{name}.values" in self.index:  # kept in the index: no shard page touched
                values, rows = self.index[f"{name}.values"], select.get(name)
                batch[name] = values[idx] if rows is None else values[idx, rows]
            elif field.variable:
                batch[name] = [p.view(field.np_dtype).reshape(-1, *field.row_shape)
                               for p in self._payloads(name, idx)]
            else:
                batch[name] = self._gather_fixed(name, field, idx, select.get(name))
        return batch

    def row_sources(self, idx: np.ndarray, select: Select | None = None) -> RowSources | None:
        if self._cut is not None or self.manifest.variable_fields or not len(idx):
            return None
        self._check_records(idx)
        sources: RowSources = []
        for name, field in self.manifest.fields.items():
            parts, entries = 1, None
            if select and name in select:  # only the selected entries' bytes are gathered
                parts, entries = field.shape[0], selected_entries(select, name, field, len(idx))
            if f"{name}.values" in self.index:  # kept in the index (labels): no shard touched
                sources.append((name, self._index_rows(name, parts),
                                idx if entries is None else idx * parts + entries))
                continue
            located = self._entry_located(name, field, idx, entries)
            if located is None:  # shards not mapped as one range
                return None
            sources.append((name, *located))
        return sources

    def lengths(self, name: str) -> np.ndarray:
        field = self.check_variable(name)
        row_bytes = int(np.prod(field.row_shape, dtype=np.int64)) * field.np_dtype.itemsize
        return self.index[f"{name}.nbytes"] // row_bytes

    def close(self) -> None:
        self._views.clear()
        self._maps.clear()
        self._windows.clear()
        self._joined = False
        # the addresses go with the maps: found again as records are checked again (a new
        # array, not a write: a forked process closes its parent's reader)
        self._entries_ok = np.zeros(self.manifest.count, dtype=bool)
        self._unchecked, self._plan = self.manifest.count, None
        self._addresses.clear()

