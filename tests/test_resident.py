"""Resident mode: the dataset held in memory, each sample once per epoch, same batches as the
streamed loader, a clear error when it does not fit."""

from __future__ import annotations

import pytest
import torch

import packdata
from packdata.augment import cifar_recipe
from packdata.loading.resident import ResidentLoader, ResidentMemoryError, resident_bytes


@pytest.fixture(scope="module")
def keep_tar(tmp_path_factory, png_folder):
    source = packdata.open_source(png_folder, encoding="keep")
    out = tmp_path_factory.mktemp("keep") / "keep-tar"
    return packdata.convert(source, out, workers=2, container_options={"shard_size": "50"}).path


@pytest.mark.parametrize("name", ["lmdb", "tar"])
def test_every_sample_once_per_epoch_and_the_streamed_batches(packed, name):
    ds = packdata.open(packed[name])
    resident = ResidentLoader(ds, 32, shuffle=True, seed=5)
    streamed = packdata.loader(ds, 32, shuffle=True, seed=5)
    epochs = []
    for _ in range(2):
        seen = []
        for (x, y), (sx, sy) in zip(resident, streamed, strict=True):
            assert torch.equal(x, sx) and torch.equal(y, sy)
            seen.append(x)
        epochs.append(torch.cat(seen))
    everything = ds[list(range(len(ds)))][0]
    key = lambda t: sorted(bytes(img.contiguous().numpy()) for img in t)  # noqa: E731
    assert key(epochs[0]) == key(everything) == key(epochs[1])  # each sample exactly once
    assert not torch.equal(epochs[0], epochs[1])  # reshuffled


def test_augment_and_batch_transform_run_after_the_gather(packed):
    ds = packdata.open(packed["hdf5"], batch_transform=lambda x: x.flip(-1))
    batches = list(packdata.loader(ds, 40, resident=True, augment=cifar_recipe(seed=0,
                                                                                backend="torch")))
    assert [len(b[0]) for b in batches] == [40, 40, 40]
    assert batches[0][0].dtype == torch.float32
    plain = ResidentLoader(ds, 40)  # index order, as DataLoader's default
    first = next(iter(plain))[0]
    assert torch.equal(first, ds[list(range(40))][0])  # the dataset's batch_transform applied


def test_size_estimate_and_the_error_when_it_does_not_fit(packed, keep_tar):
    ds = packdata.open(packed["lmdb"])
    assert resident_bytes(ds) == len(ds) * (32 * 32 * 3 + 8)
    assert resident_bytes(packdata.open(keep_tar)) == len(ds) * (32 * 32 * 3 + 8)  # decoded
    with pytest.raises(ResidentMemoryError, match="MiB") as info:
        ResidentLoader(ds, 32, memory_limit=100_000)
    assert isinstance(info.value, MemoryError) and isinstance(info.value, packdata.PackdataError)
    loaded = ResidentLoader(packdata.open(keep_tar), 50, shuffle=False)
    assert loaded.nbytes == resident_bytes(ds)
    assert torch.equal(next(iter(loaded))[0], ds[list(range(50))][0])


def test_a_per_sample_transform_is_refused_not_skipped(packed):
    ds = packdata.open(packed["lmdb"], transform=lambda x: x.float())
    with pytest.raises(packdata.PackdataError, match="per-sample transform"):
        ResidentLoader(ds, 16)


@pytest.mark.parametrize("fraction", [0.0, 1.5, -0.2])
def test_a_memory_fraction_outside_0_to_1_is_refused_by_name(packed, fraction):
    # 1.5 let a dataset past the memory there is through the check
    with pytest.raises(packdata.errors.ArgumentError,
                       match=f"max_fraction must be in .0, 1., got {fraction}"):
        ResidentLoader(packdata.open(packed["hdf5"]), 8, max_fraction=fraction)
