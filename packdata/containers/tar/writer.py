"""Writing tar shards: records appended as members, shards closed (and announced) as they fill,
the record index, wids index and manifest written last."""

from __future__ import annotations

import contextlib
import tarfile
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from packdata.containers.base import ShardClosed, Writer
from packdata.containers.tar.indexes import idx_path, write_idx, write_wids_index
from packdata.containers.tar.layout import INDEX, INDEX_VALUE_BYTES, MANIFEST, RECORDS
from packdata.containers.tar.members import member_key as key_of_members
from packdata.containers.tar.members import member_suffix, npy_header, ustar_header
from packdata.errors import PackdataError
from packdata.manifest import Field, Manifest
from packdata.options import Option
from packdata.spooling import (
    SORT_BLOCK,
    ColumnSpool,
    copy_blocks,
    remove_sorted,
    save_npz,
    sort_hashes,
)
from packdata.units import parse_count_or_bytes


class TarWriter(Writer):
    """Records as members of shards that close at a record count or a size; each closed shard
    (with its DALI index) is announced to ``on_shard_closed``."""

    OPTIONS = (
        Option("shard_size", str, "10000", "Tar: samples per shard (10000) or bytes per shard "
               "(e.g. 512MB)."),
        Option("pattern", str, "shard-%06d.tar", "Tar: shard file names (set by DST, e.g. "
               "out/cifar-%04d.tar).", on_command_line=False),
    )

    def __init__(
        self, path: Path, fields: dict[str, Field], options: dict[str, Any],
        on_shard_closed: ShardClosed | None = None,
    ) -> None:
        super().__init__(path, fields, options, on_shard_closed)
        self.max_count, self.max_bytes = parse_count_or_bytes(self.options["shard_size"],
                                                               "shard_size")
        path.mkdir(parents=True)
        self.shards: list[dict[str, Any]] = []
        self.file: Any = None  # the open shard
        self.offset = 0  # bytes written to the open shard
        # the open shard's index entries (8 bytes a record each, not Python int objects),
        # appended to the spooled columns below as each shard closes: memory stays flat
        self.index: dict[str, array] = {
            f"{n}.{col}": array("q") for n in fields for col in ("shard", "offset", "nbytes")
        }
        self.values = {n: [] for n, f in fields.items()
                       if not f.variable and f.nbytes <= INDEX_VALUE_BYTES}
        self.columns = {n: tuple(self.index[f"{n}.{col}"] for col in ("shard", "offset", "nbytes"))
                        for n in fields}  # the index lists each record appends to
        # each record's member name stem, hashed and spooled (not a dict of every key): two
        # keys that make one stem are found at finish, by sorting
        self.member_hashes = ColumnSpool(self.path / ".members.spool", "<u8")
        self.shard_keys: list[str] = []  # its records' member keys, for its DALI index
        self.suffixes = {n: [] for n, f in fields.items() if f.codec}  # png/jpg vary per record
        # the whole index's columns, a shard at a time (removed before the manifest is written)
        self.spools = {key: ColumnSpool(self.path / f".{key}.spool",
                                        "<i4" if key.endswith(".shard") else "<i8")
                       for key in self.index}
        self.spools.update({f"{n}.values": ColumnSpool(self.path / f".{n}.values.spool",
                                                       fields[n].np_dtype, fields[n].shape)
                            for n in self.values})

    def _shard(self) -> Any:
        full = self.file is not None and (
            (self.max_count and self.shards[-1]["count"] >= self.max_count)
            or (self.max_bytes and self.offset >= self.max_bytes)
        )
        if self.file is None or full:
            self._close_shard()
            name = self.options["pattern"] % len(self.shards)
            self.shards.append({"name": name, "count": 0})
            self.file = open(self.path / name, "wb", buffering=1 << 20)  # noqa: SIM115
            self.offset = 0
        return self.file

    def _close_shard(self) -> None:
        if self.file is not None:
            end = self.offset + 1024  # two zero blocks end the archive
            self.file.write(bytes(1024 + (-end) % tarfile.RECORDSIZE))
            # its size, so that a reader finds a truncated shard without reading the index
            self.shards[-1]["bytes"] = end + (-end) % tarfile.RECORDSIZE
            self.file.close()
            self.file = None
            count = len(self.shard_keys)
            columns = [(self.suffixes[n] if n in self.suffixes else
                        [member_suffix(n, f, np.zeros(0, f.np_dtype))] * count,
                        self.columns[n][1], self.columns[n][2])
                       for n, f in self.fields.items()]
            name = self.shards[-1]["name"]
            write_idx(idx_path(self.path, name), self.shard_keys, columns)
            self._spool_index()
            if self.on_shard_closed is not None:
                self.on_shard_closed([self.path / name, idx_path(self.path, name)])

    def _spool_index(self) -> None:
        """The closed shard's index entries appended to their spooled columns, then let go."""
        for key, values in self.index.items():
            self.spools[key].extend(values)
            del values[:]
        for name, values in self.values.items():
            self.spools[f"{name}.values"].extend(values)
            values.clear()
        self.shard_keys = []
        for suffixes in self.suffixes.values():
            suffixes.clear()

    def append(self, key: str, record: dict[str, np.ndarray]) -> None:
        member_key = key_of_members(key)
        self.member_hashes.append(xxhash.xxh3_64_intdigest(member_key.encode()))
        out = self._shard()
        for name, field in self.fields.items():
            value = record[name]
            suffix = member_suffix(name, field, value)
            if suffix == "cls":
                payload, skip = str(int(value)).encode(), 0
            elif suffix.endswith(".npy"):
                header = npy_header(value.dtype.str, value.shape)
                payload, skip = header + np.ascontiguousarray(value).tobytes(), len(header)
            else:
                payload, skip = value.tobytes(), 0
            header = ustar_header(f"{member_key}.{suffix}", len(payload))
            out.write(header + payload + bytes(-len(payload) % 512))
            data_start = self.offset + len(header)
            self.offset = data_start + len(payload) + (-len(payload) % 512)
            if name in self.suffixes:
                self.suffixes[name].append(suffix)
            shards, offsets, sizes = self.columns[name]
            shards.append(len(self.shards) - 1)
            offsets.append(data_start + skip)
            sizes.append(len(payload) - skip)
            if name in self.values:
                self.values[name].append(value)
        self.shard_keys.append(member_key)
        self.shards[-1]["count"] += 1
        self.count += 1

    def _check_member_names(self, keys: Sequence[str]) -> None:
        """Refuse two records whose keys make the same member names (``a.b`` and ``a_b``)."""
        stem = self.path / ".members."
        sorted_hashes, _ = sort_hashes(self.member_hashes.finish(), stem)  # flat in memory
        repeated: set[int] = set()
        last = np.zeros(0, np.uint64)  # the block before's last hash: equal ones may straddle
        for block in copy_blocks(sorted_hashes, SORT_BLOCK):
            joined = np.concatenate([last, block])
            repeated.update(joined[1:][joined[1:] == joined[:-1]].tolist())
            last = block[-1:]
        del sorted_hashes
        self.member_hashes.remove()
        remove_sorted(stem)
        if not repeated:
            return
        first: dict[tuple[int, str], str] = {}  # (hash, member stem) → the first key making it
        for key in keys:  # only when two stems share a hash: rare, and then ends in an error
            stem = key_of_members(key)
            digest = xxhash.xxh3_64_intdigest(stem.encode())
            if digest in repeated:
                if (digest, stem) in first:  # not a hash collision: the same member names
                    raise PackdataError(f"keys '{first[digest, stem]}' and '{key}' both make tar "
                                        f"members named '{stem}.*'; rename one of the inputs")
                first[digest, stem] = key

    def finish(self, manifest: Manifest) -> None:
        self._close_shard()
        self._check_member_names(manifest.keys)
        arrays = {key: spool.finish() for key, spool in self.spools.items()}
        manifest.extra["shards"] = self.shards  # first: the arrays hold the JSON's checksum
        columns = [arrays[key] for key in sorted(arrays)]  # as the reader lists them
        for name, values in manifest.record_arrays(columns).items():
            arrays[f"{RECORDS}.{name}"] = values
        save_npz(self.path / INDEX, arrays)  # spooled arrays block by block
        for spool in self.spools.values():
            spool.remove()
        write_wids_index(self.path, self.shards)
        (self.path / MANIFEST).write_text(manifest.to_json())  # last: what makes it a dataset

    def abort(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):  # its flush fails on a full disk; it closes
                self.file.close()
        for spool in (*self.spools.values(), self.member_hashes):
            spool.remove()
