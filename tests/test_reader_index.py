"""Indexes for other readers: DALI's fn.readers.webdataset and wids.ShardListDataset read
packdata's tar shards through the indexes written at conversion (or by `packdata index`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import packdata
from packdata.containers.tar.indexes import WIDS_INDEX, dali_index_paths
from packdata.containers.tar.reindex import write_reader_indexes


def test_conversion_writes_an_idx_per_shard_and_the_wids_json(packed):
    path = packed["tar"]
    manifest = packdata.open(path).manifest
    paths = dali_index_paths(path)
    assert paths is not None and len(paths) == len(manifest.extra["shards"])
    first = Path(paths[0]).read_text().splitlines()
    assert first[0] == f"v1.2 {manifest.extra['shards'][0]['count']}"
    spec = json.loads((path / WIDS_INDEX).read_text())
    assert [s["nsamples"] for s in spec["shardlist"]] == [s["count"] for s in
                                                          manifest.extra["shards"]]


def test_index_command_rewrites_them_identically_for_older_datasets(packed, tmp_path):
    from typer.testing import CliRunner

    from packdata.cli import app

    old = tmp_path / "old"
    shutil.copytree(packed["tar"], old)
    written = {p.name: p.read_text() for p in old.glob("*.idx")}
    for p in old.glob("*.idx"):
        p.unlink()
    (old / WIDS_INDEX).unlink()
    result = CliRunner().invoke(app, ["index", str(old)])
    assert result.exit_code == 0, result.output
    assert {p.name: p.read_text() for p in old.glob("*.idx")} == written
    assert (old / WIDS_INDEX).is_file()


def test_keep_encoded_shards_index_png_members(png_folder, tmp_path):
    out = packdata.convert(packdata.open_source(png_folder, encoding="keep"), tmp_path / "keep",
                           container_options={"shard_size": "50"}).path
    line = Path(dali_index_paths(out)[0]).read_text().splitlines()[1].split()
    assert line[0] == "png" and line[3].endswith(".png") and line[4] == "cls"
    idx = {p.name: p.read_text() for p in out.glob("*.idx")}
    write_reader_indexes(out)  # sniffing the members gives what the writer knew
    assert {p.name: p.read_text() for p in out.glob("*.idx")} == idx


def test_wids_reads_the_shards_with_the_right_count_and_bytes(packed):
    wids = pytest.importorskip("wids", reason="wids is not installed")
    path = packed["tar"]
    ds = packdata.open(path)
    shards = wids.ShardListDataset(str(path / WIDS_INDEX), transformations=[],
                                   localname=lambda url: url)
    assert len(shards) == len(ds)
    images, labels = ds[list(range(len(ds)))]
    for i in (0, 7, len(ds) - 1):
        sample = shards[i]
        pixels = np.load(sample[".image.npy"]) if hasattr(sample[".image.npy"], "read") else \
            np.lib.format.read_array(__import__("io").BytesIO(sample[".image.npy"]))
        assert np.array_equal(pixels, images[i].numpy())  # stored C×H×W
        assert int(sample[".cls"].read() if hasattr(sample[".cls"], "read")
                   else sample[".cls"]) == int(labels[i])


def test_dali_webdataset_reader_uses_the_idx_files(packed):
    dali = pytest.importorskip("nvidia.dali", reason="DALI (extra 'dali') is not installed")
    from packdata.containers.tar import shard_paths

    path = packed["tar"]
    ds = packdata.open(path)
    images, labels = ds[list(range(len(ds)))]

    @dali.pipeline_def(batch_size=len(ds), num_threads=1, device_id=None)
    def pipeline():
        raw, cls = dali.fn.readers.webdataset(
            paths=[str(p) for p in shard_paths(path)], index_paths=dali_index_paths(path),
            ext=["image.npy", "cls"], random_shuffle=False, missing_component_behavior="error")
        return raw, cls

    pipe = pipeline()
    pipe.build()
    raw, cls = pipe.run()
    assert len(raw) == len(ds)
    for i in (0, 31, len(ds) - 1):
        member = np.asarray(raw.at(i)).tobytes()
        pixels = np.lib.format.read_array(__import__("io").BytesIO(member))
        assert np.array_equal(pixels, images[i].numpy())  # stored C×H×W
        assert int(np.asarray(cls.at(i)).tobytes()) == int(labels[i])
