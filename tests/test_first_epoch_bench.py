"""bench/bench_first_epoch.py's floor of a first open: the limit's gather, in a new process,
from the HDF5 file mapped afresh, over the records' own bytes."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import packdata
from packdata.containers.base import gather_rows, map_file
from tests.conftest import load_bench


@pytest.fixture(scope="module")
def first_epoch():
    return load_bench("bench_first_epoch")


def test_the_floor_gathers_the_records_own_bytes(first_epoch, packed, tmp_path):
    path = packed["hdf5"]
    ds = packdata.open(path)
    offset, count, row_bytes = first_epoch.stored_rows(path, "image", 1)
    assert (count, row_bytes) == (len(ds), 3 * 32 * 32)
    rows = map_file(path)[offset : offset + count * row_bytes].reshape(count, row_bytes)
    idx = np.array([len(ds) - 1, 0, 5])
    gathered = gather_rows(rows, idx).reshape(len(idx), 3, 32, 32)
    np.testing.assert_array_equal(gathered, ds.get_batch(idx)[0].numpy())
    wall, cpu = first_epoch.fresh_map_run(path, "image", np.arange(len(ds)), 1, 16, tmp_path)()
    assert wall > 0 and cpu > 0


def test_a_point_clouds_rows_are_its_variants(first_epoch, tmp_path):
    """Rows of one variant each: the floor gathers the variant a record serves."""
    folder = tmp_path / "trees"
    (folder / "filtered").mkdir(parents=True)  # one class
    for las in sorted((Path(__file__).parent / "fixtures" / "lidar").glob("ahn_filtered_*.las")):
        shutil.copy(las, folder / "filtered")
    source = packdata.open_source(folder, points=256, variants=3, sampling="random",
                                  dtype="float64")
    path = packdata.convert(source, tmp_path / "pc.h5", workers=1).path
    ds = packdata.open(path)
    field = ds.manifest.fields["points"]
    k, points, dims = field.shape
    offset, count, row_bytes = first_epoch.stored_rows(path, "points", k)
    assert (count, row_bytes) == (len(ds) * k, points * dims * field.np_dtype.itemsize)
    rows = map_file(path)[offset : offset + count * row_bytes].reshape(count, row_bytes)
    for variant in range(k):
        served = np.arange(len(ds)) * k + variant
        gathered = gather_rows(rows, served).view(field.np_dtype).reshape(len(ds), points, dims)
        selected = np.full(len(ds), variant)
        read = ds.reader.read(np.arange(len(ds)), select={"points": selected})["points"]
        np.testing.assert_array_equal(gathered, read)
