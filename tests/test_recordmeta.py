"""The record keys and checksums that conversion spools beside its output (packdata.recordmeta):
past SORT_IN_MEMORY records the key hashes are sorted bucket by bucket on disk, in memory flat in
their number, with the result of the in-memory sort."""

from __future__ import annotations

import numpy as np
import pytest

from packdata import recordmeta, spooling

KEYS = [f"docs/part-{i % 7}/{i:06d}" for i in range(5000)] + ["same", "same"]


def spooled(stem) -> recordmeta.MetaSpool:
    spool = recordmeta.MetaSpool(stem)
    spool.append_block(KEYS[:3000], np.arange(3000))
    for i, key in enumerate(KEYS[3000:], 3000):
        spool.append(key, i)
    return spool


def test_hashes_sorted_on_disk_match_the_in_memory_sort(tmp_path, monkeypatch):
    want, want_sums = spooled(tmp_path / "memory").finish()
    monkeypatch.setattr(spooling, "SORT_IN_MEMORY", 100)
    monkeypatch.setattr(spooling, "SORT_BLOCK", 700)  # several blocks into the buckets
    spool = spooled(tmp_path / "disk")
    got, got_sums = spool.finish()
    assert np.all(np.diff(got.hashes.astype(np.float64)) >= 0)
    np.testing.assert_array_equal(got.hashes, want.hashes)
    np.testing.assert_array_equal(got.order, want.order)  # equal hashes in record order too
    np.testing.assert_array_equal(got_sums, want_sums)
    assert [got.index_of(k) for k in KEYS[:-2]] == list(range(len(KEYS) - 2))
    assert got.index_of("same") == len(KEYS) - 2
    assert not [p.name for p in tmp_path.iterdir() if "bucket" in p.name]
    spool.remove()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("disk")]


def test_keys_are_looked_up_as_a_list_and_a_dict_are(tmp_path):
    keys, _ = spooled(tmp_path / "k").finish()
    for bad in ("a", 2.5, None):  # int('a') was a ValueError, and 2.5 read key 2
        with pytest.raises(TypeError):
            keys[bad]
    assert keys[np.int64(3)] == KEYS[3] and keys[-3] == KEYS[-3]
    with pytest.raises(TypeError, match="keys are strings"):  # was "'int' has no 'encode'"
        keys.index_of(5)
    with pytest.raises(KeyError):
        keys.index_of("docs/part-0/nope")
    assert 5 not in keys and "docs/part-0/nope" not in keys and KEYS[7] in keys
