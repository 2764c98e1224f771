"""LMDB's B-tree read and checked by packdata: :class:`Tree` looks keys up itself, checking
only the pages on each key's path (O(depth)); :func:`check_tree` walks the whole tree before
LMDB is left to walk it (datasets without stored record offsets, read through LMDB's gets).

LMDB trusts the file: a damaged node (a value size, a child or overflow page number, a node
offset) makes a lookup read past the end of the file, which kills the process with SIGBUS (or
SIGSEGV past the mapping) instead of raising. So before a reader hands the file to LMDB, the
main database's tree is walked here, through a plain read-only map, with every offset bounded.
Only branch and leaf pages are read (a value's overflow pages are only bounded: their bytes are
checked against the records' checksums when read), with numpy over blocks of pages, once per
file and process tree (the result survives fork). The whole walk is O(pages), so readers use it
only for datasets without stored offsets; the others look up their few keys with :class:`Tree`,
which checks only the pages on each key's path.

The page format is LMDB 0.9's on-disk format (``mdb.c``: ``MDB_page``, ``MDB_node``,
``MDB_meta``); it has been stable since 2012 and py-lmdb bundles it.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from packdata.containers.base import map_file
from packdata.errors import DatasetError

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
PAGE_HEADER = 16  # mp_pgno u64, mp_pad u16, mp_flags u16, mp_lower u16, mp_upper u16
NODE_HEADER = 8  # mn_lo u16, mn_hi u16, mn_flags u16, mn_ksize u16
P_BRANCH, P_LEAF, P_OVERFLOW = 0x01, 0x02, 0x04
KINDS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40  # branch, leaf, overflow, meta, leaf2, sub-page
F_BIGDATA = 0x01  # the node's data is the number of its first overflow page
# MDB_meta after the page header: magic u32, version u32, address u64, mapsize u64, two MDB_db
# (pad u32, flags u16, depth u16, branch, leaf, overflow, entries, root: u64 each), last_pg u64,
# txnid u64
BLOCK = 1024  # pages checked at a time (4 MiB of 4 KiB pages)
HEADER = struct.Struct("<QHHHH")
NODE = struct.Struct("<HHHH")
META = struct.Struct("<IIQQ" + "IHHQQQQQ" * 2 + "QQ")


def check_tree(path: Path, last_pgno: int, txnid: int) -> None:
    """Raise DatasetError unless every lookup in the LMDB at ``path`` stays inside data.mdb.
    ``last_pgno`` and ``txnid`` are what LMDB itself took from the meta pages (``env.info()``):
    the meta checked here must be the one LMDB uses."""
    data = path / "data.mdb"
    whole = map_file(data)
    try:
        _check(whole, last_pgno, txnid)
    except DatasetError as exc:
        raise DatasetError(f"{data}: {exc}; the dataset is damaged") from None


def _meta(whole: np.ndarray, offset: int) -> tuple | None:
    if offset + PAGE_HEADER + META.size > len(whole):
        return None
    meta = META.unpack_from(whole, offset + PAGE_HEADER)
    return meta if meta[0] == MAGIC and meta[1] == DATA_VERSION else None


def _root(whole: np.ndarray, last_pgno: int, txnid: int) -> tuple[int, int, int, int | None]:
    """(page size, pages a lookup may touch, depth, root page or None) from the meta page
    LMDB uses."""
    first = _meta(whole, 0)
    if first is None:
        raise DatasetError("no LMDB meta page")
    psize = first[4]  # the free database's pad field holds the page size
    metas = [m for m in (first, _meta(whole, psize)) if m is not None]
    meta = max(metas, key=lambda m: m[-1])
    if meta[-1] != txnid or meta[-2] != last_pgno or psize < 512 or psize & (psize - 1):
        raise DatasetError("its meta pages do not agree with LMDB's")
    pages = min(last_pgno + 1, len(whole) // psize)
    depth, root = meta[14], meta[19]  # the main database's depth and root page
    return psize, pages, depth, None if root == (1 << 64) - 1 else root  # P_INVALID: empty


class Tree:
    """Keys of the LMDB at ``path`` looked up by packdata through a plain map of data.mdb, every
    page, node and value on the key's path bounded before it is read: O(depth) pages a lookup,
    whatever the file's size. The values are read-only views of the map (no copy)."""

    def __init__(self, path: Path, last_pgno: int, txnid: int) -> None:
        self.data = path / "data.mdb"
        self.whole = map_file(self.data)
        # keys found, by key: the tree is this process's for one version of the file, whose
        # opens look up the same few keys (the manifest, the offsets, the first and last record)
        self._found: dict[bytes, tuple[int, int] | None] = {}
        with self._named():
            self.psize, self.pages, self.depth, self.root = _root(self.whole, last_pgno, txnid)

    @contextlib.contextmanager
    def _named(self) -> Iterator[None]:
        try:
            yield
        except DatasetError as exc:
            raise DatasetError(f"{self.data}: {exc}; the dataset is damaged") from None

    def get(self, key: bytes) -> np.ndarray | None:
        """``key``'s value (uint8 view of the file), or None if the tree has no such key."""
        found = self.locate(key)
        return None if found is None else self.whole[found[0] : found[0] + found[1]]

    def locate(self, key: bytes) -> tuple[int, int] | None:
        """(file offset, size) of ``key``'s value, or None if the tree has no such key."""
        if key not in self._found:
            with self._named():
                self._found[key] = self._locate(key)
        return self._found[key]

    def _locate(self, key: bytes) -> tuple[int, int] | None:
        if self.root is None:
            return None
        pgno, psize = self.root, self.psize
        for height in range(self.depth, 0, -1):
            page, count, upper = self._page(pgno, leaf=height == 1)
            # LMDB's default order (mdb_cmp_memn): memcmp over the shorter key, then the shorter
            # first, which is how Python orders bytes. A branch's node 0 stands for every key
            # below node 1's; the child is the last node whose key is not above ``key``
            lo, hi = (1, count) if height > 1 else (0, count)
            while lo < hi:
                mid = (lo + hi) // 2
                if self._node(page, upper, mid)[1] <= key:
                    lo = mid + 1
                else:
                    hi = mid
            if height > 1:
                ptr = self._node(page, upper, lo - 1)[0]
                low, high, flags, _ = NODE.unpack_from(page, ptr)
                pgno = low | high << 16 | flags << 32  # the child: the node's first 48 bits
                continue
            if lo == 0:
                return None
            ptr, found = self._node(page, upper, lo - 1)
            if found != key:
                return None
            low, high, flags, ksize = NODE.unpack_from(page, ptr)
            size, end = low | high << 16, ptr + NODE_HEADER + ksize
            if flags & ~F_BIGDATA:
                raise DatasetError("a leaf page of its tree has nodes packdata never writes")
            if not flags & F_BIGDATA:
                if end + size > psize:
                    raise DatasetError("a leaf page of its tree has a value outside it")
                return pgno * psize + end, size
            if end + 8 > psize:
                raise DatasetError("a leaf page of its tree has a key outside it")
            first = int.from_bytes(page[end : end + 8], "little")
            if first < 2 or first * psize + PAGE_HEADER + size > self.pages * psize:
                raise DatasetError("a leaf page of its tree has a value that runs past the end "
                                   "of the file")
            return first * psize + PAGE_HEADER, size
        raise DatasetError("its tree has no leaf page")  # depth 0 with a root

    def _page(self, pgno: int, leaf: bool) -> tuple[np.ndarray, int, int]:
        """Page ``pgno`` (checked as a branch or leaf page), its number of nodes and the start
        of its nodes."""
        psize = self.psize
        if not 2 <= pgno < self.pages:
            raise DatasetError("a page of its tree is outside the file")
        page = self.whole[pgno * psize : (pgno + 1) * psize]
        number, _, flags, lower, upper = HEADER.unpack_from(page)
        if number != pgno or flags & KINDS != (P_LEAF if leaf else P_BRANCH) or \
                lower <= PAGE_HEADER or lower > upper or upper > psize or lower % 2:
            raise DatasetError("a page of its tree has a damaged header")
        return page, (lower - PAGE_HEADER) // 2, upper

    def _node(self, page: np.ndarray, upper: int, i: int) -> tuple[int, bytes]:
        """Node ``i`` of ``page`` (checked to lie inside it): its offset and key."""
        ptr = int.from_bytes(page[PAGE_HEADER + 2 * i : PAGE_HEADER + 2 * i + 2], "little")
        if ptr < upper or ptr > self.psize - NODE_HEADER or ptr % 2:
            raise DatasetError("a page of its tree has a node outside it")
        ksize = NODE.unpack_from(page, ptr)[3]
        if ptr + NODE_HEADER + ksize > self.psize:
            raise DatasetError("a page of its tree has a key outside it")
        return ptr, page[ptr + NODE_HEADER : ptr + NODE_HEADER + ksize].tobytes()


