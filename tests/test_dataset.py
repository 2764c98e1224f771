"""The torch face: every sample once per epoch through DataLoaders, workers, transforms."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

import packdata
from packdata.loading.rows import BatchRow


def seen_keys(ds, batches) -> list[int]:
    """Recover each delivered sample's index from its pixels (unique per real image)."""
    lookup = {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}
    return [lookup[img.contiguous().numpy().tobytes()] for images, _ in batches for img in images]


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_delivers_each_sample_once_per_epoch(packed, container, workers):
    ds = packdata.open(packed[container])
    dl = packdata.loader(ds, batch_size=32, shuffle=True, num_workers=workers)
    epochs = [seen_keys(ds, dl) for _ in range(2)]
    for order in epochs:
        assert sorted(order) == list(range(len(ds)))
    assert epochs[0] != epochs[1] != list(range(len(ds)))  # reshuffled each epoch


@pytest.mark.parametrize("workers", [0, 2])
def test_stock_dataloader_with_getitems(packed, container, workers):
    ds = packdata.open(packed[container])
    dl = DataLoader(ds, batch_size=25, shuffle=True, num_workers=workers)
    batches = list(dl)
    assert batches[0][0].shape == (25, 3, 32, 32) and batches[0][0].dtype == torch.uint8
    assert sorted(seen_keys(ds, batches)) == list(range(len(ds)))


def test_transforms(packed):
    ds = packdata.open(packed["hdf5"], transform=lambda x: x.float() / 255,
                       batch_transform=lambda x: x.flip(-1))
    image, _ = ds[0]
    assert image.dtype == torch.float32 and float(image.max()) <= 1.0
    raw = packdata.open(packed["hdf5"])
    batch, _ = ds[[0, 1]]  # each sample transformed, then the batch
    assert torch.equal(batch[0], (raw[0][0].float() / 255).flip(-1))


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_applies_a_per_sample_transform(packed, workers):
    ds = packdata.open(packed["lmdb"], transform=lambda x: x.float().mean(0, keepdim=True))
    images, labels = next(iter(packdata.loader(ds, 8, shuffle=False, num_workers=workers)))
    raw = packdata.open(packed["lmdb"])
    assert images.shape == (8, 1, 32, 32) and labels.tolist() == raw[range(8)][1].tolist()
    assert torch.equal(images[3], raw[3][0].float().mean(0, keepdim=True))


def test_indexing_like_numpy_and_clear_errors(packed):
    ds = packdata.open(packed["lmdb"])
    images, labels = ds[list(range(10))]
    assert torch.equal(ds[torch.tensor(3)][0], images[3])  # 0-d index: one sample
    assert torch.equal(ds[2:8:3][0], images[[2, 5]])
    assert torch.equal(ds[torch.tensor([4, 1])][1], labels[[4, 1]])
    assert ds[[]][0].shape == (0, 3, 32, 32)
    for bad, error in ((3.7, TypeError), ([True, False], TypeError),
                       ([[0, 1], [2, 3]], IndexError), ([len(ds)], IndexError)):
        with pytest.raises(error):
            ds[bad]
    # an index past int64 named as given (it had wrapped round to -9223372036854775808)
    for huge in (2**63, [2**63], np.array([1, 2**64 - 1], dtype=np.uint64)):
        with pytest.raises(IndexError, match="index (9223372036854775808|18446744073709551615) out of range"):
            ds[huge]


@pytest.mark.parametrize("value", [-1, "2", 1.0])
def test_an_epoch_that_is_not_a_count_is_refused_by_name(packed, value):
    # it went into the shared epoch as it was: a raw TypeError, or a negative epoch the samples
    # of point-cloud variants would be drawn for
    ds = packdata.open(packed["hdf5"])
    with pytest.raises(packdata.errors.ArgumentError, match=f"epoch must be an integer ≥ 0, got {value!r}"):
        ds.set_epoch(value)
    assert ds.epoch == 0


