"""LMDB's B-tree checked before LMDB walks it: every page a lookup can reach lies inside
data.mdb and every node and value inside its page (or its overflow pages).

LMDB trusts the file: a damaged node (a value size, a child or overflow page number, a node
offset) makes a lookup read past the end of the file, which kills the process with SIGBUS (or
SIGSEGV past the mapping) instead of raising. So before a reader hands the file to LMDB, the
main database's tree is walked here, through a plain read-only map, with every offset bounded.
Only the pages a lookup can reach are read: branch and leaf pages and the first page of each
value's overflow run (the values' bytes are checked against their checksums when read).

The page format is LMDB 0.9's on-disk format (``mdb.c``: ``MDB_page``, ``MDB_node``,
``MDB_meta``); it has been stable since 2012 and py-lmdb bundles it.
"""

from __future__ import annotations

import struct
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


def _check(whole: np.ndarray, last_pgno: int, txnid: int) -> None:
    first = _meta(whole, 0)
    if first is None:
        raise DatasetError("no LMDB meta page")
    psize = first[4]  # the free database's pad field holds the page size
    metas = [m for m in (first, _meta(whole, psize)) if m is not None]
    meta = max(metas, key=lambda m: m[-1])
    if meta[-1] != txnid or meta[-2] != last_pgno or psize < 512 or psize & (psize - 1):
        raise DatasetError("its meta pages do not agree with LMDB's")
    pages = min(last_pgno + 1, len(whole) // psize)  # pages a lookup may touch
    depth, root = meta[14], meta[19]  # the main database's depth and root page
    if root == (1 << 64) - 1:  # P_INVALID: an empty database
        return
    level, seen = [root], {0, 1}
    for height in range(depth, 0, -1):
        children: list[int] = []
        for pgno in level:
            if pgno in seen or not 2 <= pgno < pages:
                raise DatasetError(f"page {pgno} is outside the file or reached twice")
            seen.add(pgno)
            children.extend(_page(whole, pgno, psize, pages, leaf=height == 1))
        level = children
    if level:
        raise DatasetError("the tree is deeper than its meta page says")


def _page(whole: np.ndarray, pgno: int, psize: int, pages: int, leaf: bool) -> list[int]:
    """Check one branch or leaf page; a branch page's children."""
    at = pgno * psize
    page = whole[at : at + psize]
    number, flags, lower, upper = struct.unpack_from("<QxxHHH", page)
    # exactly a leaf or a branch: LMDB descends while a page says branch, stops at a leaf
    if number != pgno or flags & KINDS != (P_LEAF if leaf else P_BRANCH) or \
            not PAGE_HEADER <= lower <= upper <= psize or lower % 2:
        raise DatasetError(f"page {pgno} has a damaged header")
    ptrs = page[PAGE_HEADER:lower].view("<u2").astype(np.int64)
    if not len(ptrs):
        raise DatasetError(f"page {pgno} holds no nodes")
    if ptrs.min() < upper or ptrs.max() > psize - NODE_HEADER:
        raise DatasetError(f"page {pgno} has a node outside it")
    heads = page[ptrs[:, None] + np.arange(NODE_HEADER)].view("<u2")
    lo, hi, nflags, ksize = (heads[:, i].astype(np.int64) for i in range(4))
    key_end = ptrs + NODE_HEADER + ksize
    if not leaf:  # the child's page number is the first 48 bits of the node
        if key_end.max() > psize:
            raise DatasetError(f"page {pgno} has a key outside it")
        return (lo | hi << 16 | nflags << 32).tolist()
    size = lo | hi << 16
    big = (nflags & F_BIGDATA) != 0
    if (nflags & ~F_BIGDATA).any():
        raise DatasetError(f"page {pgno} has nodes packdata never writes")
    if (key_end + np.where(big, 8, size)).max() > psize:
        raise DatasetError(f"page {pgno} has a key or value outside it")
    ends, nbytes = key_end[big], size[big]
    if not len(ends):
        return []
    firsts = page[ends[:, None] + np.arange(8)].view("<u8")[:, 0].astype(np.int64)
    if firsts.min() < 2 or firsts.max() >= pages:
        raise DatasetError(f"page {pgno} points to an overflow page outside the file")
    heads = whole[firsts[:, None] * psize + np.arange(PAGE_HEADER)]
    number = heads[:, :8].copy().view("<u8")[:, 0].astype(np.int64)
    flags = heads[:, 10:12].copy().view("<u2")[:, 0]
    count = heads[:, 12:16].copy().view("<u4")[:, 0].astype(np.int64)
    if (number != firsts).any() or (flags & KINDS != P_OVERFLOW).any() or \
            (firsts + count > pages).any() or (nbytes > count * psize - PAGE_HEADER).any():
        raise DatasetError(f"page {pgno} has a value outside its overflow pages")
    return []
