"""A tar dataset at a URL, read through a bounded local cache of whole shards, or by ranged GETs.

:class:`RemoteTarReader` keeps the manifest and record index in a local cache directory and
fetches whole shards into it on first use, a few shards ahead of the reader (prefetch, in
threads), evicting the least recently used shards past ``cache_limit``. Every fetched shard is
checked against the record checksums of the manifest before any of its records is served. With
``access="ranges"`` a batch's records are fetched instead by concurrent ranged GETs of their
members (``cat_ranges``), each record checked against its checksum: map-style access to a few
records without whole shards.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from packdata import atomic, containers
from packdata.checksum import algorithm_of, chunks_checksum
from packdata.containers import tar
from packdata.containers.base import Batch, Reader, Select, selected_entries
from packdata.errors import DatasetError
from packdata.remote.storage import Storage, errors
from packdata.units import parse_bytes
from packdata.urls import is_url


class RemoteTarReader(tar.TarReader):
    """A tar dataset at a URL, read through a bounded local cache of whole shards."""

    JOINS_SHARDS = False  # shards arrive on demand and may be evicted
    # with no joined map there are no rows to gather from; asking would fetch whole shards to
    # check the batch's records, which ranged access must not
    GATHERS_ROWS = False

    def __init__(self, url: str, storage: Storage | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage = storage or Storage()
        self.fs, self.remote = self.storage.filesystem(self.url)
        self.local = self.storage.local_dir(self.url)
        self.local.mkdir(parents=True, exist_ok=True)
        with errors(self.url):
            try:
                manifest = self.fs.cat_file(f"{self.remote}/{tar.MANIFEST}")
            except FileNotFoundError as exc:
                if "bucket" in str(exc).lower():
                    raise  # named as a missing bucket by errors()
                raise DatasetError(f"{self.url}: no {tar.MANIFEST}; not a packdata tar dataset "
                                   "(or not finished uploading)") from None
        cached = self.local / tar.MANIFEST
        if not cached.is_file() or cached.read_bytes() != manifest:  # new, or rewritten: start over
            for old in self.local.iterdir():
                if old.is_file():
                    old.unlink()
            with errors(self.url):
                self._download(tar.INDEX)
            atomic.write_bytes(cached, manifest)
        super().__init__(self.local)
        self.limit = parse_bytes(self.storage.cache_limit)
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._pending: dict[int, Future] = {}
        self._order: list[int] = list(range(len(self.shard_names)))

    def shard_url(self, shard: int) -> str:
        return f"{self.url}/{self.shard_names[shard]}"

    def prefetch(self, starts: Sequence[int]) -> None:
        """The order shards will be read in: each read fetches the next ``prefetch`` ahead."""
        self._order = list(dict.fromkeys(self.shards_of(starts).tolist()))

    def _map(self, shard: int) -> np.ndarray:
        if shard not in self._maps:
            for attempt in range(3):  # another process sharing the cache may evict it meanwhile
                self._fetch(shard)
                try:
                    mapped = super()._map(shard)
                    break
                except DatasetError:
                    if attempt == 2 or (self.local / self.shard_names[shard]).is_file():
                        raise
            self._ahead(shard)
            self._verify(shard, mapped)
            self._trim(keep={shard, *self._pending})
        return self._maps[shard]

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pid != os.getpid():  # threads do not survive a fork
            self._pool, self._pid, self._pending = ThreadPoolExecutor(max(1, self.storage.prefetch)), \
                os.getpid(), {}
        return self._pool

    def _fetch(self, shard: int) -> None:
        pending = self._pending.pop(shard, None)
        if pending is not None:
            with contextlib.suppress(Exception):  # fetched again below, with its error named
                pending.result()
        path = self.local / self.shard_names[shard]
        try:
            os.utime(path)  # recently used: evicted last
        except FileNotFoundError:
            self._download(self.shard_names[shard], shard)

    def _ahead(self, shard: int) -> None:
        if not self.storage.prefetch:
            return
        try:
            at = self._order.index(shard)
        except ValueError:
            return
        for nxt in self._order[at + 1 : at + 1 + self.storage.prefetch]:
            if nxt not in self._maps and nxt not in self._pending \
                    and not (self.local / self.shard_names[nxt]).is_file():
                self._pending[nxt] = self._executor().submit(
                    self._download, self.shard_names[nxt], nxt)

    def _download(self, name: str, shard: int | None = None) -> None:
        where = self.shard_url(shard) if shard is not None else f"{self.url}/{name}"

        def fetch(tmp: Path) -> None:
            with errors(where):
                try:
                    self.fs.get_file(f"{self.remote}/{name}", str(tmp))
                except FileNotFoundError:
                    kind = "shard" if shard is not None else "file"
                    raise DatasetError(f"{where}: {kind} missing in the bucket; the dataset is "
                                       "incomplete") from None

        atomic.write_file(self.local / name, fetch)

    def read_records(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        if self.storage.access != "ranges":
            return super().read_records(indices, select)
        idx = self.check_indices(indices)
        self.check_entries(idx)  # before any range is asked for
        select = {name: selected_entries(select, name, self.manifest.fields[name], len(idx))
                  for name in select or {}}
        blobs = self._ranges(idx)
        batch: Batch = {}
        for name, spec in self.manifest.fields.items():
            if f"{name}.values" in self.index:
                values, rows = self.index[f"{name}.values"], select.get(name)
                batch[name] = values[idx] if rows is None else values[idx, rows]
            elif spec.variable:
                batch[name] = [np.frombuffer(b, spec.np_dtype).reshape(-1, *spec.row_shape).copy()
                               for b in blobs[name]]
            else:
                out = np.frombuffer(b"".join(blobs[name]), spec.np_dtype)
                out = out.reshape(len(idx), *spec.shape).copy()
                rows = select.get(name)
                batch[name] = out if rows is None else out[np.arange(len(idx)), rows]
        return batch

    def _ranges(self, idx: np.ndarray) -> dict[str, list[bytes]]:
        """The members of records ``idx``, by field, in one batch of concurrent ranged GETs,
        each record checked against its checksum."""
        names = [n for n in self.manifest.fields if f"{n}.values" not in self.index]
        shards = np.concatenate([self.index[f"{n}.shard"][idx] for n in names]).tolist()
        starts = np.concatenate([self.index[f"{n}.offset"][idx] for n in names])
        ends = starts + np.concatenate([self.index[f"{n}.nbytes"][idx] for n in names])
        with errors(self.url):
            got = self.fs.cat_ranges([f"{self.remote}/{self.shard_names[s]}" for s in shards],
                                     starts.tolist(), ends.tolist(), on_error="return")
        for shard, blob, a, b in zip(shards, got, starts.tolist(), ends.tolist()):
            if isinstance(blob, FileNotFoundError):
                raise DatasetError(f"{self.shard_url(shard)}: shard missing in the bucket; the "
                                   "dataset is incomplete")
            if isinstance(blob, BaseException):
                with errors(self.shard_url(shard)):
                    raise blob
            if len(blob) != b - a:
                raise DatasetError(f"{self.shard_url(shard)}: shard truncated (bytes {a}-{b} "
                                   "asked, fewer found); the dataset is damaged")
        blobs = {n: got[k * len(idx) : (k + 1) * len(idx)] for k, n in enumerate(names)}
        for j, i in enumerate(idx.tolist()):
            chunks = (blobs[name][j] if name in blobs
                      else np.ascontiguousarray(self.index[f"{name}.values"][i]).data
                      for name in self.manifest.fields)
            if chunks_checksum(chunks, algorithm_of(self.manifest.version)) != self.manifest.checksums[i]:
                shard = int(self.shards_of([i])[0])
                raise DatasetError(f"{self.shard_url(shard)}: shard corrupted (record "
                                   f"'{self.manifest.keys[i]}' does not match its checksum); "
                                   "the dataset is damaged")
        return blobs

    def _verify(self, shard: int, mapped: np.ndarray) -> None:
        """Every record of a freshly mapped shard against the manifest's checksums."""
        a, b = int(self.shard_start[shard]), int(self.shard_start[shard + 1])
        columns = []
        for name in self.manifest.fields:
            if f"{name}.values" in self.index:
                columns.append(("values", self.index[f"{name}.values"][a:b]))
            else:
                columns.append(("bytes", (self.index[f"{name}.offset"][a:b].tolist(),
                                          self.index[f"{name}.nbytes"][a:b].tolist())))
        expected = self.manifest.checksums[a:b]
        for j in range(b - a):
            chunks = (np.ascontiguousarray(column[j]).data if kind == "values"
                      else mapped[column[0][j] : column[0][j] + column[1][j]].data
                      for kind, column in columns)
            if chunks_checksum(chunks, algorithm_of(self.manifest.version)) != expected[j]:
                self._forget(shard)
                (self.local / self.shard_names[shard]).unlink(missing_ok=True)
                raise DatasetError(f"{self.shard_url(shard)}: shard corrupted (record "
                                   f"'{self.manifest.keys[a + j]}' does not match its checksum); "
                                   "the dataset is damaged")

    def _forget(self, shard: int) -> None:
        self._maps.pop(shard, None)
        for key in [k for k in self._views if k[1] == shard]:
            del self._views[key]

    def _trim(self, keep: set[int]) -> None:
        """Delete the least recently used cached shards until the cache fits its limit."""
        names = {n: i for i, n in enumerate(self.shard_names)}
        files = [e for e in os.scandir(self.local) if e.name in names and e.is_file()]
        total = sum(e.stat().st_size for e in files)
        for entry in sorted(files, key=lambda e: e.stat().st_mtime):
            if total <= self.limit:
                break
            shard = names[entry.name]
            if shard in keep:
                continue
            self._forget(shard)  # a mapped file stays readable to anyone holding its map
            total -= entry.stat().st_size
            Path(entry.path).unlink(missing_ok=True)

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool, self._pending = None, {}
        super().close()


