"""What a process read from files, kept and found again by the files' identity.

Opening a dataset reads the same structure every time: an HDF5 file's layout, the member
headers of an index's ``.npz``, its files' maps. A script that opens per epoch, and
``packdata.open`` itself (detection, then the open), would pay that each time (for HDF5 through
h5py, several library calls an object). Such values are kept here, a few per kind,
under the identity of the files they came from (device, inode, size, modification time): a file
replaced or rewritten has another identity and is read anew. An entry whose first file is gone
or replaced is let go at the next lookup, so that what it holds (a file's map keeps the file's
blocks on disk) does not outlive the file.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


def identity_of(st: os.stat_result) -> tuple:
    """What tells one file from another here: device, inode, size and modification time."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def identity(path: Path) -> tuple | None:
    """:func:`identity_of` the file at ``path``; None where there is none."""
    try:
        return identity_of(os.stat(path))
    except OSError:
        return None


class KeptByFiles(Generic[T]):
    """Up to ``keep`` values, each read from a list of files, found again while the files
    are unchanged (see the module's docstring). Lookups take a lock (loader threads open
    datasets too), made anew in a forked child."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._kept: OrderedDict[tuple, tuple[Path, T]] = OrderedDict()
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):  # a thread of the parent may hold it at the fork
            os.register_at_fork(after_in_child=self._new_lock)

    def _new_lock(self) -> None:
        self._lock = threading.Lock()

    def get(self, paths: Sequence[Path],
            read: Callable[[list[os.stat_result]], T | None]) -> T | None:
        """The value kept for ``paths`` as they are now, else ``read(stats)`` (the files'
        ``os.stat`` that identified them), kept unless None. ``os.stat``'s errors propagate."""
        stats = [os.stat(p) for p in paths]
        key = tuple(map(identity_of, stats))
        with self._lock:
            for kept, (first, _) in list(self._kept.items()):
                if kept != key and identity(first) != kept[0]:
                    del self._kept[kept]
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key][1]
        value = read(stats)
        if value is not None:
            with self._lock:
                self._kept[key] = (Path(paths[0]), value)
                while len(self._kept) > self.keep:
                    self._kept.popitem(last=False)
        return value

    def firsts(self) -> list[tuple[Path, T]]:
        """(first file, value) of every entry kept, oldest first."""
        with self._lock:
            return list(self._kept.values())
