"""loader(): defaults chosen from the dataset, every knob overridable, device/augment/resident."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import packdata
from packdata.augment import cifar_recipe
from packdata.device import DeviceLoader
from packdata.loading import BatchLoader, cpu_count, default_num_workers
from packdata.resident import ResidentLoader


@pytest.fixture(scope="module")
def keep_lmdb(tmp_path_factory, png_folder):
    source = packdata.open_source(png_folder, encoding="keep")
    return packdata.convert(source, tmp_path_factory.mktemp("keep") / "k.lmdb", workers=2).path


def test_raw_records_read_in_process_encoded_ones_in_workers(packed, keep_lmdb):
    raw = packdata.open(packed["lmdb"])
    assert default_num_workers(raw) == 0
    dl = packdata.loader(raw, 32)
    if torch.cuda.is_available():  # pinning goes through DataLoader's pin-memory path
        assert isinstance(dl, DataLoader) and dl.num_workers == 0 and dl.pin_memory
    else:  # read in this process with no DataLoader bookkeeping per batch
        assert isinstance(dl, BatchLoader) and len(dl) == len(raw) // 32 + 1
    keep = packdata.open(keep_lmdb)
    assert default_num_workers(keep) == min(cpu_count(), 8) > 0
    dl = packdata.loader(keep, 32)
    assert dl.num_workers > 0 and dl.persistent_workers and dl.prefetch_factor == 4
    assert default_num_workers(packdata.open(packed["lmdb"], transform=lambda x: x)) > 0


def test_every_knob_is_overridable(packed, keep_lmdb):
    keep = packdata.open(keep_lmdb)
    dl = packdata.loader(keep, 32, num_workers=1, persistent_workers=False, prefetch_factor=2,
                         pin_memory=False, timeout=30)
    assert (dl.num_workers, dl.persistent_workers, dl.prefetch_factor, dl.pin_memory,
            dl.timeout) == (1, False, 2, False, 30)
    images, labels = next(iter(dl))
    assert images.shape == (32, 3, 32, 32) and labels.dtype == torch.int64
    with pytest.raises(ValueError, match="num_workers > 0"):
        packdata.loader(packdata.open(packed["lmdb"]), 32, prefetch_factor=2)


def test_device_augment_and_resident_options(packed):
    ds = packdata.open(packed["tar"])
    dl = packdata.loader(ds, 32, device="cpu", augment=cifar_recipe(seed=0, backend="torch"))
    assert isinstance(dl, DeviceLoader)
    x, y = next(iter(dl))
    assert x.dtype == torch.float32 and x.device.type == "cpu" and len(y) == 32
    resident = packdata.loader(ds, 32, resident=True, seed=2)
    assert isinstance(resident, ResidentLoader) and resident.device.type == "cpu"
    assert len(resident) == len(packdata.loader(ds, 32)) == 4


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_takes_a_bucketing_sampler_and_a_collate(packed_text, workers):
    from packdata import LengthBucketBatchSampler, PadCollate

    ds = packdata.open(packed_text["hdf5"])
    sampler = LengthBucketBatchSampler(ds.lengths(), max_tokens=40_000, seed=1)
    dl = packdata.loader(ds, sampler=sampler, collate=PadCollate(pad_id=50256),
                         num_workers=workers)
    seen = []
    for (ids, mask), indices in zip(dl, sampler.batches(0)):
        for row, m, i in zip(ids, mask, indices):
            assert row[m].tolist() == ds[int(i)].tolist()
        seen.extend(indices.tolist())
    assert sorted(seen) == list(range(len(ds)))
    with pytest.raises(ValueError, match="exactly one of batch_size or a batch sampler"):
        packdata.loader(ds, 8, sampler=sampler)


def test_empty_batch_of_encoded_images(keep_lmdb):
    images, labels = packdata.open(keep_lmdb)[[]]
    assert images.shape[0] == 0 and images.dtype == torch.uint8 and labels.shape == (0,)