@pytest.mark.parametrize(("option", "match"), [({"access": "bogus"}, "access 'bogus'"),
                                               ({"cache_limit": "lots"}, "size 'lots'")])
def test_a_wrong_storage_option_is_refused_for_a_local_dataset_too(packed, option, match):
    with pytest.raises(packdata.errors.ArgumentError, match=match):
        packdata.open(packed["hdf5"], **option)
    assert len(packdata.open(packed["hdf5"], access="ranges", cache_limit="1GB"))  # apply to URLs


def test_dataset_pickles_without_open_handles(packed, container):
    ds = packdata.open(packed[container])
    ds[0]  # opens a reader in this process
    clone = pickle.loads(pickle.dumps(ds))
    assert torch.equal(clone[5][0], ds[5][0])


def test_open_finds_the_container_and_named_classes_pin_it(packed):
    for name, cls in (("lmdb", packdata.LMDBDataset), ("hdf5", packdata.HDF5Dataset),
                      ("tar", packdata.TarDataset)):
        ds = packdata.open(packed[name])
        assert type(ds) is packdata.PackedDataset and ds.container_name == name
        assert cls(packed[name]).container_name == name
        other = packed["hdf5" if name != "hdf5" else "lmdb"]
        with pytest.raises(packdata.DatasetError, match=f"{other}: a .* dataset, not {name}"):
            cls(other)
    with pytest.raises(packdata.DatasetError, match="not a packdata dataset"):
        packdata.open(packed["tar"].parent)


def test_unlabelled_dataset_yields_images(tmp_path, png_folder):
    folder = tmp_path / "nolabels"
    folder.mkdir()
    for p in sorted(png_folder.glob("*.png"))[:5]:
        (folder / p.name).write_bytes(p.read_bytes())
    ds = packdata.open(packdata.convert(packdata.open_source(folder), tmp_path / "u.h5").path)
    assert "label" not in ds.manifest.fields
    assert ds[0].shape == (3, 32, 32)
    assert ds[[0, 1]].shape == (2, 3, 32, 32)
    assert not hasattr(ds, "targets") and ds.class_to_idx == {}  # as a probe for labels expects


def test_targets_and_class_to_idx_as_torchvision_datasets_give_them(packed, container):
    ds = packdata.open(packed[container])
    _, labels = ds[list(range(len(ds)))]
    assert ds.targets == labels.tolist() and all(type(t) is int for t in ds.targets)
    assert ds.class_to_idx == {name: i for i, name in enumerate(ds.classes)} and ds.classes
    # what code written for torchvision does with them: a class-balanced sampler
    counts = torch.bincount(torch.tensor(ds.targets))
    sampler = torch.utils.data.WeightedRandomSampler((1.0 / counts)[ds.targets], 64)
    images, batch_labels = next(iter(DataLoader(ds, batch_size=64, sampler=sampler)))
    assert images.shape == (64, 3, 32, 32) and set(batch_labels.tolist()) <= set(ds.targets)
    assert pickle.loads(pickle.dumps(ds))._targets is None  # not sent to every worker


def halve(x):  # module level: spawned workers unpickle it
    return x.float() / 2


def flip(x):
    return x.flip(-1)


TRANSFORMS = {"none": {}, "sample": {"transform": halve}, "batch": {"batch_transform": flip},
              "both": {"transform": halve, "batch_transform": flip}}


