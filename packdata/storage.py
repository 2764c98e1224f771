"""Object storage through fsspec (S3 with s3fs; GCS, Azure and others the same way).

Reading: a tar dataset at a URL is read through :class:`RemoteTarReader`, which keeps the
manifest and record index in a local cache directory and fetches whole shards into it on first
use, a few shards ahead of the reader (prefetch, in threads), evicting the least recently used
shards past ``cache_limit``. Every fetched shard is checked against the record checksums of the
manifest before any of its records is served. With ``access="ranges"`` a batch's records are
fetched instead by concurrent ranged GETs of their members (``cat_ranges``), each record checked
against its checksum: map-style access to a few records without whole shards. Writing is in
:mod:`packdata.upload`, input files at a URL in :mod:`packdata.remote_files`.

Credentials come from where the storage library looks (environment, profile files, instance
metadata) or from ``storage_options``; packdata keeps none of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
import zlib
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packdata.containers import tar
from packdata.containers.base import Batch, Select
from packdata.errors import ArgumentError, DatasetError, PackdataError, require

#: default bound on the bytes of cached shards in one cache directory
CACHE_LIMIT = 10 << 30
#: botocore settings so that an unreachable endpoint fails in seconds, not minutes
S3_DEFAULTS = {"config_kwargs": {"connect_timeout": 5, "read_timeout": 60,
                                 "retries": {"max_attempts": 2}}}
ACCESS = ("shards", "ranges")
CREDENTIAL_PLACES = (
    "storage_options (key=, secret= or profile=), the environment (AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE), the shared files ~/.aws/credentials and "
    "~/.aws/config (or AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE), and the instance or "
    "container metadata service"
)


def is_url(path: Any) -> bool:
    """Whether ``path`` names object storage (``s3://…``, ``gs://…``, ``file://…``)."""
    return isinstance(path, str) and "://" in path


def parse_bytes(value: int | str) -> int:
    """``10_000_000`` or ``"10GB"``/``"512MB"``/``"64KB"`` as a byte count."""
    text = str(value).strip().upper()
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10), ("B", 1)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


