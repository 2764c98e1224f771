"""DeviceLoader: batches on the device, in the loader's order, augmented there; device errors."""

from __future__ import annotations

import warnings

import pytest
import torch

import packdata
from packdata.augment import cifar_recipe
from packdata.loading.device import DeviceError, DeviceLoader, augment_images, map_tensors, resolve_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA behaviour")


@pytest.fixture(scope="module")
def ds(packed):
    return packdata.open(packed["lmdb"])


def test_yields_exactly_the_loaders_batches_in_order(ds):
    reference = list(packdata.loader(ds, 32, shuffle=True, seed=3))
    wrapped = DeviceLoader(packdata.loader(ds, 32, shuffle=True, seed=3), "cpu")
    got = list(wrapped)
    assert len(wrapped) == len(reference) == len(got) == 4
    for (x, y), (rx, ry) in zip(got, reference):
        assert torch.equal(x, rx) and torch.equal(y, ry) and x.device.type == "cpu"


def test_augments_each_batch_on_its_device(ds):
    expected = cifar_recipe(seed=0, backend="torch")
    wrapped = DeviceLoader(packdata.loader(ds, 32, shuffle=True, seed=1), "cpu",
                           cifar_recipe(seed=0, backend="torch"))
    for (x, y), (rx, ry) in zip(wrapped, packdata.loader(ds, 32, shuffle=True, seed=1), strict=True):
        assert x.dtype == torch.float32 and torch.equal(x, expected(rx)) and torch.equal(y, ry)


def test_batches_of_any_structure():
    batch = {"image": torch.zeros(2, 3, 4, 4, dtype=torch.uint8), "meta": [torch.ones(1), "k"]}
    moved = map_tensors(batch, lambda t: t + 1)
    assert moved["meta"][1] == "k" and int(moved["meta"][0]) == 2
    out = augment_images(batch, lambda x: x.float())
    assert out["image"].dtype == torch.float32 and out["meta"] is batch["meta"]
    assert list(DeviceLoader([torch.zeros(1, 3, 2, 2)], None, lambda x: x + 1))[0].sum() == 12
    with pytest.raises(packdata.PackdataError, match="cannot find the images"):
        augment_images({"points": torch.zeros(1)}, lambda x: x)



def test_packed_text_batches_and_namedtuples_are_moved_whole():
    from collections import namedtuple

    from packdata.loading.collate import pack_sequences

    packed = pack_sequences([torch.arange(5), torch.arange(7)], block_size=4)
    moved = map_tensors(packed, lambda t: t.to("meta"))
    assert type(moved) is type(packed)
    assert {moved.input_ids.device.type, moved.segment_ids.device.type,
            moved.position_ids.device.type} == {"meta"}
    Pair = namedtuple("Pair", "images labels")
    pair = map_tensors(Pair(torch.zeros(2), torch.ones(2)), lambda t: t + 1)
    assert isinstance(pair, Pair) and pair.labels.tolist() == [2.0, 2.0]

@no_cuda
def test_asking_for_a_missing_gpu_is_a_clear_error():
    with pytest.raises(DeviceError, match="device='cpu'") as info:
        resolve_device("cuda")
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, packdata.PackdataError)
    with pytest.raises(DeviceError):
        DeviceLoader([], "cuda:0")
    with pytest.raises(DeviceError, match="not a device name"):
        resolve_device("gpu0")


@no_cuda
def test_auto_warns_and_uses_the_cpu():
    with pytest.warns(RuntimeWarning, match="no CUDA device"):
        assert resolve_device("auto") == torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_prefetch_yields_the_same_batches_on_the_gpu(ds):
    reference = list(packdata.loader(ds, 32, shuffle=True, seed=3))
    got = list(DeviceLoader(packdata.loader(ds, 32, shuffle=True, seed=3), "cuda"))
    for (x, y), (rx, ry) in zip(got, reference):
        assert x.is_cuda and torch.equal(x.cpu(), rx) and torch.equal(y.cpu(), ry)
    aug = list(DeviceLoader(packdata.loader(ds, 32, shuffle=True, seed=3), "cuda", cifar_recipe(seed=0)))
    assert aug[0][0].is_cuda and aug[0][0].dtype == torch.float32