@pytest.mark.parametrize("which", list(TRANSFORMS))
def test_every_path_serves_the_same_transformed_samples(packed, container, which):
    ds = packdata.open(packed[container], **TRANSFORMS[which])
    raw = packdata.open(packed[container])
    order = [7, 3, 50, 0, 99, 12, 64, 5]
    x = raw[order][0]
    expected = flip(halve(x) if "transform" in TRANSFORMS[which] else x) if (
        "batch_transform" in TRANSFORMS[which]) else (halve(x) if which == "sample" else x)
    images, labels = ds[order]
    assert torch.equal(images, expected) and labels.tolist() == raw[order][1].tolist()
    for j, i in enumerate(order):  # ds[i] is row 0 of the batch [i]: the same transforms
        assert torch.equal(ds[i][0], expected[j]) and int(ds[i][1]) == int(labels[j])
    sampler = [order[:4], order[4:]]
    stock = [b for b in DataLoader(ds, batch_sampler=sampler)]
    mine = list(packdata.loader(ds, batch_sampler=sampler, num_workers=0))
    own_collate = DataLoader(ds, batch_sampler=sampler, collate_fn=lambda rows: [
        torch.stack([r[0] for r in rows]), [int(lab) for _, lab in rows]])
    for got in (stock, mine, list(own_collate)):
        assert torch.equal(torch.cat([b[0] for b in got]), expected)
        assert [int(v) for b in got for v in b[1]] == labels.tolist()


def test_stock_collate_returns_the_batch_read_and_still_collates_mixed_rows(packed):
    ds = packdata.open(packed["hdf5"])
    first, second = ds.__getitems__([4, 1, 9]), ds.__getitems__([2, 8])
    images, labels = default_collate(first)
    # the batch itself, contiguous as read
    assert images.is_contiguous()
    assert images.data_ptr() == first[0][0].data_ptr() and labels.tolist() == ds[[4, 1, 9]][1].tolist()
    for rows, order in (([second[1], first[0], first[2]], [8, 4, 9]), (first[:2], [4, 1]),
                        (first[::-1], [9, 1, 4])):
        mixed, mixed_labels = default_collate(rows)
        assert torch.equal(mixed, ds[order][0]) and mixed_labels.tolist() == ds[order][1].tolist()
    first.reverse()  # the list itself changed: collated from its rows, in their new order
    assert torch.equal(default_collate(first)[0], ds[[9, 1, 4]][0])
    image, label = first[1]  # a row acts as the sample tuple, and pickles as one
    assert torch.equal(image, ds[1][0]) and len(first[1]) == 2 and int(label) == int(ds[1][1])
    assert isinstance(pickle.loads(pickle.dumps(first[1])), tuple)


def test_a_sample_is_contiguous_or_with_channels_last_a_view_of_the_stored_pixels(packed,
                                                                                 container):
    image, _ = packdata.open(packed[container])[3]
    assert image.shape == (3, 32, 32) and image.stride() == (1024, 32, 1)
    image, _ = packdata.open(packed[container], channels_last=True)[3]
    assert image.shape == (3, 32, 32) and image.stride() == (1, 96, 3)  # H×W×C memory, permuted


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_stock_dataloader_workers_give_the_in_process_batches(packed, start):
    ds = packdata.open(packed["tar"], transform=halve, batch_transform=flip)
    def batches(**options):  # noqa: E306
        return list(DataLoader(ds, batch_size=24, shuffle=True, **options,
                               generator=torch.Generator().manual_seed(1)))
    reference = batches()
    workers = batches(num_workers=2, multiprocessing_context=start)
    assert len(workers) == len(reference) == 5
    for (x, y), (rx, ry) in zip(workers, reference, strict=True):
        assert torch.equal(x, rx) and torch.equal(y, ry) and x.dtype == torch.float32


