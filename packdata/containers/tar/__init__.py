"""Tar-shard container: uncompressed POSIX tar files in webdataset's naming, plus an offset index.

The ``webdataset`` library and DALI's webdataset reader read the shards unchanged. One module per
part of the job: :mod:`.members` (member names and headers), :mod:`.writer`, :mod:`.layout`
(manifest, record index, shard list), :mod:`.reader`, :mod:`.indexes` (DALI and wids indexes) and
:mod:`.reindex` (those indexes for a dataset made before they were written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packdata.containers.base import holds_record_arrays, unreadable
from packdata.containers.tar.layout import INDEX, MANIFEST, RECORDS, read_manifest, shard_paths
from packdata.containers.tar.members import image_suffix, member_suffix
from packdata.containers.tar.reader import TarReader
from packdata.containers.tar.writer import TarWriter
from packdata.errors import DatasetError
from packdata.manifest import Manifest

NAME = "tar"
SUFFIXES = (".tar",)
NEW_SUFFIX = ""  # a tar dataset is a folder: a part of a sharded dataset is named part-000000/
WRITER = TarWriter
READER = TarReader

__all__ = ["INDEX", "MANIFEST", "NAME", "NEW_SUFFIX", "READER", "SUFFIXES", "WRITER", "TarReader",
           "TarWriter", "damaged", "destination", "detect", "image_suffix", "member_suffix", "open_url",
           "read_manifest", "shard_paths"]


def detect(path: Path) -> bool:
    """Whether ``path`` is a complete tar dataset (manifest and record index present)."""
    return (path.is_dir() and (path / MANIFEST).is_file() and (path / INDEX).is_file()
            and Manifest.is_packdata((path / MANIFEST).read_bytes()))


def open_url(url: str, storage: Any = None) -> TarReader:
    """The tar dataset at ``url`` (object storage), its shards fetched into a local cache, or
    read by ranges, as ``storage`` (a :class:`packdata.remote.storage.Storage`) says."""
    from packdata.remote.shards import shards_at

    shards = shards_at(url, storage)
    return TarReader(shards.root, shards)


def damaged(path: Path) -> str | None:
    """Why the folder at ``path``, a packdata tar dataset by its files (a manifest, and a record
    index holding the record arrays), cannot be read; None where nothing says it is one (or it
    lacks a part: :func:`packdata.containers.for_existing` says which)."""
    if not ((path / MANIFEST).is_file() and holds_record_arrays(path / INDEX, f"{RECORDS}.")):
        return None
    return unreadable((path / MANIFEST).read_bytes(), path)


def destination(dst: Path, options: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Where a tar dataset goes: ``out/`` as given; ``out/cifar-%04d.tar`` is the directory ``out``
    with shards named by the pattern; ``out.tar`` is the directory ``out`` with ``out-000000.tar``…"""
    if dst.suffix.lower() != ".tar":
        return dst, options
    if "%" not in dst.name:
        return dst.with_suffix(""), {**options, "pattern": f"{dst.stem}-%06d.tar"}
    if dst.parent in (Path(""), Path(".")):
        raise DatasetError(f"{dst}: put the shard pattern inside a directory, e.g. out/{dst.name}")
    try:
        dst.name % 0
    except (TypeError, ValueError):
        raise DatasetError(f"{dst}: the shard pattern needs one integer field like %06d") from None
    return dst.parent, {**options, "pattern": dst.name}
