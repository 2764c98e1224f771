"""A tar reader's shards as it maps them: each once its size is checked, from its
:class:`~packdata.containers.tar.shards.ShardSource` (a local folder, or a cache of object
storage's shards, where a fetched shard is handed to the reader to check before any of its
records is served), all of them back to back where the source keeps them in place, and each
dropped with its views when the source lets its copy go."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from packdata.containers.base import map_file
from packdata.containers.joined import byte_window, map_joined
from packdata.containers.tar.shards import ShardSource
from packdata.errors import DatasetError


class MappedShards:
    """Shards ``shards`` (the manifest's list: name, records, bytes where recorded) of
    ``source``, mapped on demand. ``needed(shard)``: the bytes its records need (from the
    index), its size where none was recorded; ``arrived(shard)``: checks a fetched shard's
    records, once mapped (a DatasetError discards the copy)."""

    def __init__(self, source: ShardSource, shards: list[dict[str, Any]],
                 needed: Callable[[int], int], arrived: Callable[[int], None]) -> None:
        self.source, self.names, self._shards = source, [s["name"] for s in shards], shards
        self._needed, self._arrived = needed, arrived
        #: bytes there of each truncated shard, when reads of the records before a cut are
        #: allowed (:meth:`allow_cuts`); None: a truncated shard fails every read of it
        self.cut: dict[int, int] | None = None
        self._maps: dict[int, np.ndarray] = {}
        self._views: dict[tuple[str, int], np.ndarray | None] = {}
        self._joined: tuple[np.ndarray, np.ndarray] | None | bool = False  # False: not tried
        self._joining = threading.Lock()
        self._windows: dict[int, np.ndarray] = {}

    def __getitem__(self, shard: int) -> np.ndarray:
        """Shard ``shard``'s bytes, mapped once its size is checked (fetched first, and then
        its records checked, where the source fetches)."""
        if shard not in self._maps:
            name = self.names[shard]
            for attempt in range(3):  # a cache shared with other processes may drop it meanwhile
                try:
                    mapped = map_file(self.source.file(name))
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise
            # the size conversion recorded (O(1)); else what the shard's records need
            size = self.recorded(shard)
            exact = isinstance(size, int)
            needed = size if exact else self._needed(shard)
            if len(mapped) < needed and self.cut is not None:  # verify: reads before the cut
                self.cut[shard] = len(mapped)
            elif len(mapped) < needed:
                what = "the manifest records" if exact else "the index needs"
                raise DatasetError(f"{self.source.where(name)}: shard truncated ({len(mapped)} "
                                   f"bytes, {what} {needed}); the dataset is damaged")
            self._maps[shard] = mapped
            if self.source.FETCHED:
                try:
                    self._arrived(shard)
                except DatasetError:
                    self.forget(shard)
                    self.source.discard(name)
                    raise
            for gone in self.source.fetched(name):
                self.forget(self.names.index(gone))
        return self._maps[shard]

    def recorded(self, shard: int) -> int | None:
        """Shard ``shard``'s size as conversion recorded it (None in older manifests)."""
        return self._shards[shard].get("bytes")

    def forget(self, shard: int) -> None:
        """Drop shard ``shard``'s map and its views (its copy went, or failed its checks)."""
        self._maps.pop(shard, None)
        for key in [k for k in self._views if k[1] == shard]:
            del self._views[key]

    def view(self, name: str, shard: int, make: Callable[[np.ndarray], np.ndarray | None]
             ) -> np.ndarray | None:
        """Field ``name``'s view over shard ``shard``, made once by ``make(its bytes)``."""
        if (name, shard) not in self._views:
            self._views[name, shard] = make(self[shard])
        return self._views[name, shard]

    def allow_cuts(self) -> None:
        """Read the records before the end of a truncated shard (no joined map from now on)."""
        self.cut, self._joined = {}, False

    def joined(self) -> tuple[np.ndarray, np.ndarray] | None:
        """All shards mapped back to back (see :mod:`packdata.containers.joined`), once each
        was checked as they are one by one; None where that is not available, where a shard
        is damaged (the others still read, one by one), where truncated shards are read up to
        their cut, or where the source does not keep its shards in place."""
        if self._joined is False:
            with self._joining:  # loader threads share a reader: none sees it half made
                if self._joined is False:
                    self._joined = self._join()
        return self._joined  # type: ignore[return-value]

    def _join(self) -> tuple[np.ndarray, np.ndarray] | None:
        if not self.source.STAYS or self.cut is not None:
            return None
        try:
            for shard in range(len(self.names)):
                self[shard]
        except DatasetError:
            return None
        return map_joined([self.source.file(n) for n in self.names])

    def window(self, nbytes: int) -> np.ndarray:
        """Rows of ``nbytes`` at every byte of the joined map (which must be there)."""
        if nbytes not in self._windows:
            self._windows[nbytes] = byte_window(self._joined[0], nbytes)  # type: ignore[index]
        return self._windows[nbytes]

    def clear(self) -> None:
        """Unmap everything (a forked process clears its parent's maps so)."""
        self._views.clear()
        self._maps.clear()
        self._windows.clear()
        self._joined = False