def test_default_collate_gets_the_batch_without_building_the_rows(packed):
    """Torch's default collate looks at rows[0] alone: the other 255 rows are never made (they
    cost more than the read); any other use of the list sees every row."""
    ds = packdata.open(packed["hdf5"])
    rows = ds.__getitems__(list(range(64)))
    images, labels = default_collate(rows)
    assert images.data_ptr() == rows.batch[0].data_ptr() and labels is rows.batch[1]
    assert list.__len__(rows) == 0 and len(rows) == 64  # no row in the list's storage yet
    assert type(rows[63]) is BatchRow and torch.equal(rows[-1][0], ds[63][0])
    assert list.__len__(rows) == 0  # one row is built alone
    plain = list(rows)  # any other use: every row, in the list's own storage as well
    assert list.__len__(rows) == 64 and [int(r[1]) for r in plain] == ds[:64][1].tolist()
    assert torch.equal(default_collate(rows)[0], ds[:64][0])  # unchanged: the batch again
    assert default_collate(rows)[0].data_ptr() == rows.batch[0].data_ptr()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_users_collate_fn_sees_every_row_through_any_list_operation(packed, workers):
    ds = packdata.open(packed["lmdb"])

    def collate(rows):
        assert len(rows) == 8 and rows and len(rows[2:5]) == 3 and rows[::-1][0] is not None
        assert rows[0] in rows and rows.index(rows[0]) == 0  # found by identity
        rows.sort(key=lambda row: -int(row[1]))  # in place: the batch order changes
        return default_collate(rows), [int(row[1]) for row in rows]

    (images, labels), order = next(iter(DataLoader(ds, batch_size=8, num_workers=workers,
                                                   collate_fn=collate)))
    expected = ds[list(range(8))]
    assert order == sorted(expected[1].tolist(), reverse=True) == labels.tolist()
    assert sorted(map(tuple, images.reshape(8, -1).tolist())) == sorted(
        map(tuple, expected[0].reshape(8, -1).tolist()))


def test_a_held_row_keeps_its_sample_while_later_batches_are_read(packed):
    ds = packdata.open(packed["hdf5"])
    held = ds.__getitems__([4, 1, 9])[2]
    third = ds.__getitems__([0, 3, 6])
    assert torch.equal(held[0], ds[9][0]) and int(held[1]) == int(ds[9][1])
    assert torch.equal(default_collate(third)[0], ds[[0, 3, 6]][0])
    assert [int(label) for _, label in third] == ds[[0, 3, 6]][1].tolist()


def test_a_tar_batch_across_shards_is_the_same_as_from_hdf5(packed):
    tar, h5 = packdata.open(packed["tar"]), packdata.open(packed["hdf5"])
    order = [99, 3, 51, 0, 77, 50, 49, 12]  # shards of 50 records: 0, 1, 2 and back
    for got, expected in zip(tar[order], h5[order], strict=True):
        assert torch.equal(got, expected)
    joined = tar.reader.maps.joined()
    if sys.platform == "linux":  # all shards in one address range: the batch was one gather
        assert joined is not None and joined[0].flags.writeable is False
        assert tar.manifest.fields["image"].nbytes in tar.reader.maps._windows  # its byte window
    else:  # elsewhere the per-shard maps read it
        assert joined is None


@pytest.mark.skipif(sys.platform != "linux", reason="joined maps are Linux's")
def test_a_reopened_tar_dataset_reads_through_the_map_of_the_last_open(packed, tmp_path):
    """Its shards' joined map (and the page-table entries it built) is kept in the process and
    found again by the files' identity; a shard replaced since is mapped anew, and a dataset
    deleted is let go."""
    path = tmp_path / "t"
    shutil.copytree(packed["tar"], path)
    first = packdata.open(path)
    expected = first[[0, 99, 51]]
    joined = first.reader.maps.joined()
    del first
    again = packdata.open(path)
    assert again.reader.maps.joined()[0] is joined[0]
    shard = sorted(path.glob("*.tar"))[0]
    shutil.copy(shard, tmp_path / "copy.tar")
    os.replace(tmp_path / "copy.tar", shard)  # the same bytes, another file
    replaced = packdata.open(path)
    assert replaced.reader.maps.joined()[0] is not joined[0]
    for got, want in zip(replaced[[0, 99, 51]], expected, strict=True):
        assert torch.equal(got, want)
    # deleted, its map is let go at the next open (so its disk space is freed)
    from packdata.containers import joined as joined_maps

    del again, replaced
    shutil.rmtree(path)
    packdata.open(packed["tar"]).reader.maps.joined()
    assert not [first for first, _ in joined_maps.KEPT.firsts() if path in first.parents]


