"""Several files mapped back to back into one range of addresses, as one read-only uint8 array.

A batch drawn from several tar shards is then one numpy gather over byte addresses, where a map
per file needs a gather per shard and a second copy to put the rows in order. Linux only
(``mmap`` with ``MAP_FIXED`` through ctypes); :func:`map_joined` returns None where that is not
available, and callers keep their per-file path.

The last few maps stay mapped in the process (:data:`KEPT`; one file's too, :func:`map_kept`),
found again by their files' identity (:mod:`packdata.kept`): a dataset reopened in the same
process (a script that opens per epoch) reads through the map, and the page-table entries, that
the last open built, as LMDB's one environment per file and process does. A file replaced or
changed in size is mapped anew; a kept map whose first file is gone or replaced is let go at the
next call, so that deleting a dataset frees its disk space (a mapped file's blocks stay while it
is mapped).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

import numpy as np

from packdata.containers.base import map_file
from packdata.kept import KeptByFiles

_PROT_NONE, _MAP_FIXED, _MAP_NORESERVE = 0, 0x10, 0x4000  # Linux values
_FAILED = ctypes.c_void_p(-1).value


def _libc() -> ctypes.CDLL | None:
    if os.name != "posix" or not hasattr(mmap, "MAP_ANONYMOUS"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc() if os.uname().sysname == "Linux" else None  # flag values above are Linux's

#: joined maps kept in the process after their datasets close (see the module's docstring)
KEPT: KeptByFiles[tuple[np.ndarray, np.ndarray]] = KeptByFiles(keep=8)


def map_joined(paths: list[Path]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(whole, starts)``: every file of ``paths`` mapped read-only, file ``i`` from
    ``whole[starts[i]]`` on (each at a page boundary); None where joined maps are not available.
    The addresses stay mapped while ``whole`` or any view of it lives."""
    if _LIBC is None:
        return None
    return KEPT.get(paths, lambda stats: _map_joined(paths, [st.st_size for st in stats]))


def map_kept(path: Path) -> np.ndarray:
    """One file as a read-only uint8 array over a map kept in the process like a joined one
    (see the module's docstring: a dataset reopened here reads through the page-table entries
    its last open built); a plain map (:func:`packdata.containers.base.map_file`) where joined
    maps are not available."""
    size = os.stat(path).st_size
    joined = map_joined([Path(path)]) if size else None
    return map_file(path) if joined is None else joined[0][:size]


def _map_joined(paths: list[Path], sizes: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
    spans = [-(-s // mmap.PAGESIZE) * mmap.PAGESIZE for s in sizes]
    starts = np.concatenate([[0], np.cumsum(spans, dtype=np.int64)])
    total = int(starts[-1])
    if total == 0:
        return None
    base = _LIBC.mmap(None, total, _PROT_NONE,
                      mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
    if base in (None, _FAILED):
        return None
    # unmapped when the last array over it goes (numpy keeps this object as the arrays' base)
    region = type("JoinedRegion", (ctypes.c_uint8 * total,),
                  {"__del__": lambda self, b=base, n=total, libc=_LIBC: libc.munmap(b, n)}).from_address(base)
    for path, size, start in zip(paths, sizes, starts.tolist()):
        if size == 0:
            continue
        with open(path, "rb") as f:
            got = _LIBC.mmap(base + start, size, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED,
                             f.fileno(), 0)
        if got != base + start:
            return None  # region goes with its reservation
    # frombuffer, not np.ctypeslib.as_array, which imports numpy.ctypeslib and builds a dtype
    # from the ctypes type at each process's first open
    whole = np.frombuffer(region, dtype=np.uint8)
    whole.flags.writeable = False
    return whole, starts[:-1]


def byte_window(whole: np.ndarray, nbytes: int) -> np.ndarray:
    """A (positions, nbytes) view of ``whole`` whose row ``k`` is ``whole[k : k + nbytes]``: rows
    at any byte addresses are one gather, ``byte_window(whole, n)[addresses]``."""
    return np.lib.stride_tricks.as_strided(
        whole, shape=(max(len(whole) - nbytes + 1, 0), nbytes), strides=(1, 1), writeable=False)
