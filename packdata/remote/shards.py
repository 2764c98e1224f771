"""A tar dataset at a URL, as the tar reader's shard source
(:class:`~packdata.containers.tar.shards.ShardSource`).

:class:`CachedShards` keeps the manifest and record index in a local cache directory and
fetches whole shards into it on first use, a few shards ahead of the reader (prefetch, in
threads), evicting the least recently used shards past ``cache_limit``; the reader checks every
fetched shard against the manifest's checksums before serving any of its records.
:class:`RangedShards` (``access="ranges"``) fetches each batch's records instead, by
concurrent ranged GETs of their members (``cat_ranges``), checked record by record by the
reader: map-style access to a few records without whole shards.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

from packdata import atomic
from packdata.containers.tar.layout import INDEX, MANIFEST
from packdata.containers.tar.shards import ShardSource
from packdata.errors import DatasetError
from packdata.remote.storage import Storage, errors
from packdata.units import parse_bytes


class CachedShards(ShardSource):
    """The tar dataset at ``url``: manifest and index cached in :meth:`Storage.local_dir`
    (fetched anew when the manifest there changed), shards fetched into it as they are read."""

    STAYS = False  # shards arrive on demand and may be evicted
    FETCHED = True

    def __init__(self, url: str, storage: Storage | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage = storage or Storage()
        self.fs, self.remote = self.storage.filesystem(self.url)
        super().__init__(self.storage.local_dir(self.url))
        self.root.mkdir(parents=True, exist_ok=True)
        with errors(self.url):
            try:
                manifest = self.fs.cat_file(f"{self.remote}/{MANIFEST}")
            except FileNotFoundError as exc:
                if "bucket" in str(exc).lower():
                    raise  # named as a missing bucket by errors()
                raise DatasetError(f"{self.url}: no {MANIFEST}; not a packdata tar dataset "
                                   "(or not finished uploading)") from None
        cached = self.root / MANIFEST
        if not cached.is_file() or cached.read_bytes() != manifest:  # new, or rewritten: start over
            for old in self.root.iterdir():
                if old.is_file():
                    old.unlink()
            self._download(INDEX)
            atomic.write_bytes(cached, manifest)
        self.limit = parse_bytes(self.storage.cache_limit)
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._pending: dict[str, Future] = {}
        self._order: list[str] = []

    def where(self, name: str) -> str:
        return f"{self.url}/{name}"

    def file(self, name: str) -> Path:
        pending = self._pending.pop(name, None)
        if pending is not None:
            with contextlib.suppress(Exception):  # fetched again below, with its error named
                pending.result()
        path = self.root / name
        try:
            os.utime(path)  # recently used: evicted last
        except FileNotFoundError:
            self._download(name, shard=True)
        self._ahead(name)
        return path

    def fetched(self, name: str) -> list[str]:
        return self._trim(keep={name, *self._pending})

    def discard(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def order(self, names: Sequence[str]) -> None:
        self._order = list(names)

    def size(self, name: str) -> int:
        with errors(self.url):
            return int(self.fs.size(f"{self.remote}/{name}"))

    def stored_bytes(self) -> int:
        with errors(self.url):
            return int(self.fs.du(self.remote))

    def publish(self, made: Sequence[Path]) -> list[str]:
        with errors(self.url):
            for path in made:
                self.fs.put_file(str(path), f"{self.remote}/{path.name}")
        return [self.where(path.name) for path in made]

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pid != os.getpid():  # threads do not survive a fork
            self._pool, self._pid, self._pending = ThreadPoolExecutor(
                max(1, self.storage.prefetch)), os.getpid(), {}
        return self._pool

    def _ahead(self, name: str) -> None:
        """Fetch the ``prefetch`` shards that follow ``name`` in the reading order."""
        if not self.storage.prefetch or name not in self._order:
            return
        at = self._order.index(name)
        for nxt in self._order[at + 1 : at + 1 + self.storage.prefetch]:
            if nxt not in self._pending and not (self.root / nxt).is_file():
                self._pending[nxt] = self._executor().submit(self._download, nxt, True)

    def _download(self, name: str, shard: bool = False) -> None:
        def fetch(tmp: Path) -> None:
            with errors(self.where(name)):
                try:
                    self.fs.get_file(f"{self.remote}/{name}", str(tmp))
                except FileNotFoundError:
                    raise DatasetError(f"{self.where(name)}: {'shard' if shard else 'file'} "
                                       "missing in the bucket; the dataset is incomplete") from None

        atomic.write_file(self.root / name, fetch)

    def _trim(self, keep: set[str]) -> list[str]:
        """Delete the least recently used cached shards until the cache fits its limit; the
        names deleted (a mapped file stays readable to whoever holds its map)."""
        files = [e for e in os.scandir(self.root)
                 if e.name not in (MANIFEST, INDEX) and e.name.endswith(".tar") and e.is_file()]
        total, gone = sum(e.stat().st_size for e in files), []
        for entry in sorted(files, key=lambda e: e.stat().st_mtime):
            if total <= self.limit:
                break
            if entry.name in keep:
                continue
            total -= entry.stat().st_size
            Path(entry.path).unlink(missing_ok=True)
            gone.append(entry.name)
        return gone

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool, self._pending = None, {}


class RangedShards(CachedShards):
    """:class:`CachedShards` whose batches are read by ranged GETs of their records' members;
    a shard is fetched whole only where something asks for its file (``packdata verify``)."""

    RANGED: ClassVar[bool] = True

    def ranges(self, names: Sequence[str], starts: Sequence[int], ends: Sequence[int]
               ) -> list[bytes]:
        with errors(self.url):
            got = self.fs.cat_ranges([f"{self.remote}/{n}" for n in names], list(starts),
                                     list(ends), on_error="return")
        for name, blob, a, b in zip(names, got, starts, ends):
            if isinstance(blob, FileNotFoundError):
                raise DatasetError(f"{self.where(name)}: shard missing in the bucket; the "
                                   "dataset is incomplete")
            if isinstance(blob, BaseException):
                with errors(self.where(name)):
                    raise blob
            if len(blob) != b - a:
                raise DatasetError(f"{self.where(name)}: shard truncated (bytes {a}-{b} asked, "
                                   "fewer found); the dataset is damaged")
        return got


def shards_at(url: str, storage: Storage | None = None) -> CachedShards:
    """The shard source of the tar dataset at ``url``, as ``storage.access`` asks."""
    storage = storage or Storage()
    return (RangedShards if storage.access == "ranges" else CachedShards)(url, storage)
