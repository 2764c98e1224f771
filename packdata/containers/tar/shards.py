"""Where a tar dataset's files come from: the seam between :class:`~packdata.containers.tar.
reader.TarReader` and storage.

A shard source hands the reader a local folder holding the manifest and the record index, and
each shard as a local file (:meth:`ShardSource.file`), or, for a source that reads by ranges,
the bytes a batch's records need (:meth:`ShardSource.ranges`). This one is a folder on this
machine's disk; object storage's (a bounded cache of shards fetched from a URL, or ranged
requests) is :class:`packdata.remote.shards.CachedShards`. The container table chooses between
them (:func:`packdata.containers.open_reader`), for paths and URLs alike.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from packdata.errors import DatasetError


class ShardSource:
    """A tar dataset in a folder on this machine: its shards are its files, where they lie."""

    #: whether every shard stays where it is while the reader is open, so that all may be
    #: mapped back to back at once (the reader's joined map and batch plan)
    STAYS: ClassVar[bool] = True
    #: whether a shard's file is a copy fetched from elsewhere, whose records the reader checks
    #: against their checksums once, before serving any of them
    FETCHED: ClassVar[bool] = False
    #: whether batches are read by ranged requests for their records' bytes (:meth:`ranges`),
    #: no shard being fetched whole
    RANGED: ClassVar[bool] = False

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)  # the folder holding the manifest and the record index

    def where(self, name: str) -> str:
        """How errors name shard ``name`` (here, its path)."""
        return str(self.root / name)

    def file(self, name: str) -> Path:
        """The local file of shard ``name`` (fetched first, where it is elsewhere); a
        DatasetError naming it if it is missing."""
        path = self.root / name
        if not path.is_file():
            raise DatasetError(f"{path}: shard missing; the dataset is incomplete")
        return path

    def fetched(self, name: str) -> list[str]:
        """Shard ``name`` was just mapped (and checked): the shards whose local copies went
        since (a bounded cache), whose maps the reader must drop."""
        return []

    def discard(self, name: str) -> None:
        """Shard ``name``'s copy failed its checks: removed, to be fetched again."""

    def order(self, names: Sequence[str]) -> None:
        """The order the reader will read shards in (a source that fetches reads ahead)."""

    def ranges(self, names: Sequence[str], starts: Sequence[int], ends: Sequence[int]
               ) -> list[bytes]:
        """Bytes ``starts[j]:ends[j]`` of shard ``names[j]`` for each ``j``, read together (a
        source that declares :attr:`RANGED`); a DatasetError naming a shard missing or cut."""
        raise NotImplementedError(f"{type(self).__name__} does not declare RANGED")

    def size(self, name: str) -> int:
        """Bytes stored of file ``name``."""
        return (self.root / name).stat().st_size

    def stored_bytes(self) -> int:
        """Bytes stored under the dataset."""
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())

    def publish(self, made: Sequence[Path]) -> list[str]:
        """Files made elsewhere (reader indexes) placed beside the dataset's; where they are."""
        return [str(shutil.move(path, self.root / path.name)) for path in made]

    def close(self) -> None:
        """Stop any work in flight (fetches ahead)."""