@dataclass
class Storage:
    """How to reach object storage and where to cache what is read from it."""

    storage_options: dict[str, Any] = field(default_factory=dict)
    cache_dir: str | Path | None = None
    cache_limit: int | str = CACHE_LIMIT
    prefetch: int = 2  # shards fetched ahead of the one being read
    #: "shards": whole shards fetched into the cache (streaming, epochs over the dataset);
    #: "ranges": each batch's records fetched by ranged GETs of their members (map-style access
    #: to a few records of a large dataset, nothing cached but the index)
    access: str = "shards"

    def __post_init__(self) -> None:
        if self.access not in ACCESS:
            raise ArgumentError(f"access '{self.access}': expected one of {', '.join(ACCESS)}")

    def filesystem(self, url: str) -> tuple[Any, str]:
        """The fsspec filesystem for ``url`` and the path within it."""
        fsspec = require("fsspec", "cloud", f"reading or writing {url}")
        protocol = url.split("://", 1)[0]
        options = dict(self.storage_options or {})
        if protocol in ("s3", "s3a"):
            require("s3fs", "cloud", f"reading or writing {url}")
            options = {**S3_DEFAULTS, **options}
        with errors(url):
            fs, path = fsspec.core.url_to_fs(url, **options)
        return fs, path.rstrip("/")

    def local_dir(self, url: str) -> Path:
        """This URL's cache directory."""
        # the platform's cache folder, and a name no script run from there imports as packdata
        base = Path(self.cache_dir) if self.cache_dir else Path(
            os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "packdata-cache"
        return base / hashlib.sha1(url.rstrip("/").encode()).hexdigest()[:16]


@contextlib.contextmanager
def errors(url: str):
    """Storage-library failures as packdata errors that say what to do."""
    try:
        yield
    except PackdataError:
        raise
    except Exception as exc:
        names = {c.__name__ for c in type(exc).__mro__}
        text = str(exc)
        if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
            raise DatasetError(f"{url}: no such bucket") from None
        if isinstance(exc, FileNotFoundError):
            raise DatasetError(f"{url}: not found ({exc})") from None
        if "NoCredentialsError" in names or "Unable to locate credentials" in text:
            raise PackdataError(f"{url}: no credentials found; looked in {CREDENTIAL_PLACES}") \
                from None
        if isinstance(exc, PermissionError):
            raise PackdataError(f"{url}: access denied ({text}); check the credentials found in "
                                f"{CREDENTIAL_PLACES}") from None
        if isinstance(exc, (OSError, TimeoutError)) or "EndpointConnectionError" in names \
                or "ConnectTimeoutError" in names:
            raise PackdataError(f"cannot reach {url} ({exc.__class__.__name__}: {text}); is the "
                                "endpoint right and reachable?") from None
        raise


class RemoteTarReader(tar.TarReader):
    """A tar dataset at a URL, read through a bounded local cache of whole shards."""

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
            _write_atomically(cached, manifest)
        super().__init__(self.local)
        self.limit = parse_bytes(self.storage.cache_limit)
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._pending: dict[int, Future] = {}
        self._order: list[int] = list(range(len(self.shard_names)))

    @staticmethod
    def detect(path: Any) -> bool:
        return False  # found by URL, never by looking at a local path

    def shard_url(self, shard: int) -> str:
        return f"{self.url}/{self.shard_names[shard]}"

    def prefetch(self, starts: Sequence[int]) -> None:
        """The order shards will be read in: each read fetches the next ``prefetch`` ahead."""
        self._order = list(dict.fromkeys(self.shards_of(list(starts))))

    def shards_of(self, starts: list[int]) -> list[int]:
        """The shard holding each of these sample indices."""
        return (np.searchsorted(self.shard_start, starts, side="right") - 1).tolist()

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
        target = self.local / name
        tmp = target.with_name(f".{name}.{uuid.uuid4().hex[:8]}.part")
        where = self.shard_url(shard) if shard is not None else f"{self.url}/{name}"
        try:
            with errors(where):
                try:
                    self.fs.get_file(f"{self.remote}/{name}", str(tmp))
                except FileNotFoundError:
                    kind = "shard" if shard is not None else "file"
                    raise DatasetError(f"{where}: {kind} missing in the bucket; the dataset is "
                                       "incomplete") from None
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def read(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        if self.storage.access != "ranges":
            return super().read(indices, select)
        idx = self.check_indices(indices)
        blobs = self._ranges(idx)
        batch: Batch = {}
        for name, spec in self.manifest.fields.items():
            if f"{name}.values" in self.index:
                batch[name] = self.index[f"{name}.values"][idx]
            elif spec.variable:
                batch[name] = [np.frombuffer(b, spec.np_dtype).reshape(-1, *spec.row_shape).copy()
                               for b in blobs[name]]
            else:
                out = np.frombuffer(b"".join(blobs[name]), spec.np_dtype)
                out = out.reshape(len(idx), *spec.shape).copy()
                rows = (select or {}).get(name)
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
            crc = 0
            for name in self.manifest.fields:
                if name in blobs:
                    crc = zlib.crc32(blobs[name][j], crc)
                else:
                    crc = zlib.crc32(np.ascontiguousarray(self.index[f"{name}.values"][i]).data,
                                     crc)
            if crc != self.manifest.checksums[i]:
                shard = self.shards_of([i])[0]
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
            crc = 0
            for kind, column in columns:
                if kind == "values":
                    crc = zlib.crc32(np.ascontiguousarray(column[j]).data, crc)
                else:
                    offset, nbytes = column[0][j], column[1][j]
                    crc = zlib.crc32(mapped[offset : offset + nbytes].data, crc)
            if crc != expected[j]:
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


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
