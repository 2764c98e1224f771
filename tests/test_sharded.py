"""Sharded datasets: parts of every container read as one dataset, batches spanning parts
(tar parts are joined into one tar dataset instead)."""

from __future__ import annotations

import numpy as np
import pytest

import packdata
from packdata.containers import sharded
from packdata.errors import DatasetError


@pytest.fixture(scope="module")
def parts(tmp_path_factory, png_folder, packed) -> dict:
    """The PNG folder converted into 7 parts of every container."""
    out = tmp_path_factory.mktemp("sharded")
    source = packdata.open_source(png_folder)
    return {name: packdata.convert(source, out / f"ds-{name}", container=name, part_size=17,
                                   workers=1).path for name in packed}


def test_every_container_reads_as_one_dataset(parts, packed, container):
    whole, split = packdata.open(packed[container]), packdata.open(parts[container])
    if container == "tar":  # tar parts are joined into one plain tar dataset, a shard per part
        assert split.manifest.container == "tar"
        assert [p["count"] for p in split.manifest.extra["shards"]] == [17] * 7 + [1]
        assert sorted(p.name for p in parts["tar"].iterdir()) == [
            "index.npz", "manifest.json",
            *(f"shard-{n:06d}.{ext}" for n in range(8) for ext in ("idx", "tar")),
            "wids-index.json"]  # one plain tar dataset, with the indexes of other readers
    else:
        assert split.manifest.container == "sharded"
        assert split.manifest.options["part_container"] == container
        assert [p["count"] for p in split.manifest.extra["parts"]] == [17] * 7 + [1]
    assert split.manifest.keys == whole.manifest.keys
    assert np.array_equal(split.manifest.checksums, whole.manifest.checksums)
    order = np.random.default_rng(0).permutation(len(whole))  # batches span several parts
    for batch in np.array_split(order, 5):
        (xa, ya), (xb, yb) = whole[batch], split[batch]
        assert (xa == xb).all() and (ya == yb).all()
    image, label = split[-1]
    assert (image == whole[len(whole) - 1][0]).all() and label == whole[len(whole) - 1][1]


def test_batch_spanning_parts_is_one_read_per_part(parts, monkeypatch):
    reader = sharded.ShardedReader(parts["hdf5"])
    calls = []
    part = reader.part
    monkeypatch.setattr(reader, "part", lambda n: calls.append(n) or part(n))
    wanted = [0, 40, 1, 18, 41, 2]
    batch = reader.read(np.array(wanted))
    assert sorted(calls) == [0, 1, 2]  # parts 0, 1 and 2, each read once
    for j, i in enumerate(wanted):
        one = reader.read(np.array([i]))
        assert all((batch[name][j] == one[name][0]).all() for name in batch)


def test_missing_part_is_named(parts, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(parts["lmdb"], copy)
    shutil.rmtree(copy / "part-000003.lmdb")
    with pytest.raises(DatasetError, match="part-000003.lmdb: part missing"):
        packdata.open(copy)  # the sample of checksums checked at open reaches every part
    ds = packdata.open(copy, verify="off")
    ds[0]  # the parts that are there still read
    with pytest.raises(DatasetError, match="part-000003.lmdb: part missing"):
        ds[[0, 60]]


def test_select_reads_one_entry_per_record_across_parts(parts, packed):
    whole = packdata.containers.get("hdf5").READER(packed["hdf5"])
    split = sharded.ShardedReader(parts["hdf5"])
    idx = np.array([3, 100, 17, 50, 0, 119])
    rows = np.array([0, 2, 1, 1, 2, 0])  # one channel plane of each record (stored C×H×W)
    got = split.read(idx, {"image": rows})["image"]
    assert got.shape == (6, 32, 32)
    assert (got == whole.read(idx, {"image": rows})["image"]).all()


def test_variable_length_records_across_parts(tmp_path, peps_dir, gpt2_json, packed_text):
    source = packdata.open_source(peps_dir, tokenizer=gpt2_json)
    split = packdata.open(packdata.convert(source, tmp_path / "peps", container="hdf5",
                                           part_size=3, workers=1).path)
    whole = packdata.open(packed_text["hdf5"])
    assert len(split.manifest.extra["parts"]) > 1
    assert np.array_equal(split.manifest.checksums, whole.manifest.checksums)
    assert (split.lengths() == whole.lengths()).all()
    order = list(range(len(whole)))[::-1]
    assert all((a == b).all() for a, b in zip(split[order], whole[order], strict=True))
