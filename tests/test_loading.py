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
