"""The second copies of a tar dataset's small fields: each record's labels (and other fixed
fields of at most 32 bytes) are kept in the index, where packdata reads them, and as members of
the shards, where webdataset, DALI and tar itself read them. ``packdata verify`` checks that the
two agree."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from packdata.containers.tar.members import member_suffix
from packdata.manifest import Field

CLS_BYTES = 21  # a .cls member's most: a sign and an int64's 19 digits, and one to spare


def second_copies_match(fields: Mapping[str, Field], index: Mapping[str, np.ndarray],
                        idx: np.ndarray, in_shard: np.ndarray,
                        shard_map: Callable[[int], np.ndarray]) -> dict[str, np.ndarray]:
    """For each field kept in the ``index`` (``<field>.values``), whether the member of each of
    records ``idx`` (checked indices, in shards ``in_shard``; ``shard_map(s)``: shard ``s``'s
    bytes) holds the index's value, byte for byte as the writer encodes it (``.cls``: decimal
    text), for a batch at once."""
    match = {}
    for name, field in fields.items():
        if f"{name}.values" not in index:
            continue
        values = np.asarray(index[f"{name}.values"][idx])
        if member_suffix(name, field, values[:0]) == "cls":
            want = values.astype(np.int64).astype(f"S{CLS_BYTES}").view(np.uint8)
            want = want.reshape(len(idx), CLS_BYTES)
            sizes = (want != 0).sum(axis=1)  # decimal text holds no zero byte
        else:
            want = np.ascontiguousarray(values).view(np.uint8).reshape(len(idx), -1)
            sizes = np.full(len(idx), want.shape[1])
        shard, offset, nbytes = (index[f"{name}.{c}"][idx]
                                 for c in ("shard", "offset", "nbytes"))
        ok = (shard == in_shard) & (offset >= 0) & (nbytes == sizes)
        got = np.zeros_like(want)
        columns = np.arange(want.shape[1])
        for s in np.unique(shard[ok]).tolist():
            mapped = shard_map(s)
            rows = np.flatnonzero(ok & (shard == s))
            ok[rows] = offset[rows] <= len(mapped) - nbytes[rows]  # no overflow
            rows = rows[ok[rows]]
            at = np.minimum(offset[rows, None] + columns, max(len(mapped) - 1, 0))
            got[rows] = np.where(columns < nbytes[rows, None], mapped[at], 0)
        match[name] = ok & (got == want).all(axis=1)
    return match
