"""Joined maps (packdata/containers/joined.py): files mapped read-only, one after another at page
boundaries, unmapped once the last array over them goes."""

from __future__ import annotations

import gc
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from packdata.containers import joined

pytestmark = pytest.mark.skipif(joined._LIBC is None, reason="joined maps are Linux's")


def mapped_inodes() -> set[int]:
    with open("/proc/self/maps") as maps:
        return {int(line.split()[4]) for line in maps if len(line.split()) >= 6}


def test_files_are_mapped_at_page_boundaries_and_let_go_with_their_last_view(tmp_path):
    rng = np.random.default_rng(0)
    payloads = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (5000, 1, 8192)]
    paths = []
    for i, data in enumerate(payloads):
        paths.append(Path(tmp_path / f"part{i}"))
        paths[-1].write_bytes(data)
    whole, starts = joined._map_joined(paths, [len(p) for p in payloads])
    assert whole.dtype == np.uint8 and not whole.flags.writeable
    assert list(starts) == [0, 2 * mmap.PAGESIZE, 3 * mmap.PAGESIZE]
    for data, start in zip(payloads, starts):
        assert whole[start : start + len(data)].tobytes() == data
    inodes = {os.stat(p).st_ino for p in paths}
    assert inodes <= mapped_inodes()
    tail = whole[starts[2] :]  # a view outlives the array it came from
    del whole
    gc.collect()
    assert inodes <= mapped_inodes()
    assert tail[: len(payloads[2])].tobytes() == payloads[2]
    del tail
    gc.collect()
    assert not inodes & mapped_inodes()
