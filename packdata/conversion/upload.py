"""Writing a tar dataset to object storage (:func:`staged`, around the conversion's one write):
each shard is uploaded as soon as the writer closes it, while the next ones are written; the
record index and the manifest last, so a reader never finds a half-written dataset at the URL.
A failed conversion removes what it sent."""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packdata.containers import tar
from packdata.containers.base import ShardClosed
from packdata.containers.tar.indexes import WIDS_INDEX
from packdata.conversion.job import Destination
from packdata.errors import DatasetError, OutputExistsError, PackdataError
from packdata.manifest import Manifest
from packdata.remote.storage import Storage, errors


class ShardUploader:
    """Uploads each shard the tar writer announces closed (with its DALI index) in a background
    thread, while the next shards are still being written. Called with a shard's files, it is the
    writer's ``on_shard_closed``. The manifest is never uploaded here: :func:`upload` sends it
    last."""

    def __init__(self, final: Path, url: str, storage: Storage) -> None:
        self.final, self.url = final, url  # where the shards are once the conversion committed
        self.fs, self.remote = storage.filesystem(url)
        self.uploaded: list[str] = []  # remote names of the shards sent, in order
        self.error: BaseException | None = None
        self._queue: queue.Queue[list[Path] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="packdata-upload", daemon=True)
        self._thread.start()

    def __call__(self, files: list[Path]) -> None:
        self._queue.put(files)

    def _run(self) -> None:
        while (files := self._queue.get()) is not None:
            try:
                for path in files:
                    self._send(path)
                self.uploaded.append(files[0].name)
            except BaseException as exc:  # noqa: BLE001 - handed to the converting thread
                self.error = exc
                return

    def _send(self, path: Path) -> None:
        """Upload one closed file: written under the conversion's partial name, it is in the
        final folder once the conversion committed (a rename that may fall between tries)."""
        with errors(self.url):
            for candidate in (path, self.final / path.name):
                try:
                    self.fs.put_file(str(candidate), f"{self.remote}/{path.name}")
                    return
                except FileNotFoundError:
                    continue
        raise PackdataError(f"{path.name}: announced closed, but neither in the partial output "
                            f"nor in {self.final}")

    def _stop(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def finish(self) -> list[str]:
        """Wait for the shards announced so far; the names sent (an upload failure is raised)."""
        self._stop()
        if self.error is not None:
            raise self.error
        return self.uploaded

    def remove(self) -> str:
        """Delete what was sent (after a failure); a sentence saying what is left, if any."""
        self._stop()
        names = [n for s in self.uploaded for n in (s, Path(s).with_suffix(".idx").name)]
        try:
            if names:
                self.fs.rm([f"{self.remote}/{n}" for n in names])
        except Exception as exc:  # noqa: BLE001 - reported, the original failure is raised
            return (f"; {len(self.uploaded)} shards already uploaded to {self.url} could not be "
                    f"removed ({exc.__class__.__name__}: {exc}): delete them by hand")
        return ""


def upload(local: Path, url: str, storage: Storage, sent: list[str]) -> None:
    """Send the tar dataset at ``local`` to ``url``: its shards but those already ``sent``, with
    their DALI indexes, then the record and wids indexes, the manifest last."""
    fs, remote = storage.filesystem(url)
    with errors(url):
        manifest = Manifest.from_json((local / tar.MANIFEST).read_text(), str(local))
        names = [s["name"] for s in manifest.extra["shards"] if s["name"] not in set(sent)]
        names += [Path(n).with_suffix(".idx").name for n in names]
        names = [n for n in names if (local / n).is_file()] + \
            [n for n in (tar.INDEX, WIDS_INDEX) if (local / n).is_file()]
        fs.put([str(local / n) for n in names], [f"{remote}/{n}" for n in names])
        fs.put_file(str(local / tar.MANIFEST), f"{remote}/{tar.MANIFEST}")


def _check_bucket(fs: Any, remote: str, url: str) -> None:
    """Before anything is converted: the bucket is there (asking reaches the endpoint, with the
    credentials found, so those failures are named now too, not after the conversion)."""
    bucket = remote.split("/", 1)[0]
    if not bucket:  # a path from the root (file://): folders are made as needed
        return
    try:
        fs.info(bucket)  # not exists(), which answers False for an endpoint it cannot reach
    except FileNotFoundError:
        raise DatasetError(f"{url}: no such bucket '{bucket}'; create it first, or check the "
                           "name") from None


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


@contextlib.contextmanager
def staged(target: Destination, storage: Storage, overwrite: bool, streamed: bool = True
           ) -> Iterator[tuple[Destination, ShardClosed | None]]:
    """Around a conversion's one write into ``target``: the destination to write and the
    writer's ``on_shard_closed``. A local destination is written as it is. For object storage,
    before anything is converted the bucket is checked and a dataset already at the URL refused
    or (``overwrite``) retired; the write goes to a local staging folder, each shard sent as the
    writer announces it closed (``streamed``), the rest on leaving, the manifest last. A failure
    removes what was sent; no manifest is ever written then. The staging folder goes either way."""
    if target.url is None:
        yield target, None
        return
    url = target.url
    fs, remote = storage.filesystem(url)
    with errors(url):
        _check_bucket(fs, remote, url)
        _retire(fs, remote, url, overwrite)
    staging = Path(tempfile.mkdtemp(prefix="packdata-upload-"))
    try:
        here = dataclasses.replace(target, path=staging / "dataset")
        uploader = ShardUploader(here.path, url, storage) if streamed else None
        try:
            yield here, uploader
            upload(here.path, url, storage, sent=uploader.finish() if uploader else [])
        except BaseException as exc:
            left = uploader.remove() if uploader else ""
            if left and isinstance(exc, PackdataError):
                raise type(exc)(f"{exc}{left}") from exc
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
