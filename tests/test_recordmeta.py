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


def test_keys_are_as_documented_for_every_kind(tmp_path, png_folder):
    """What Dataset.keys says of each kind: images and point clouds keep their path without
    suffix, text keeps its suffix, ``:LINE`` for a line and ``#N`` for a chunk."""
    import json
    import shutil
    from pathlib import Path

    import packdata

    def keys(src, **options):
        out = tmp_path / f"k{len(list(tmp_path.iterdir()))}.h5"
        return list(packdata.open(packdata.convert(packdata.open_source(src, **options), out,
                                                   workers=1).path).keys)

    images = keys(png_folder)
    assert images == sorted(p.stem for p in png_folder.glob("*.png"))
    clouds = tmp_path / "clouds" / "sub"
    clouds.mkdir(parents=True)
    lidar = Path(__file__).parent / "fixtures" / "lidar"
    for f in sorted(lidar.glob("ahn_*.la[sz]"))[:2]:
        shutil.copy(f, clouds / f.name)
    assert keys(clouds.parent, points=64) == sorted(
        f"sub/{p.stem}" for p in clouds.glob("*.la[sz]"))
    docs = tmp_path / "docs"
    (docs / "d").mkdir(parents=True)
    (docs / "d" / "a.txt").write_text("one\n\ntwo\n")
    assert keys(docs, kind="text") == ["d/a.txt"]
    assert keys(docs, kind="text", per_line=True) == ["d/a.txt:1", "d/a.txt:3"]
    assert keys(docs, kind="text", max_length=2, split=True) == \
        [f"d/a.txt#{j}" for j in range(5)]  # 9 bytes, 2 ids a chunk
    lines = tmp_path / "lines"
    lines.mkdir()
    (lines / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in "xy"))
    assert keys(lines, kind="text") == ["b.jsonl:1", "b.jsonl:2"]
