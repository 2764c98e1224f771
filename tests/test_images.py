"""Images of any size: raw (``max_size``) and ``keep`` storage round-trip pixel-exact in every
container and batch through a decode stage. Crops of the real photographs in tests/fixtures/images
(see SOURCE.md there), saved as JPEG and PNG files of several sizes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from typer.testing import CliRunner

import packdata
from packdata.cli import app
from packdata.loading.settings import default_num_workers
from packdata.sources.images import ImageSource, limited_size
from packdata.verification import source_for, verify
from tests.conftest import IMAGE_FIXTURES, copy_sample, pillow_pixels

CONTAINERS = {"lmdb": "d.lmdb", "hdf5": "d.h5", "tar": "d-tar"}


def file_of(root: Path, key: str) -> Path:
    return next(root.glob(f"{key}.*"))


def pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def convert(folder: Path, out: Path, **options) -> Path:
    opts = {"shard_size": "5"} if out.suffix == "" else None
    return packdata.convert(packdata.open_source(folder, **options), out, workers=1,
                            container_options=opts).path


@pytest.mark.parametrize("container", list(CONTAINERS))
def test_raw_and_keep_storage_of_any_size_round_trip_pixel_exact(tmp_path, photo_folder,
                                                                 container):
    raw = packdata.open(convert(photo_folder, tmp_path / f"raw-{CONTAINERS[container]}",
                                max_size=1000))
    keep = packdata.open(convert(photo_folder, tmp_path / f"keep-{CONTAINERS[container]}",
                                 encoding="keep"))
    assert raw.manifest.fields["image"].shape == (None, 3)
    assert raw.manifest.fields["image_size"].shape == (2,)
    assert len(raw) == len(keep) == 14
    sizes = set()
    for i, key in enumerate(raw.keys):
        expected = torch.from_numpy(pixels(file_of(photo_folder, key)).copy()).permute(2, 0, 1)
        sizes.add(tuple(expected.shape))
        for ds in (raw, keep):
            image, label = ds[i]
            assert torch.equal(image, expected), (ds, key)
            assert label == ds.classes.index(key.split("/")[0])
    assert len(sizes) == 14  # every image a different size


@pytest.mark.parametrize("cut", ["half", "last bytes"])
def test_kept_jpegs_are_checked_to_their_last_bytes(tmp_path, photo_folder, cut):
    """Kept files are decoded only to check them (at the smallest DCT scale), yet a JPEG cut
    anywhere in its bitstream still stops the conversion, naming it."""
    folder = tmp_path / "in"
    shutil.copytree(photo_folder, folder)
    damaged = folder / "coffee" / "2.jpg"
    data = damaged.read_bytes()
    damaged.write_bytes(data[: len(data) // 2] if cut == "half" else data[:-200])
    with pytest.raises(packdata.PackdataError, match="coffee/2.jpg.*truncated"):
        convert(folder, tmp_path / "keep.h5", encoding="keep")


def test_max_size_limits_the_shorter_side_keeping_the_aspect(tmp_path, photo_folder):
    ds = packdata.open(convert(photo_folder, tmp_path / "small.h5", max_size=100))
    assert ds.manifest.options["max_size"] == 100
    shrunk = 0
    for i, key in enumerate(ds.keys):
        with Image.open(file_of(photo_folder, key)) as im:
            original = im.convert("RGB")
        image = ds[i][0]
        if min(original.size) > 100:
            expected = np.asarray(original.resize(limited_size(original.size, 100),
                                                  Image.Resampling.BILINEAR))
            assert min(image.shape[1:]) == 100
            assert abs(image.shape[2] / image.shape[1] - original.width / original.height) < 0.02
            shrunk += 1
        else:
            expected = np.asarray(original)  # never enlarged
        assert torch.equal(image, torch.from_numpy(expected.copy()).permute(2, 0, 1))
        assert ds.reader.read([i])["image_size"][0].tolist() == list(image.shape[1:])
    assert 0 < shrunk < len(ds)


def test_mixed_sizes_without_a_decode_stage_say_how_to_batch_them(tmp_path, photo_folder):
    for options in ({"max_size": 256}, {"encoding": "keep"}, {}):
        ds = packdata.open(convert(photo_folder, tmp_path / f"{len(options)}{options}.h5",
                                   **options))
        with pytest.raises(packdata.DatasetError, match=r"different sizes.*decode=packdata"):
            ds[[0, 1, 2]]
    with pytest.raises(packdata.PackdataError, match="--max-size needs"):
        packdata.open_source(photo_folder, encoding="keep", max_size=64)


@pytest.mark.parametrize("container", list(CONTAINERS))
def test_mixed_sizes_convert_by_default_unscaled_and_batch_through_a_decode_stage(
        tmp_path, photo_folder, container):
    """The default (raw) conversion of a folder of photos of 14 sizes: rows of any size, each
    image's pixels exactly as Pillow decodes its file; through a decode stage, the same crops as
    from the original files."""
    path = convert(photo_folder, tmp_path / CONTAINERS[container])
    ds = packdata.open(path)
    assert ds.manifest.fields["image"].shape == (None, 3)
    assert ds.manifest.options["max_size"] is None and ds.manifest.source["mixed_sizes"]
    for i, key in enumerate(ds.keys):
        image, label = ds[i]
        expected = torch.from_numpy(pixels(file_of(photo_folder, key)).copy()).permute(2, 0, 1)
        assert torch.equal(image, expected), key
        assert label == ds.classes.index(key.split("/")[0])
    keep = convert(photo_folder, tmp_path / f"keep-{CONTAINERS[container]}", encoding="keep")
    crops = [packdata.open(p, decode=packdata.RandomResizedCrop(24, seed=1)) for p in (path, keep)]
    images, labels = crops[0][list(range(14))]
    assert images.shape == (14, 3, 24, 24) and labels.tolist() == [0] * 7 + [1] * 7
    # the PNGs' crops equal those cut from their files (JPEG files are decoded at a reduced DCT
    # scale when the crop allows, so their crops differ slightly from crops of full pixels)
    png = [i for i, key in enumerate(ds.keys) if file_of(photo_folder, key).suffix == ".png"]
    assert len(png) == 6 and torch.equal(crops[0][png][0], crops[1][png][0])
    for x, y in packdata.loader(crops[0], 5):
        assert x.shape == (len(y), 3, 24, 24)


def test_mixed_sizes_convert_in_parts_and_verify_against_their_source(tmp_path, photo_folder):
    """Converted in parts, each part stores the layout decided for the whole folder."""
    path = packdata.convert(packdata.open_source(photo_folder), tmp_path / "parts",
                            container="hdf5", workers=1, engine="local", part_size=4).path
    ds = packdata.open(path)
    assert ds.manifest.fields["image"].shape == (None, 3)
    for i in (0, 5, 13):
        expected = pixels(file_of(photo_folder, ds.keys[i]))
        assert torch.equal(ds[i][0], torch.from_numpy(expected.copy()).permute(2, 0, 1))
    result = CliRunner().invoke(app, ["verify", str(path), "--source", str(photo_folder)])
    assert result.exit_code == 0 and "14 compared" in result.output, result.output


def test_images_of_one_size_keep_one_fixed_shape(tmp_path):
    folder = tmp_path / "same"
    folder.mkdir()
    with Image.open(IMAGE_FIXTURES / "coffee.jpg") as im:
        for k in range(3):
            im.crop((10 * k, 0, 10 * k + 40, 30)).save(folder / f"{k}.png")
    ds = packdata.open(convert(folder, tmp_path / "same.h5"))
    assert ds.manifest.fields["image"].shape == (3, 30, 40)  # stored C×H×W
    assert not ds.manifest.source["mixed_sizes"] and "image_size" not in ds.manifest.fields
    assert ds[[0, 1, 2]].shape == (3, 3, 30, 40)


def test_a_header_that_lies_about_the_size_still_fails_naming_the_file(tmp_path):
    """Sizes are read from headers before converting; a file whose pixels are not what its
    header says (truncated) is that file's error, as before."""
    folder = tmp_path / "bad"
    folder.mkdir()
    with Image.open(IMAGE_FIXTURES / "coffee.jpg") as im:
        for k in range(2):
            im.crop((0, 0, 40, 30)).save(folder / f"{k}.png")
    data = (folder / "1.png").read_bytes()
    (folder / "1.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(packdata.SampleError, match=r"1.png: cannot decode image"):
        convert(folder, tmp_path / "bad.h5")


def test_decode_stage_gives_fixed_size_batches_on_every_path(tmp_path, photo_folder):
    path = convert(photo_folder, tmp_path / "k.lmdb", encoding="keep")
    ds = packdata.open(path, decode=packdata.RandomResizedCrop(32, seed=0))
    images, labels = ds[list(range(14))]
    assert images.shape == (14, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.tolist() == [0] * 7 + [1] * 7
    assert ds[3][0].shape == (3, 32, 32)
    assert default_num_workers(ds) == 0  # the decode stage has its own threads, in process
    for batches in (DataLoader(ds, batch_size=4, shuffle=True), packdata.loader(ds, 4)):
        seen = []
        for x, y in batches:
            assert x.shape == (len(y), 3, 32, 32) and x.dtype == torch.uint8
            seen += y.tolist()
        assert sorted(seen) == [0] * 7 + [1] * 7
    # the same indices, the same seeded crops, whichever path reads them
    first = next(iter(DataLoader(ds, batch_size=4, shuffle=False)))[0]
    assert torch.equal(first, ds[[0, 1, 2, 3]][0])
    in_workers = DataLoader(ds, batch_size=4, num_workers=2)  # a thread pool in each worker
    assert all(torch.equal(a[0], b[0]) for a, b in zip(in_workers, DataLoader(ds, batch_size=4)))
    evaluation = packdata.open(path, decode=packdata.CenterCrop(24, resize=28))
    got = evaluation[[0, 5]][0]
    stored = [np.frombuffer(file_of(photo_folder, evaluation.keys[i]).read_bytes(), np.uint8)
              for i in (0, 5)]
    # the records' own file bytes through the stage: no randomness, nothing of the index or
    # the batch's order enters a centre crop
    expected = packdata.CenterCrop(24, resize=28)(stored, encoded=True)
    assert torch.equal(got, expected) and torch.equal(evaluation[[5, 0]][0], expected.flip(0))
    for image, i in zip(got, (0, 5)):  # and it is torchvision's Resize(28) + CenterCrop(24)
        assert torch.equal(image, evaluation[i][0])
        with Image.open(file_of(photo_folder, evaluation.keys[i])) as im:
            original = im.convert("RGB")
        w, h = original.size
        short = min(w, h)
        new_w, new_h = (28, 28 * h // w) if w <= h else (28 * w // h, 28)
        top, left = round((new_h - 24) / 2), round((new_w - 24) / 2)
        two_step = np.asarray(original.resize((new_w, new_h), Image.Resampling.BILINEAR)
                              .crop((left, top, left + 24, top + 24))).astype(int)
        assert short > 28  # a real reduction, where one resampling and two differ a little
        # measured 3.6 (a JPEG, decoded at reduced scale) and 2.0; the crop off centre: 17.7
        assert np.abs(image.permute(1, 2, 0).numpy().astype(int) - two_step).mean() < 6.0


def test_decode_is_refused_for_other_kinds(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("some text")
    path = packdata.convert(packdata.open_source(tmp_path / "docs"), tmp_path / "t.h5").path
    with pytest.raises(packdata.DatasetError, match="decode= applies to image datasets"):
        packdata.open(path, decode=packdata.RandomResizedCrop(8))


def test_cli_max_size(tmp_path, photo_folder):
    out = tmp_path / "cli.h5"
    result = CliRunner().invoke(app, ["convert", str(photo_folder), str(out), "--workers", "1",
                                      "--max-size", "64"])
    assert result.exit_code == 0, result.output
    assert max(min(packdata.open(out)[i][0].shape[1:]) for i in range(14)) == 64


# -- how fixed-size raw pixels are stored: C×H×W (the default), H×W×C, or as earlier versions did --


class EarlierImageSource(ImageSource):
    """An image source as packdata wrote them before ``pixel_order`` existed: H×W×C records and
    no ``pixel_order`` in the manifest."""

    def __init__(self, root, **options):
        super().__init__(root, pixel_order="hwc", **options)

    def options(self):
        return {k: v for k, v in super().options().items() if k != "pixel_order"}


@pytest.fixture(scope="module")
def orders(tmp_path_factory) -> dict[str, Path]:
    """The real CIFAR PNGs in every container with C×H×W records, in HDF5 with H×W×C ones, and
    in HDF5 as written before the option existed."""
    out = tmp_path_factory.mktemp("orders")
    png = copy_sample(out / "png", 40)
    made = {name: packdata.convert(packdata.open_source(png), out / target, workers=1).path
            for name, target in CONTAINERS.items()}
    made["hwc"] = packdata.convert(packdata.open_source(png, pixel_order="hwc"), out / "hwc.h5",
                                   workers=1).path
    made["earlier"] = packdata.convert(EarlierImageSource(png), out / "earlier.h5", workers=1).path
    made["png"] = png
    return made


def _pngs(ds) -> tuple[np.ndarray, np.ndarray]:
    """The dataset's images as Pillow decodes their PNG files (N×C×H×W), and their labels."""
    root = Path(ds.manifest.source["path"])
    meta = json.loads((root / "labels.json").read_text())
    pixels = np.stack([pillow_pixels(root / f"{k}.png") for k in ds.keys]).transpose(0, 3, 1, 2)
    return pixels, np.array([meta["labels"][f"{k}.png"] for k in ds.keys])


def _check(images, labels, pixels, wanted, indices, channels_last) -> None:
    assert images.shape == (len(indices), 3, 32, 32) and images.dtype == torch.uint8
    assert np.array_equal(images.numpy(), pixels[indices])
    assert labels.tolist() == wanted[indices].tolist()
    if channels_last:
        assert images.is_contiguous(memory_format=torch.channels_last)
    else:
        assert images.is_contiguous()
        images.view(len(indices), -1)  # code written for torchvision's datasets runs


@pytest.mark.parametrize("name", ["lmdb", "hdf5", "tar", "hwc", "earlier"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_pixels_equal_the_pngs_on_every_path_in_either_stored_order(orders, name, channels_last):
    ds = packdata.open(orders[name], channels_last=channels_last)
    chw = name in CONTAINERS
    assert ds.manifest.fields["image"].shape == ((3, 32, 32) if chw else (32, 32, 3))
    assert ds.manifest.options.get("pixel_order") == ("chw" if chw else "hwc" if name == "hwc"
                                                      else None)
    pixels, wanted = _pngs(ds)
    for i in (0, 17, len(ds) - 1):
        image, label = ds[i]
        assert np.array_equal(image.numpy(), pixels[i]) and int(label) == wanted[i]
        assert (image.permute(1, 2, 0) if channels_last else image).is_contiguous()
    picked = np.array([31, 2, 17, 5])
    _check(*ds[picked.tolist()], pixels, wanted, picked, channels_last)
    for workers in (0, 2):
        loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers,
                            generator=torch.Generator().manual_seed(workers))
        seen = []
        for images, labels in loader:
            # a batch's indices are not exposed: find each image among the PNGs by its label
            _check(images, labels, pixels, wanted, _where(images, pixels), channels_last)
            seen.extend(_where(images, pixels))
        assert sorted(seen) == list(range(len(ds)))
    for images, labels in packdata.loader(ds, 8, shuffle=True):
        _check(images, labels, pixels, wanted, _where(images, pixels), channels_last)


def _where(images: torch.Tensor, pixels: np.ndarray) -> np.ndarray:
    flat = pixels.reshape(len(pixels), -1)
    return np.array([int(np.flatnonzero((flat == im.reshape(-1).numpy()).all(1))[0])
                     for im in images])


@pytest.mark.parametrize("name", ["hdf5", "hwc", "earlier"])
def test_a_fresh_conversion_matches_in_the_order_the_dataset_was_written(orders, name):
    ds = packdata.open(orders[name])
    report = verify(orders[name], source=source_for(ds.manifest, orders["png"]))
    assert report.compared == len(ds) and not report.bad and not report.problems


def test_a_pillow_mode_that_does_not_exist_is_refused_at_open_source(png_folder):
    # each image's decode failed instead, reported as that file's error
    with pytest.raises(packdata.errors.OptionError, match="--mode 'bogus': expected a Pillow mode"):
        packdata.open_source(png_folder, mode="bogus")
    assert packdata.open_source(png_folder, mode="L") is not None


def test_a_preview_of_photos_of_any_size_is_a_grid_of_thumbnails(tmp_path, photo_folder):
    """14 photos up to 450 pixels a side: each shrunk to at most 128 (aspect kept), so the grid
    of 8 columns stays under 8 × 130 pixels wide."""
    from packdata.describe import THUMBNAIL, write_preview

    ds = packdata.open(convert(photo_folder, tmp_path / "p.h5"))
    grid = write_preview(tmp_path / "p.h5", tmp_path / "grid.png")
    with Image.open(grid) as im:
        assert im.size == (8 * (THUMBNAIL + 2), 2 * (THUMBNAIL + 2))
        first = np.asarray(im.convert("RGB"))
    image = ds[0][0]
    h, w = image.shape[1:]
    scale = THUMBNAIL / max(h, w)
    th, tw = max(1, round(h * scale)), max(1, round(w * scale))
    shrunk = Image.fromarray(image.permute(1, 2, 0).numpy()).resize((tw, th),
                                                                  Image.Resampling.BILINEAR)
    assert np.abs(first[:th, :tw].astype(int) - np.asarray(shrunk).astype(int)).mean() < 2
