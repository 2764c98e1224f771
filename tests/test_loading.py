"""loader(): defaults chosen from the dataset, every knob overridable, device/augment/resident."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader

import packdata
from packdata.augment import cifar_recipe
from packdata.errors import ArgumentError
from packdata.loading.loader import Loader
from packdata.loading.settings import default_num_workers
from packdata.units import available_cores


@pytest.fixture(scope="module")
def keep_lmdb(tmp_path_factory, png_folder):
    source = packdata.open_source(png_folder, encoding="keep")
    return packdata.convert(source, tmp_path_factory.mktemp("keep") / "k.lmdb", workers=2).path


def test_raw_records_read_in_process_encoded_ones_in_workers(packed, keep_lmdb):
    raw = packdata.open(packed["lmdb"])
    assert default_num_workers(raw) == 0
    dl = packdata.loader(raw, 32)
    # read in this process with no DataLoader bookkeeping per batch
    assert isinstance(dl, Loader) and dl.workers is None and dl.dataloader is None
    assert len(dl) == len(raw) // 32 + 1 and dl.pin_memory == torch.cuda.is_available()
    keep = packdata.open(keep_lmdb)
    assert default_num_workers(keep) == min(available_cores(), 8) > 0
    dl = packdata.loader(keep, 32)  # decoding releases the GIL: threads, no transfer
    assert dl.num_workers > 0 and dl.workers == "thread" and dl.prefetch_factor == 4
    dl = packdata.loader(packdata.open(keep_lmdb, transform=lambda x: x), 32)
    assert dl.workers == "process" and dl.persistent_workers
    assert isinstance(dl.dataloader, DataLoader) and dl.dataloader.num_workers > 0
    assert default_num_workers(packdata.open(packed["lmdb"], transform=lambda x: x)) > 0


def test_every_knob_is_overridable(packed, keep_lmdb):
    keep = packdata.open(keep_lmdb)
    dl = packdata.loader(keep, 32, num_workers=1, workers="process", persistent_workers=False,
                         prefetch_factor=2, pin_memory=False, timeout=30).dataloader
    assert (dl.num_workers, dl.persistent_workers, dl.prefetch_factor, dl.pin_memory,
            dl.timeout) == (1, False, 2, False, 30)
    images, labels = next(iter(dl))
    assert images.shape == (32, 3, 32, 32) and labels.dtype == torch.int64
    with pytest.raises(ValueError, match="num_workers > 0"):
        packdata.loader(packdata.open(packed["lmdb"]), 32, prefetch_factor=2)
    with pytest.raises(ValueError, match="DataLoader options"):
        packdata.loader(packdata.open(packed["lmdb"]), 32, timeout=30)  # no process to time out


@pytest.mark.parametrize(("option", "value", "least"), [
    ("num_workers", -1, 0), ("num_workers", 1.5, 0), ("num_workers", "2", 0),
    ("prefetch_factor", 0, 1), ("prefetch_factor", -1, 1), ("prefetch_factor", 2.0, 1),
])
def test_a_worker_count_that_is_not_one_is_refused_by_name(packed, option, value, least):
    # a float reached range() deep in the loader (a raw TypeError); a prefetch of 0 or fewer
    # batches was taken for the default, or kept no batch in flight
    ds = packdata.open(packed["hdf5"])
    with pytest.raises(ArgumentError, match=f"{option} must be an integer ≥ {least}, got {value!r}"):
        packdata.loader(ds, 32, **{"num_workers": 2, option: value})


def test_device_augment_and_resident_options(packed):
    ds = packdata.open(packed["tar"])
    dl = packdata.loader(ds, 32, device="cpu", augment=cifar_recipe(seed=0, backend="torch"))
    assert isinstance(dl, Loader) and dl.device.type == "cpu"
    x, y = next(iter(dl))
    assert x.dtype == torch.float32 and x.device.type == "cpu" and len(y) == 32
    resident = packdata.loader(ds, 32, resident=True, seed=2)
    assert isinstance(resident, Loader) and resident.resident.device.type == "cpu"
    assert len(resident) == len(packdata.loader(ds, 32)) == 4
    assert resident.dataset is ds and resident.batch_sampler.batch_size == 32


@pytest.mark.parametrize("option", [{"collate": lambda b: b}, {"num_workers": 2},
                                    {"pin_memory": True}, {"workers": "thread"},
                                    {"prefetch_factor": 2}, {"timeout": 5}])
def test_resident_refuses_what_cannot_apply(packed, option):
    with pytest.raises(ValueError, match=f"resident=True.*{next(iter(option))}"):
        packdata.loader(packdata.open(packed["hdf5"]), 32, resident=True, **option)


@pytest.mark.parametrize("order", [{"batch_size": 2, "sampler": [7, 3, 1, 2, 9]},
                                   {"batch_sampler": [[5, 0], [8], [2, 2, 6]]},
                                   {"batch_size": 16, "shuffle": True, "drop_last": True}])
def test_resident_serves_the_order_the_streamed_loader_reads(packed, order):
    ds = packdata.open(packed["hdf5"])
    resident = packdata.loader(ds, resident=True, seed=3, **order)
    streamed = packdata.loader(ds, seed=3, **order)
    assert len(resident) == len(streamed) > 0
    for (x, y), (sx, sy) in zip(resident, streamed, strict=True):
        assert torch.equal(x, sx) and torch.equal(y, sy)


@pytest.mark.parametrize("options", [{"resident": True}, {"num_workers": 2},
                                     {"num_workers": 2, "workers": "process"},
                                     {"device": "cpu"}, {}])
def test_one_loader_type_the_same_batches_and_set_epoch(packed, options):
    ds = packdata.open(packed["lmdb"])
    reference = packdata.loader(ds, 32, shuffle=True, seed=4, num_workers=0)
    dl = packdata.loader(ds, 32, shuffle=True, seed=4, **options)
    assert type(dl) is Loader and len(dl) == len(reference) and dl.dataset is ds
    for epoch in (3, 1):
        reference.set_epoch(epoch)
        dl.set_epoch(epoch)
        for (x, y), (rx, ry) in zip(dl, reference, strict=True):
            assert torch.equal(x, rx) and torch.equal(y, ry)


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_takes_a_bucketing_sampler_and_a_collate(packed_text, workers):
    from packdata import LengthBucketBatchSampler, PadCollate

    ds = packdata.open(packed_text["hdf5"])
    sampler = LengthBucketBatchSampler(ds.lengths(), max_tokens=40_000, seed=1)
    dl = packdata.loader(ds, batch_sampler=sampler, collate=PadCollate(pad_id=50256),
                         num_workers=workers)
    seen = []
    for (ids, mask), indices in zip(dl, sampler.batches(0)):
        for row, m, i in zip(ids, mask, indices):
            assert row[m].tolist() == ds[int(i)].tolist()
        seen.extend(indices.tolist())
    assert sorted(seen) == list(range(len(ds)))
    with pytest.raises(ValueError, match="batch_sampler= gives whole batches: leave out batch_size"):
        packdata.loader(ds, 8, batch_sampler=sampler)


def test_empty_batch_of_encoded_images(keep_lmdb):
    images, labels = packdata.open(keep_lmdb)[[]]
    assert images.shape[0] == 0 and images.dtype == torch.uint8 and labels.shape == (0,)


def test_thread_workers_draw_a_seeded_batch_transform_as_no_workers_do(packed):
    def run(workers):
        ds = packdata.open(packed["tar"], batch_transform=cifar_recipe(seed=1, backend="torch"))
        return list(packdata.loader(ds, 16, shuffle=True, seed=2, num_workers=workers))

    for (x, y), (rx, ry) in zip(run(2), run(0), strict=True):
        assert x.dtype == torch.float32 and torch.equal(x, rx) and torch.equal(y, ry)


def test_loader_serves_index_order_by_default_and_rebuilding_it_does_not_warn(packed):
    ds = packdata.open(packed["lmdb"])
    images = torch.cat([x for x, _ in packdata.loader(ds, 32)])
    assert torch.equal(images, ds[0:len(ds)][0])  # as DataLoader(ds, 32): no shuffle
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an evaluation loader built each epoch: nothing to say
        again = torch.cat([x for x, _ in packdata.loader(ds, 32)])
    assert torch.equal(again, images)


def test_sampler_and_batch_sampler_mean_what_they_mean_to_dataloader(packed):
    ds = packdata.open(packed["lmdb"])
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(0)).tolist()
    stock = [labels.tolist() for _, labels in DataLoader(ds, 8, sampler=order)]
    assert stock == [labels.tolist() for _, labels in packdata.loader(ds, 8, sampler=order)]
    sampled = packdata.loader(ds, 8, sampler=torch.utils.data.RandomSampler(ds))
    assert sorted(int(v) for _, labels in sampled for v in labels) == sorted(ds[:][1].tolist())
    batches = [order[:5], order[5:7], order[7:]]
    stock = [labels.tolist() for _, labels in DataLoader(ds, batch_sampler=batches)]
    assert stock == [labels.tolist() for _, labels in packdata.loader(ds, batch_sampler=batches)]
    with pytest.raises(ValueError, match="pass it as batch_sampler="):
        next(iter(packdata.loader(ds, 8, sampler=batches)))
    with pytest.raises(ValueError, match="sampler= sets the order: leave out shuffle"):
        packdata.loader(ds, 8, sampler=order, shuffle=True)
    with pytest.raises(ValueError, match="give batch_size .with sampler="):
        packdata.loader(ds, sampler=order)


@pytest.mark.skipif(torch.cuda.is_available(), reason="pinning works where CUDA is")
@pytest.mark.parametrize(("workers", "kind"), [(0, None), (2, "thread"), (2, "process")])
def test_pin_memory_without_cuda_warns_and_serves_as_torchs_dataloader_does(packed, workers, kind):
    # in process and with threads it raised torch's "Cannot access accelerator device" at the
    # first batch; a GPU script's pin_memory=True run on a CPU machine must go on, as DataLoader's
    ds = packdata.open(packed["hdf5"])
    with pytest.warns(UserWarning, match="pin_memory=True, but no CUDA device"):
        loader = packdata.loader(ds, 16, pin_memory=True, num_workers=workers, workers=kind)
    images, labels = next(iter(loader))
    assert torch.equal(images, ds[list(range(16))][0]) and not images.is_pinned()


@pytest.mark.parametrize("option", [{"collate": 5}, {"sampler": 5}, {"batch_sampler": 5}])
def test_a_collate_or_sampler_of_the_wrong_kind_is_refused_by_name(packed, option):
    (name, value), = option.items()
    with pytest.raises(packdata.errors.ArgumentTypeError, match=f"{name} must be"):
        packdata.loader(packdata.open(packed["hdf5"]), None if name == "batch_sampler" else 8,
                        **option)


@pytest.mark.parametrize("resident", [False, True])
def test_an_augment_that_cannot_be_called_is_refused_when_given(packed, resident):
    # augment="cifar" (the bench's name for the recipe) failed at the first batch in device.py
    with pytest.raises(packdata.errors.ArgumentTypeError, match="augment must be callable"):
        packdata.loader(packdata.open(packed["hdf5"]), 8, augment="cifar", resident=resident)
    with pytest.raises(packdata.errors.ArgumentTypeError, match="an iterable of batches, got 5"):
        packdata.DeviceLoader(5, device="cpu")
    with pytest.raises(packdata.errors.ArgumentTypeError, match="an iterable of batches, got None"):
        packdata.DeviceLoader(None, device="cpu")
