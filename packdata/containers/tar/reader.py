"""Reading a tar dataset: shards memory-mapped, a batch one numpy gather.

Where every shard can be mapped back to back in one address range (Linux), a batch drawn from
several shards is one gather over byte addresses; otherwise, where a shard's records sit at a
constant stride (the usual case for fixed-shape fields), one gather per shard through a strided
view. Every offset is checked against the shard sizes before any view is laid over a shard.

The shards come from a :class:`~packdata.containers.tar.shards.ShardSource`: a local folder, or
object storage (:mod:`packdata.remote.shards`: a shard fetched is checked, record by record
against the manifest's checksums, before any of its records is served; or each batch read by
ranged requests: :mod:`.ranges`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from packdata import checksum
from packdata.checksum import algorithm_of
from packdata.containers.base import (
    Batch,
    Reader,
    RowSources,
    Select,
    counted_down,
    gather_rows,
    selected_entries,
)
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
from packdata.containers.tar.mapped import MappedShards
from packdata.containers.tar.ranges import corrupted, read_ranged
from packdata.containers.tar.shards import ShardSource
from packdata.errors import DatasetError, PackdataError
from packdata.manifest import Field, check_manifest

#: records whose index entries are checked together (see TarReader._check_records): 4,096
#: records' entries are ~100 KB of index a field, checked in one vectorised pass
ENTRY_BLOCK = 4096
#: records of a fetched shard read and checked at once (a few MB of images)
ARRIVAL_BLOCK = 256


class TarReader(Reader):
    """Batched reads from memory-mapped shards (see the module docstring)."""

    GATHERS_ROWS = True
    _stored: dict[str, tuple[Field, int]] | None = None  # see _stored_fields

    def __init__(self, path: Path, shards: ShardSource | None = None) -> None:
        """The dataset in folder ``path``, its shards there, or from ``shards`` (which holds
        its manifest and record index in ``path``)."""
        self.path = Path(path)
        self.shards = shards or ShardSource(self.path)
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
        self.maps = MappedShards(self.shards, shards, self._needed, self._check_arrival)
        # records whose entries were checked (calloc'd: pages are touched only as records are
        # read, so opening stays flat), and each shard's bytes once it is mapped (-1: not yet)
        self._entries_ok = np.zeros(self.manifest.count, dtype=bool)
        self._unchecked, self._plan = self.manifest.count, None  # records not in _entries_ok
        # each fixed field's records' addresses in the joined map, found as they are checked
        # (np.empty: untouched pages cost no memory), so that a batch looks them up in one step
        self._addresses: dict[str, np.ndarray] = {}
        self._block_bad = np.zeros(-(-self.manifest.count // ENTRY_BLOCK), dtype=bool)
        self._checking = threading.Lock()
        self._shard_bytes = np.full(len(self.shard_names), -1, dtype=np.int64)
        self._ends: dict[int, int] = {}  # bytes each shard's records need (from the index)

    def _needed(self, shard: int) -> int:
        """The bytes shard ``shard``'s records need, from its part of the index (read once, on
        demand: opening reads no per-record entry)."""
        if shard not in self._ends:
            a, b = int(self.shard_start[shard]), int(self.shard_start[shard + 1])
            self._ends[shard] = max([int((self.index[f"{n}.offset"][a:b]
                                          + self.index[f"{n}.nbytes"][a:b]).max(initial=0))
                                     for n in self.manifest.fields], default=0)
        return self._ends[shard]

    def _check_arrival(self, shard: int) -> None:
        """Every record of a shard just fetched against its checksum, from the shard's own bytes
        (the checksum's batch routine, as every read's), before any is served; a copy that
        fails is discarded (:class:`MappedShards`)."""
        mapped, m = self.maps[shard], self.manifest
        if not len(m.checksums):
            return
        a, b = int(self.shard_start[shard]), int(self.shard_start[shard + 1])
        for start in range(a, b, ARRIVAL_BLOCK):
            idx = np.arange(start, min(b, start + ARRIVAL_BLOCK), dtype=np.int64)
            batch: Batch = {}
            for name, field in m.fields.items():
                if f"{name}.values" in self.index:
                    batch[name] = self.index[f"{name}.values"][idx]
                    continue
                sizes = self.index[f"{name}.nbytes"][idx].tolist()
                parts = [mapped[o : o + n] for o, n in zip(self.index[f"{name}.offset"][idx].tolist(),
                                                           sizes)]
                short = [j for j, (p, n) in enumerate(zip(parts, sizes)) if len(p) != n]
                if short:
                    raise corrupted(self, int(idx[short[0]]))
                batch[name] = parts if field.variable else np.stack(parts)
            sums = checksum.batch_checksums(batch, m.fields, len(idx), algorithm_of(m.version))
            bad = np.flatnonzero(sums != m.checksums[idx])
            if len(bad):
                raise corrupted(self, int(idx[bad[0]]))

    def prefetch(self, starts: Sequence[int]) -> None:
        self.shards.order([self.shard_names[s] for s in
                           dict.fromkeys(self.shards_of(starts).tolist())])

    def _strided(self, name: str, shard: int) -> np.ndarray | None:
        """A (records, nbytes) view of one field in one shard, if its records sit at a fixed stride."""
        def make(mm: np.ndarray) -> np.ndarray | None:
            a, b = self.shard_start[shard], self.shard_start[shard + 1]
            offsets = self.index[f"{name}.offset"][a:b]
            nbytes = int(self.manifest.fields[name].nbytes)
            steps = np.diff(offsets)
            inside = len(offsets) and min(offsets[0], offsets[-1]) >= 0 and \
                max(offsets[0], offsets[-1]) + nbytes <= len(mm)  # so every row is, if strided
            if not inside or (len(steps) and not (steps == steps[0]).all()):
                return None
            stride = int(steps[0]) if len(steps) else nbytes
            return np.lib.stride_tricks.as_strided(mm[offsets[0] :], shape=(len(offsets), nbytes),
                                                   strides=(stride, 1), writeable=False)

        return self.maps.view(name, shard, make)

    def allow_truncated_shards(self) -> None:
        """Read the records that lie wholly before the end of a truncated shard (``packdata
        verify``: they are intact); reading one past the cut raises a DatasetError naming it."""
        self.maps.allow_cuts()
        self._plan = None

    def truncated(self) -> dict[str, tuple[int, int, int | None]]:
        """Shards found truncated so far (with :meth:`allow_truncated_shards`): name → (bytes
        there, bytes its records need, bytes conversion recorded or None)."""
        return {self.shard_names[s]: (n, self._needed(s), self.maps.recorded(s))
                for s, n in sorted((self.maps.cut or {}).items())}

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
                                   self.maps.__getitem__)

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
        with self._checking:  # loader threads share a reader: one check of a block at a time
            if not self._entries_ok[idx].all():
                self._check_unchecked(idx)

    def _check_unchecked(self, idx: np.ndarray) -> None:
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
                sizes[s] = len(self.maps[int(s)])
            ends = offset + nbytes
            past = np.flatnonzero(ends > sizes[shard])
            if len(past):
                j = int(past[0])
                where = self.shards.where(self.shard_names[int(shard[j])])
                raise DatasetError(f"{where}: shard truncated ({len(self.maps[int(shard[j])])} "
                                   f"bytes); record {int(idx[j])} lies past the cut (it needs "
                                   f"{int(ends[j])}); the dataset is damaged")
        joined = self.maps.joined()
        for name, (shard, offset, _) in entries.items() if joined is not None else ():
            if not self.manifest.fields[name].variable:  # each record's address, found once
                self._addresses.setdefault(name, np.empty(self.manifest.count, np.int64))[idx] = \
                    joined[1][shard] + offset
        fresh = int(np.count_nonzero(~self._entries_ok[idx]))  # a repeated index counted twice
        self._entries_ok[idx] = True  # (a plan needs every record: the count is exact at 0)
        self._unchecked = counted_down(self._unchecked, fresh,
                                       lambda: int(np.count_nonzero(~self._entries_ok)))

    def _located(self, name: str, nbytes: int, idx: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray] | None:
        """(a window of ``nbytes`` rows over the joined map, the address of field ``name`` of
        each of records ``idx`` in it), or None where shards are not joined. The records must
        have been checked (:meth:`_check_records`), which finds their addresses."""
        if self.maps.joined() is None:
            return None
        return self.maps.window(nbytes), self._addresses[name][idx]

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
        return [np.array(self.maps[s][o : o + n])
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
                and checksum.NATIVE_ROWS
                and not self.manifest.variable_fields and self.maps.joined() is not None):
            columns = [(name, self._index_rows(name), None) if f"{name}.values" in self.index
                       else (name, self.maps.window(field.nbytes), self._addresses[name])
                       for name, field in self.manifest.fields.items()]
            self._plan = BatchPlan(self.manifest.fields, columns, self.check_indices,
                                   f"{self.path}: a record lies outside its shards; the dataset "
                                   "is damaged")
        return self._plan

    def read_records(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        idx = self.check_indices(indices)
        if self.shards.RANGED:
            return read_ranged(self, idx, select)
        return self._read_mapped(idx, select)

    def _read_mapped(self, idx: np.ndarray, select: Select | None = None) -> Batch:
        """Records ``idx`` (checked indices) read from their shards, mapped."""
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
        if self.manifest.variable_fields or not len(idx) or self.maps.joined() is None:
            return None  # (checking a batch's records here would fetch shards a ranged read
            # must not, where they do not stay)
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
        self.shards.close()
        self.maps.clear()
        # the addresses go with the maps: found again as records are checked again (a new
        # array, not a write: a forked process closes its parent's reader)
        self._entries_ok = np.zeros(self.manifest.count, dtype=bool)
        self._unchecked, self._plan = self.manifest.count, None
        self._addresses.clear()