def _check(whole: np.ndarray, last_pgno: int, txnid: int) -> None:
    psize, pages, depth, root = _root(whole, last_pgno, txnid)
    if root is None:
        return
    table = whole[: pages * psize].reshape(pages, psize)
    seen = np.zeros(pages, dtype=bool)
    seen[:2] = True  # the meta pages
    level = np.array([root], dtype=np.int64)
    for height in range(depth, 0, -1):
        if level.min() < 2 or level.max() >= pages or seen[level].any() or \
                len(np.unique(level)) != len(level):
            raise DatasetError("a page of its tree is outside the file or reached twice")
        seen[level] = True
        level = np.concatenate([_pages(table, level[a : a + BLOCK], leaf=height == 1)
                                for a in range(0, len(level), BLOCK)])
    if len(level):
        raise DatasetError("the tree is deeper than its meta page says")


def _u(columns: np.ndarray, dtype: str) -> np.ndarray:
    """Little-endian integers from the byte columns of each row, as int64."""
    return np.ascontiguousarray(columns).view(dtype)[:, 0].astype(np.int64)


def _pages(table: np.ndarray, pgnos: np.ndarray, leaf: bool) -> np.ndarray:
    """Check branch or leaf pages ``pgnos`` (rows of ``table``: the file's pages); the branch
    pages' children."""
    pages, psize = table.shape
    block = table[pgnos]
    number, flags = _u(block[:, :8], "<u8"), _u(block[:, 10:12], "<u2")
    lower, upper = _u(block[:, 12:14], "<u2"), _u(block[:, 14:16], "<u2")
    # exactly a leaf or a branch: LMDB descends while a page says branch, stops at a leaf
    if (number != pgnos).any() or (flags & KINDS != (P_LEAF if leaf else P_BRANCH)).any() or \
            (lower <= PAGE_HEADER).any() or (lower > upper).any() or (upper > psize).any() \
            or (lower % 2).any():
        raise DatasetError("a page of its tree has a damaged header")
    counts = (lower - PAGE_HEADER) // 2  # nodes a page holds
    rows = np.repeat(np.arange(len(pgnos)), counts)
    cols = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    words = block.view("<u2")  # LMDB keeps nodes 2-byte aligned: read them as 16-bit words
    ptrs = words[rows, PAGE_HEADER // 2 + cols].astype(np.int64)
    if (ptrs < upper[rows]).any() or (ptrs > psize - NODE_HEADER).any() or (ptrs % 2).any():
        raise DatasetError("a page of its tree has a node outside it")
    lo, hi, nflags, ksize = (words[rows, ptrs // 2 + i].astype(np.int64) for i in range(4))
    key_end = ptrs + NODE_HEADER + ksize
    if not leaf:  # the child's page number is the first 48 bits of the node
        if (key_end > psize).any():
            raise DatasetError("a branch page of its tree has a key outside it")
        return lo | hi << 16 | nflags << 32
    size = lo | hi << 16
    big = (nflags & F_BIGDATA) != 0
    if (nflags & ~F_BIGDATA).any():
        raise DatasetError("a leaf page of its tree has nodes packdata never writes")
    if (key_end + np.where(big, 8, size) > psize).any():
        raise DatasetError("a leaf page of its tree has a key or value outside it")
    ends, nbytes = key_end[big], size[big]
    firsts = _u(block[rows[big][:, None], ends[:, None] + np.arange(8)], "<u8")
    # LMDB reads a value from its first overflow page on, without looking at the pages' headers:
    # the value's bytes must end inside the file (not touching the overflow pages keeps this
    # check at the tree's size, not the data's)
    if len(firsts) and (firsts.min() < 2 or (firsts * psize + PAGE_HEADER + nbytes
                                              > pages * psize).any()):
        raise DatasetError("a leaf page of its tree has a value that runs past the end of the "
                           "file")
    return np.zeros(0, dtype=np.int64)
