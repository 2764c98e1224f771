"""Input files at a URL, read in place through fsspec: a URL source (``s3://bucket/raw``) is
listed once and each worker reads the files it is given, without a local copy of the tree."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from packdata.remote.storage import Storage, errors

#: storage options by protocol, for the RemotePaths of this process (filled where a URL source
#: is opened, and by unpickling a RemotePath in a worker)
_OPTIONS: dict[str, dict[str, Any]] = {}
#: bytes fetched ahead by :func:`fetch_all`, by URL, served (once) by the next read; and sizes
_FETCHED: dict[str, bytes] = {}
_SIZES: dict[str, int] = {}


def fetch_all(paths: list[Any]) -> None:
    """Fetch the files of the RemotePaths among ``paths`` in one batch of concurrent GETs (the
    filesystem's async ``cat``), for their next ``read_bytes``/``open`` to serve: a worker given a
    block of URL inputs waits for one round trip, not one per file. Local paths are left alone;
    a file that fails here fails again, named, when it is read."""
    remote = list(dict.fromkeys(p for p in paths if isinstance(p, RemotePath)))
    _FETCHED.clear()
    _SIZES.clear()
    if not remote:
        return
    fs, _ = remote[0]._fs()
    keys = {p._fs()[1]: p.url for p in remote}
    try:
        got = fs.cat(list(keys), on_error="return")
    except Exception:  # noqa: BLE001 - each file is read again, one by one, with its error named
        return
    for key, data in got.items():
        url = keys.get(key) or keys.get(key.split("://", 1)[-1])
        if url and isinstance(data, bytes):
            _FETCHED[url], _SIZES[url] = data, len(data)


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
        if self.url in _FETCHED:
            return _FETCHED.pop(self.url)
        fs, path = self._fs()
        return fs.cat_file(path)

    def read_text(self, encoding: str | None = None, errors: str | None = None) -> str:
        return self.read_bytes().decode(encoding or "utf-8", errors or "strict")

    def open(self, mode: str = "r", buffering: int = -1, encoding: str | None = None,
             errors: str | None = None, newline: str | None = None) -> Any:
        if mode == "rb" and self.url in _FETCHED:
            return io.BytesIO(_FETCHED.pop(self.url))
        fs, path = self._fs()
        if "b" in mode:
            return fs.open(path, mode)
        return fs.open(path, mode, encoding=encoding, errors=errors, newline=newline)

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        size = _SIZES.get(self.url)
        if size is None:
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