def write_reader_indexes(dataset: str | Path, storage: Storage | None = None) -> list[str]:
    """``packdata index``: the DALI and wids indexes of a tar dataset made before packdata wrote
    them, at a path (:func:`packdata.containers.tar.reindex.write_reader_indexes`) or a URL
    (made locally, image shards fetched to tell PNG from JPEG members, and uploaded beside its
    shards). Where they were written."""
    import tempfile

    from packdata.containers.tar import reindex
    from packdata.containers.tar.indexes import write_wids_index
    from packdata.urls import is_url

    if not is_url(dataset):
        return [str(p) for p in reindex.write_reader_indexes(dataset)]
    reader = RemoteTarReader(str(dataset), storage)
    try:
        with tempfile.TemporaryDirectory(prefix="packdata-index-") as tmp:
            made = reindex.write_reader_indexes(reader.url, out_dir=tmp, reader=reader)
            shards = reader.manifest.extra["shards"]
            with errors(reader.url):
                sizes = [reader.fs.size(f"{reader.remote}/{s['name']}") for s in shards]
                made.append(write_wids_index(tmp, shards, sizes))
                for made_file in made:
                    reader.fs.put_file(str(made_file), f"{reader.remote}/{made_file.name}")
    finally:
        reader.close()
    return [f"{reader.url}/{f.name}" for f in made]


def open_reader(path: str | Path, storage: Storage | None = None) -> Reader:
    """The reader of the dataset at ``path`` as :func:`packdata.open` finds it, without the
    dataset's torch face (``packdata inspect``, ``verify``): a URL's tar shards through
    :class:`RemoteTarReader` (reached with ``storage``), a local dataset through its
    container's reader."""
    if is_url(path):
        return RemoteTarReader(str(path).rstrip("/"), storage or Storage())
    return containers.for_existing(path).READER(Path(path))
