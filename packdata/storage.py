"""Object storage through fsspec (S3 with s3fs; GCS, Azure and others the same way).

Reading: a tar dataset at a URL is read through :class:`RemoteTarReader`, which keeps the
manifest and record index in a local cache directory and fetches whole shards into it on first
use, a few shards ahead of the reader (prefetch, in threads), evicting the least recently used
shards past ``cache_limit``. Every fetched shard is checked against the record checksums of the
manifest before any of its records is served. Writing: a dataset built locally is uploaded with
its manifest last, so a reader never finds a half-written dataset at the URL.

Credentials come from where the storage library looks (environment, profile files, instance
metadata) or from ``storage_options``; packdata keeps none of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
import uuid
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packdata.containers import tar
from packdata.errors import DatasetError, OutputExistsError, PackdataError, require
from packdata.manifest import Manifest
from packdata.reader_index import WIDS_INDEX

#: default bound on the bytes of cached shards in one cache directory
CACHE_LIMIT = 10 << 30
#: botocore settings so that an unreachable endpoint fails in seconds, not minutes
S3_DEFAULTS = {"config_kwargs": {"connect_timeout": 5, "read_timeout": 60,
                                 "retries": {"max_attempts": 2}}}
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
        base = Path(self.cache_dir) if self.cache_dir else Path(tempfile.gettempdir()) / "packdata"
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

    def prefetch(self, shards: list[int]) -> None:
        """The order shards will be read in: each read fetches the next ``prefetch`` ahead."""
        self._order = list(dict.fromkeys(shards))

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


class ShardUploader:
    """Uploads each tar shard of a conversion into ``local`` as soon as the writer closes it
    (its DALI ``.idx`` is written at that moment), in a background thread, while the next shards
    are still being written. The manifest is never uploaded here: :func:`upload` sends it last."""

    POLL = 0.2  # seconds between looks at the staging directory

    def __init__(self, local: Path, url: str, storage: Storage) -> None:
        self.staging, self.name, self.url = local.parent, local.name, url
        self.fs, self.remote = storage.filesystem(url)
        self.uploaded: list[str] = []  # remote names, in upload order
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="packdata-upload", daemon=True)
        self._thread.start()

    def _closed(self) -> list[tuple[Path, Path]]:
        """(shard, idx) pairs closed by the writer and not yet sent, in the one-part layout
        (``.NAME.partial-*/`` while writing, ``NAME/`` once renamed into place)."""
        done, found = set(self.uploaded), {}
        for idx in [*self.staging.glob(f".{self.name}.partial-*/*.idx"),
                    *self.staging.glob(f"{self.name}/*.idx")]:
            found.setdefault(idx.with_suffix(".tar").name, (idx.with_suffix(".tar"), idx))
        return [found[n] for n in sorted(found) if n not in done]

    def _run(self) -> None:
        while True:
            last = self._stop.is_set()  # one more sweep after the stop is asked
            try:
                for shard, idx in self._closed():
                    try:
                        with errors(self.url):
                            self.fs.put_file(str(shard), f"{self.remote}/{shard.name}")
                            self.fs.put_file(str(idx), f"{self.remote}/{idx.name}")
                    except FileNotFoundError:  # renamed into place meanwhile: the next sweep
                        continue
                    self.uploaded.append(shard.name)
            except BaseException as exc:  # noqa: BLE001 - handed to the converting thread
                self.error = exc
                return
            if last:
                return
            self._stop.wait(self.POLL)

    def finish(self) -> list[str]:
        """Wait for the shards closed so far; the names sent (an upload failure is raised)."""
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.uploaded

    def remove(self) -> str:
        """Delete what was sent (after a failure); a sentence saying what is left, if any."""
        self._stop.set()
        self._thread.join()
        names = [n for s in self.uploaded for n in (s, Path(s).with_suffix(".idx").name)]
        try:
            if names:
                self.fs.rm([f"{self.remote}/{n}" for n in names])
        except Exception as exc:  # noqa: BLE001 - reported, the original failure is raised
            return (f"; {len(self.uploaded)} shards already uploaded to {self.url} could not be "
                    f"removed ({exc.__class__.__name__}: {exc}): delete them by hand")
        return ""


def upload(local: Path, url: str, storage: Storage | None = None, overwrite: bool = False,
           sent: list[str] | None = None) -> None:
    """Upload the tar dataset at ``local`` to ``url``: shards (but those already ``sent``) with
    their DALI indexes, then the record and wids indexes, the manifest last."""
    storage = storage or Storage()
    fs, remote = storage.filesystem(url)
    with errors(url):
        if sent is None:  # else the caller retired the old dataset before sending shards
            _retire(fs, remote, url, overwrite)
        manifest = Manifest.from_json((local / tar.MANIFEST).read_text(), str(local))
        names = [s["name"] for s in manifest.extra["shards"] if s["name"] not in set(sent or ())]
        names += [Path(n).with_suffix(".idx").name for n in names]
        names = [n for n in names if (local / n).is_file()] + \
            [n for n in (tar.INDEX, WIDS_INDEX) if (local / n).is_file()]
        fs.put([str(local / n) for n in names], [f"{remote}/{n}" for n in names])
        fs.put_file(str(local / tar.MANIFEST), f"{remote}/{tar.MANIFEST}")


def _retire(fs: Any, remote: str, url: str, overwrite: bool) -> None:
    """Before anything is written: a dataset already at ``url`` is refused, or (``overwrite``)
    stops being one by losing its manifest first."""
    if fs.exists(f"{remote}/{tar.MANIFEST}"):
        if not overwrite:
            raise OutputExistsError(f"{url} holds a dataset; pass --overwrite to replace it")
        if not Manifest.is_packdata(fs.cat_file(f"{remote}/{tar.MANIFEST}")):
            raise OutputExistsError(f"{url}/{tar.MANIFEST} is not a packdata manifest; "
                                    "refusing to replace it")
        fs.rm_file(f"{remote}/{tar.MANIFEST}")


def convert_to_url(url: str, container: str | None, resume: bool, convert_locally: Any,
                   storage: Storage | None = None, overwrite: bool = False,
                   streamed: bool = True) -> Any:
    """Run ``convert_locally(path)`` into a temporary directory and upload the result: with
    ``streamed``, each shard is sent as soon as it is closed (:class:`ShardUploader`), the rest at
    the end, the manifest last. A failure removes what was sent; no manifest is ever written."""
    from packdata import containers

    name = containers.for_destination(Path(url.split("://", 1)[1]), container).NAME
    if name != "tar":
        raise PackdataError(f"{url}: object storage takes tar shards (asked: {name}); LMDB and "
                            "HDF5 datasets are read through memory maps of local files, so "
                            "convert those to a local path")
    if resume:
        raise PackdataError(f"{url}: --resume needs a local destination (the finished parts "
                            "are kept beside it); convert to a local path, then upload")
    storage = storage or Storage()
    fs, remote = storage.filesystem(url)
    with errors(url):
        _retire(fs, remote, url, overwrite)
    staging = Path(tempfile.mkdtemp(prefix="packdata-upload-"))
    uploader = ShardUploader(staging / "dataset", url, storage) if streamed else None
    try:
        try:
            result = convert_locally(staging / "dataset")
            upload(result.path, url, storage, sent=uploader.finish() if uploader else [])
        except BaseException as exc:
            left = uploader.remove() if uploader else ""
            if left and isinstance(exc, PackdataError):
                raise type(exc)(f"{exc}{left}") from exc
            raise
        result.path = url  # type: ignore[assignment]
        return result
    finally:
        shutil.rmtree(staging, ignore_errors=True)


#: storage options by protocol, for the RemotePaths of this process (filled where a URL source
#: is opened, and by unpickling a RemotePath in a worker)
_OPTIONS: dict[str, dict[str, Any]] = {}


def _remote_path(url: str, storage_options: dict[str, Any] | None) -> RemotePath:
    return RemotePath.of(url, storage_options)


class RemotePath(type(Path())):  # type: ignore[misc]
    """An input file or folder at a URL, as a :class:`pathlib.Path` whose reads go through
    fsspec: ``read_bytes``, ``open``, ``stat``, ``is_file``, ``is_dir``, ``exists`` and listing
    (:meth:`files`) reach the object store; joining, ``name``, ``suffix`` and ``relative_to`` work
    as for any path. Sources read their inputs through these, so a URL source is read in place,
    in every worker, without a local copy. A worker opens its own filesystem (fsspec instances do
    not cross a fork); the storage options travel with the pickled path."""

    @classmethod
    def of(cls, url: str, storage_options: dict[str, Any] | None = None) -> RemotePath:
        protocol, rest = url.split("://", 1)
        if storage_options is not None:
            _OPTIONS[protocol] = dict(storage_options)
        return cls(f"{protocol}:", rest.strip("/"))

    @property
    def url(self) -> str:
        return f"{self.parts[0]}//" + "/".join(self.parts[1:])

    def __str__(self) -> str:  # a relative part (``relative_to``) is a plain path
        return self.url if self.parts and self.parts[0].endswith(":") else super().__str__()

    def __repr__(self) -> str:
        return f"RemotePath({self.url!r})"

    def __reduce__(self):  # type: ignore[override]
        return _remote_path, (self.url, _OPTIONS.get(self.parts[0][:-1]))

    def _fs(self) -> tuple[Any, str]:
        return Storage(_OPTIONS.get(self.parts[0][:-1], {})).filesystem(self.url)

    def read_bytes(self) -> bytes:
        fs, path = self._fs()
        return fs.cat_file(path)

    def read_text(self, encoding: str | None = None, errors: str | None = None) -> str:
        return self.read_bytes().decode(encoding or "utf-8", errors or "strict")

    def open(self, mode: str = "r", buffering: int = -1, encoding: str | None = None,
             errors: str | None = None, newline: str | None = None) -> Any:
        fs, path = self._fs()
        if "b" in mode:
            return fs.open(path, mode)
        return fs.open(path, mode, encoding=encoding, errors=errors, newline=newline)

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        fs, path = self._fs()
        size = fs.info(path).get("size") or 0
        return os.stat_result((0o100644, 0, 0, 1, 0, 0, size, 0, 0, 0))

    def exists(self, *args: Any, **kwargs: Any) -> bool:
        fs, path = self._fs()
        with errors(self.url):
            return fs.exists(path)

    def is_file(self, *args: Any, **kwargs: Any) -> bool:
        fs, path = self._fs()
        with errors(self.url):
            return fs.isfile(path)

    def is_dir(self, *args: Any, **kwargs: Any) -> bool:
        fs, path = self._fs()
        with errors(self.url):
            return fs.isdir(path)

    def files(self) -> list[str]:
        """Every file below this folder, as sorted relative POSIX paths (one listing call)."""
        fs, path = self._fs()
        with errors(self.url):
            found = fs.find(path)
        return sorted(p[len(path) :].lstrip("/") for p in found)

    def rglob(self, pattern: str) -> Any:  # type: ignore[override]
        if pattern != "*":
            raise NotImplementedError(f"{self}: only rglob('*') reaches object storage")
        return (self / f for f in self.files())
