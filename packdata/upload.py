"""Writing a tar dataset to object storage: each shard is uploaded as soon as the writer closes
it, while the next ones are written; the record index and the manifest last, so a reader never
finds a half-written dataset at the URL. A failed conversion removes what it sent."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from packdata.containers import tar
from packdata.errors import OutputExistsError, PackdataError
from packdata.manifest import Manifest
from packdata.reader_index import WIDS_INDEX
from packdata.storage import Storage, errors


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
                    with errors(self.url):
                        try:
                            self.fs.put_file(str(shard), f"{self.remote}/{shard.name}")
                            self.fs.put_file(str(idx), f"{self.remote}/{idx.name}")
                        except FileNotFoundError:  # renamed into place meanwhile: next sweep
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