@pytest.mark.skipif(sys.platform != "linux", reason="kept maps are Linux's")
def test_a_reopened_hdf5_dataset_reads_through_the_map_of_the_last_open(packed, tmp_path):
    """As tar's shards: the file's map is kept in the process and found again by the file's
    identity; a file replaced since is mapped anew, and reads the same records."""
    from packdata.containers import joined as joined_maps

    path = tmp_path / "d.h5"
    shutil.copy(packed["hdf5"], path)

    def kept() -> list:
        return [whole for first, (whole, _) in joined_maps.KEPT.firsts() if first == path]

    first = packdata.open(path)
    expected = first[[0, 99, 51]]
    [whole] = kept()
    del first
    packdata.open(path)
    assert [w is whole for w in kept()] == [True]
    shutil.copy(path, tmp_path / "copy.h5")
    os.replace(tmp_path / "copy.h5", path)  # the same bytes, another file
    replaced = packdata.open(path)
    assert [w is whole for w in kept()] == [False]
    for got, want in zip(replaced[[0, 99, 51]], expected, strict=True):
        assert torch.equal(got, want)


def test_a_reopened_hdf5_dataset_is_opened_without_h5py(packed, tmp_path, monkeypatch):
    """h5py opens the file once per process (detection and the open share what it read); an
    unchanged file reopens from what was kept, a rewritten one is read anew."""
    import h5py

    path = tmp_path / "d.h5"
    shutil.copy(packed["hdf5"], path)
    opened = []
    real_file = h5py.File
    monkeypatch.setattr(h5py, "File", lambda *a, **k: opened.append(a[0]) or real_file(*a, **k))
    first = packdata.open(path)
    expected = first[[0, 99, 51]]
    assert opened == [path]
    again = packdata.open(path)
    assert opened == [path]
    for got, want in zip(again[[0, 99, 51]], expected, strict=True):
        assert torch.equal(got, want)
    shutil.copy(path, tmp_path / "copy.h5")
    os.replace(tmp_path / "copy.h5", path)  # the same bytes, another file
    packdata.open(path)
    assert opened == [path, path]


def test_a_kept_hdf5_layout_still_reads_the_manifest_from_the_file(packed, tmp_path):
    """The manifest's bytes are read at each open, never kept: edited in place with the file's
    identity restored (size and modification time), the next open refuses it."""
    path = tmp_path / "d.h5"
    shutil.copy(packed["hdf5"], path)
    packdata.open(path)
    stat = path.stat()
    data = bytearray(path.read_bytes())
    count = re.search(rb'"count":(\d+)', bytes(data))
    assert count is not None
    fewer = str(int(count[1]) - 1).encode().rjust(len(count[1]))  # valid JSON, a wrong fact
    data[count.start(1) : count.end(1)] = fewer  # the same size
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_mtime_ns == stat.st_mtime_ns and path.stat().st_size == stat.st_size
    with pytest.raises(packdata.DatasetError, match="manifest"):
        packdata.open(path)


def test_every_kind_declares_what_loading_may_ask_of_it():
    from packdata.loading import samples

    assert set(samples.SERVED) == set(packdata.sources.KINDS)  # one table each side, alike
    for kind in packdata.sources.KINDS:
        served = samples.get(kind)
        assert callable(served.to_torch) and isinstance(served.decodes, bool)
        assert served.select is None or callable(served.select)
    assert samples.get("image").decodes and samples.get("image").channels_last
    assert samples.get("pointcloud").select is not None
    with pytest.raises(packdata.PackdataError, match="unknown sample kind 'video'"):
        samples.get("video")


def test_a_decode_stage_on_text_is_refused_naming_the_dataset(tmp_path, peps_dir):
    folder = tmp_path / "peps"
    folder.mkdir()
    for p in sorted(peps_dir.glob("*.txt"))[:2]:
        (folder / p.name).write_bytes(p.read_bytes())
    out = packdata.convert(packdata.open_source(folder, tokenizer="bytes"), tmp_path / "t.h5").path
    with pytest.raises(packdata.DatasetError, match=f"{out}: decode= applies to image datasets"):
        packdata.open(out, decode=packdata.CenterCrop(8))


class TutorialNet(torch.nn.Module):
    """The network of PyTorch's CIFAR-10 tutorial ("Training a classifier"), unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 6, 5)
        self.pool = torch.nn.MaxPool2d(2, 2)
        self.conv2 = torch.nn.Conv2d(6, 16, 5)
        self.fc1 = torch.nn.Linear(16 * 5 * 5, 120)
        self.fc2 = torch.nn.Linear(120, 84)
        self.fc3 = torch.nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.nn.functional.relu(self.conv1(x)))
        x = self.pool(torch.nn.functional.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = torch.nn.functional.relu(self.fc1(x))
        x = torch.nn.functional.relu(self.fc2(x))
        return self.fc3(x)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stock_dataloader_feeds_the_pytorch_cifar_tutorial_network(packed, container, workers):
    net = TutorialNet()
    loader = DataLoader(packdata.open(packed[container]), batch_size=4, num_workers=workers)
    for step, (images, labels) in enumerate(loader):
        assert images.is_contiguous() and images.view(4, -1).shape == (4, 3 * 32 * 32)
        loss = torch.nn.functional.cross_entropy(net(images.float() / 255), labels)
        loss.backward()
        if step == 2:
            break


def test_every_path_serves_contiguous_images_and_channels_last_on_request(packed):
    ds = packdata.open(packed["lmdb"])
    batches = [ds[[3, 1, 2]][0], ds[0:4][0], next(iter(packdata.loader(ds, batch_size=4)))[0],
               next(iter(packdata.loader(ds, batch_size=4, num_workers=2)))[0],
               next(iter(packdata.loader(ds, batch_size=4, num_workers=2, workers="process")))[0]]
    batches.append(packdata.open(packed["lmdb"], decode=packdata.CenterCrop(16))[[4, 0]][0])
    assert all(b.is_contiguous() for b in batches)
    assert ds[5][0].is_contiguous() and ds[5][0].shape == (3, 32, 32)
    fast = packdata.open(packed["lmdb"], channels_last=True)
    x = fast[[3, 1, 2]][0]
    assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    assert torch.equal(x, batches[0])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_users_collate_fn_gets_tuples_with_and_without_workers(packed, workers):
    ds = packdata.open(packed["tar"])

    def collate(rows):  # runs in the worker with workers: its findings travel with the batch
        assert all(isinstance(row, tuple) and len(row) == 2 for row in rows)
        images, labels = zip(*rows)
        return torch.stack(images), torch.stack(labels), [type(row) for row in rows]

    for images, labels, kinds in DataLoader(ds, batch_size=8, num_workers=workers,
                                            collate_fn=collate):
        assert all(issubclass(k, tuple) for k in kinds)
        expected = ds[list(range(8))]  # the first batch, unshuffled
        assert torch.equal(images, expected[0]) and torch.equal(labels, expected[1])
        break


def test_pickling_one_row_writes_that_sample_not_the_batch(packed):
    ds = packdata.open(packed["lmdb"])
    rows = ds.__getitems__(list(range(64)))
    data = pickle.dumps(rows[5])
    assert len(data) < 2 * 3 * 32 * 32  # one image and a label, not 64 images
    image, label = pickle.loads(data)
    assert type(pickle.loads(data)) is tuple
    assert torch.equal(image, ds[5][0]) and int(label) == int(ds[5][1])


@pytest.mark.parametrize("option", [{"transform": 5}, {"batch_transform": "x"}, {"decode": "bogus"}])
def test_a_transform_or_decode_that_cannot_be_called_is_refused_at_open(packed, option):
    # each failed at the first read; decode= was even blamed on the dataset ("the manifest does
    # not fit the records")
    (name, _), = option.items()
    with pytest.raises(packdata.errors.ArgumentTypeError, match=f"{name} must be callable"):
        packdata.open(packed["hdf5"], **option)
