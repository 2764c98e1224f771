"""The batched decode stages: fused crops equal the unfused reference, boxes follow
torchvision's RandomResizedCrop rule, results do not depend on threads. Real photographs from
tests/fixtures/images (see SOURCE.md there)."""

from __future__ import annotations

import io
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import packdata
from packdata import imagedecode
from packdata.imagedecode import random_resized_boxes

FIXTURES = Path(__file__).parent / "fixtures" / "images"


def crops(count: int = 8, seed: int = 0, fmt: str = "JPEG") -> list[bytes]:
    """Encoded crops of several sizes (shorter side 60–400) of the fixture photographs."""
    rng = np.random.default_rng(seed)
    photos = [Image.open(FIXTURES / n).convert("RGB") for n in ("chelsea.jpg", "coffee.jpg")]
    out = []
    for k in range(count):
        photo = photos[k % 2]
        w, h = int(rng.integers(60, photo.width)), int(rng.integers(60, photo.height))
        x, y = int(rng.integers(0, photo.width - w + 1)), int(rng.integers(0, photo.height - h + 1))
        buf = io.BytesIO()
        photo.crop((x, y, x + w, y + h)).save(buf, fmt, quality=90)
        out.append(buf.getvalue())
    return out


def as_arrays(encoded: list[bytes]) -> list[np.ndarray]:
    return [np.frombuffer(b, np.uint8) for b in encoded]


def full_decode(data: bytes, mode: str = "RGB") -> Image.Image:
    return Image.open(io.BytesIO(data)).convert(mode)


def reference(images: list[Image.Image], boxes: np.ndarray, flips: np.ndarray,
              size: tuple[int, int], pillow: bool = False) -> torch.Tensor:
    """Unfused, as torchvision does it: the whole image, crop the box, resize (antialiased
    bilinear: torch's uint8 kernel, or Pillow's with ``pillow``), then mirror."""
    out = []
    for im, box, flip in zip(images, boxes, flips):
        crop = im.crop(tuple(int(v) for v in box))
        if pillow:
            y = torch.from_numpy(np.array(crop.resize(size[::-1], Image.Resampling.BILINEAR)))
            y = (y.unsqueeze(-1) if y.ndim == 2 else y).permute(2, 0, 1)
        else:
            x = torch.from_numpy(np.array(crop))
            x = (x.unsqueeze(-1) if x.ndim == 2 else x).permute(2, 0, 1).unsqueeze(0)
            y = torch.nn.functional.interpolate(x, size=size, mode="bilinear", antialias=True)[0]
        out.append(y.flip(-1) if flip else y)
    return torch.stack(out)


def sizes_of(images: list[Image.Image]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([im.height for im in images]), np.array([im.width for im in images])


@pytest.mark.parametrize("stage", [packdata.RandomResizedCrop(48, seed=3),
                                   packdata.CenterCrop((40, 56), resize=64, seed=3),
                                   packdata.Resize(32, seed=3)])
def test_fused_decode_equals_decode_crop_resize(stage):
    encoded = crops()
    decoded = [full_decode(b) for b in encoded]
    indices = np.arange(len(encoded))
    boxes, flips = stage.crop_boxes(*sizes_of(decoded), indices, epoch=2)
    expected = reference(decoded, boxes, flips, stage.size)
    # raw pixels of any size, as rows plus sizes: only the box is touched, result identical
    rows = [np.asarray(im).reshape(-1, 3) for im in decoded]
    hw = np.array([(im.height, im.width) for im in decoded], np.int32)
    raw = stage(rows, encoded=False, sizes=hw, indices=indices, epoch=2)
    assert raw.shape == (len(encoded), 3, *stage.size) and raw.dtype == torch.uint8
    assert torch.equal(raw, expected)
    # stored JPEG decoded at full scale: identical too
    stage.draft = False
    assert torch.equal(stage(as_arrays(encoded), encoded=True, indices=indices, epoch=2), expected)
    stage.draft = True
    # Pillow's resize (torchvision's path for PIL images) agrees within one grey level
    diff = (reference(decoded, boxes, flips, stage.size, pillow=True).int() - raw.int()).abs()
    assert diff.float().mean() < 0.05 and diff.max() <= 1  # measured: 0.002-0.016 and 1

def test_draft_scaled_jpeg_decode_stays_close_to_the_full_decode():
    """Boxes at least twice the output decode at 1/2, 1/4 or 1/8 scale (libjpeg-turbo's DCT
    scaling): a different low-pass than bilinear from full size, so not bit-equal; measured
    here on real photographs as a small mean difference with rare larger ones at edges."""
    encoded = crops(count=8, seed=1)
    decoded = [full_decode(b) for b in encoded]
    stage = packdata.Resize(24)  # every crop is >= 60 px: reduced at least 2x
    boxes, flips = stage.crop_boxes(*sizes_of(decoded))
    expected = reference(decoded, boxes, flips, stage.size).int()
    got = stage(as_arrays(encoded), encoded=True).int()
    diff = (got - expected).abs().float()
    assert not torch.equal(got, expected)  # the reduced-scale decode did run
    assert diff.mean() < 2.5 and diff.quantile(0.99) <= 20  # measured: 2.2 and 16


def test_pillow_decodes_when_simplejpeg_is_missing(monkeypatch):
    encoded = as_arrays(crops(count=6, seed=7))
    stage = packdata.RandomResizedCrop(40, seed=1, draft=False)
    with_simplejpeg = stage(encoded, encoded=True)
    monkeypatch.setattr(imagedecode, "simplejpeg", None)
    assert torch.equal(stage(encoded, encoded=True), with_simplejpeg)  # same libjpeg-turbo
    stage.draft = True  # Pillow's draft: the same 1/2, 1/4, 1/8 scales
    assert (stage(encoded, encoded=True).int() - with_simplejpeg.int()).abs().float().mean() < 3


def test_random_resized_boxes_follow_the_rule():
    rng = np.random.default_rng(0)
    n = 20_000
    h, w = np.full(n, 300), np.full(n, 400)
    boxes = random_resized_boxes(h, w, (0.08, 1.0), (3 / 4, 4 / 3), rng)
    left, top, right, bottom = boxes.T
    bw, bh = right - left, bottom - top
    assert np.array_equal(boxes, np.round(boxes))  # integer corners
    assert (left >= 0).all() and (top >= 0).all() and (right <= 400).all() and (bottom <= 300).all()
    # rounding each side to whole pixels moves area and aspect a little past the bounds
    area = bw * bh / (300 * 400)
    assert area.min() >= 0.08 * 0.95 and area.max() <= 1.0
    slack = 1 / np.minimum(bw, bh)
    assert (np.abs(np.log(bw / bh)) <= math.log(4 / 3) + slack).all()
    # positions are uniform over every place the box fits: both extremes occur
    assert (left == 0).any() and (right == 400).any() and (top == 0).any() and (bottom == 300).any()


def torchvision_get_params(height: int, width: int, scale, ratio, rand: random.Random):
    """torchvision.transforms.RandomResizedCrop.get_params, transcribed (Python's random)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rand.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rand.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = rand.randint(0, height - h)
            j = rand.randint(0, width - w)
            return j, i, j + w, i + h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    i, j = (height - h) // 2, (width - w) // 2
    return j, i, j + w, i + h


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    grid = np.union1d(a, b)
    ca = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    cb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(ca - cb).max())


@pytest.mark.parametrize("height,width", [(300, 400), (90, 600)])  # (90, 600): often falls back
def test_box_distribution_matches_torchvision(height, width):
    n = 8_000
    rand = random.Random(1)
    ref = np.array([torchvision_get_params(height, width, (0.08, 1), (3 / 4, 4 / 3), rand)
                    for _ in range(n)], np.float64)
    ours = random_resized_boxes(np.full(n, height), np.full(n, width), (0.08, 1), (3 / 4, 4 / 3),
                                np.random.default_rng(2))

    def features(b):
        w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        return w * h, np.log(w / h), b[:, 0] + w / 2, b[:, 1] + h / 2

    for a, b in zip(features(ours), features(ref)):
        assert ks_statistic(a, b) < 0.035  # 2-sample KS, n = 8,000: p ~ 1e-4 at 0.035


@pytest.mark.parametrize("height,width,scale,ratio,expected", [
    (100, 1000, (0.5, 1.0), (3 / 4, 4 / 3), [433, 0, 566, 100]),  # too wide: 4/3 centred box
    (1000, 100, (0.5, 1.0), (3 / 4, 4 / 3), [0, 433, 100, 566]),  # too tall: 3/4 centred box
    (200, 200, (0.9, 1.0), (2.0, 3.0), [0, 50, 200, 150]),  # nothing fits: nearest ratio, 2
    (200, 260, (1.5, 2.0), (3 / 4, 4 / 3), [0, 0, 260, 200]),  # within the ratios: whole image
])
def test_no_fitting_box_in_ten_tries_falls_back_to_the_centre(height, width, scale, ratio,
                                                              expected):
    boxes = random_resized_boxes(np.full(50, height), np.full(50, width), scale, ratio,
                                 np.random.default_rng(0))
    assert (boxes == np.array(expected, np.float64)).all()


def test_center_crop_is_torchvisions_resize_then_center_crop():
    stage = packdata.CenterCrop(224, resize=256)
    boxes, flips = stage.crop_boxes(np.array([375]), np.array([500]))
    # Resize(256): 375x500 -> 256x341 (long side truncated); CenterCrop(224): top 16, left 58
    sx, sy = 500 / 341, 375 / 256  # the same region of the original, to whole pixels
    assert np.array_equal(boxes[0], np.round([58 * sx, 16 * sy, 282 * sx, 240 * sy]))
    assert not flips.any()
    photo = full_decode((FIXTURES / "coffee.jpg").read_bytes())  # 600x400
    two_step = np.asarray(photo.resize((384, 256), Image.Resampling.BILINEAR)
                          .crop((80, 16, 304, 240))).astype(int)
    data = np.frombuffer((FIXTURES / "coffee.jpg").read_bytes(), np.uint8)
    fused = stage([data], encoded=True)[0].permute(1, 2, 0).numpy().astype(int)
    # one resampling instead of two: the same region, slightly sharper
    assert np.abs(fused - two_step).mean() < 2.0


def test_flip_threads_seed_and_epoch():
    data = as_arrays(crops(count=6, seed=4))
    idx = np.arange(6)
    plain = packdata.RandomResizedCrop(32, flip=0.0, seed=5, threads=1)(data, encoded=True,
                                                                      indices=idx)
    mirrored = packdata.RandomResizedCrop(32, flip=1.0, seed=5, threads=3)(data, encoded=True,
                                                                         indices=idx)
    assert torch.equal(mirrored, plain.flip(-1))
    again = packdata.RandomResizedCrop(32, flip=0.0, seed=5, threads=2)
    assert torch.equal(again(data, encoded=True, indices=idx), plain)
    assert not torch.equal(again(data, encoded=True, indices=idx, epoch=1), plain)
    unseeded = packdata.RandomResizedCrop(32)
    assert not torch.equal(unseeded(data, encoded=True), unseeded(data, encoded=True))


def test_grey_png_and_empty_batches():
    encoded = crops(count=3, seed=6, fmt="PNG")
    grey = packdata.CenterCrop(20)(as_arrays(encoded), encoded=True, mode="L")
    boxes, _ = packdata.CenterCrop(20).crop_boxes(*sizes_of([full_decode(b) for b in encoded]))
    expected = reference([full_decode(b, "L") for b in encoded], boxes, np.zeros(3, bool), (20, 20))
    assert grey.shape == (3, 1, 20, 20) and torch.equal(grey, expected)
    empty = packdata.RandomResizedCrop(16)([], encoded=True)
    assert empty.shape == (0, 3, 16, 16)


def test_bad_stored_bytes_and_bad_arguments_are_named():
    good = crops(count=1)[0]
    with pytest.raises(packdata.DatasetError, match="cannot be opened"):
        packdata.Resize(8)([np.frombuffer(b"not an image", np.uint8)], encoded=True)
    with pytest.raises(packdata.DatasetError, match="cannot be decoded"):
        packdata.Resize(8, draft=False)([np.frombuffer(good[: len(good) // 2], np.uint8)],
                                        encoded=True)
    with pytest.raises(ValueError, match="scale"):
        packdata.RandomResizedCrop(8, scale=(0.5, 0.1))
    with pytest.raises(ValueError, match="smaller than the crop"):
        packdata.CenterCrop(224, resize=200)
    with pytest.raises(ValueError, match="positive"):
        packdata.Resize(0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_batches_for_cuda_are_pinned():
    assert packdata.Resize(8)(as_arrays(crops(count=2)), encoded=True).is_pinned()


def test_contiguous_batches_equal_channels_last_ones():
    """``channels_last=False`` (what ``packdata.open`` asks for by default) lays each image out
    in its decode thread: the same values as the channels-last batch, contiguous N×C×H×W."""
    encoded = crops(count=6, seed=8)
    rows = [np.asarray(full_decode(b)).reshape(-1, 3) for b in encoded]
    hw = np.array([full_decode(b).size[::-1] for b in encoded])
    idx = np.arange(6)
    for stage in (packdata.RandomResizedCrop(40, seed=2, threads=2), packdata.CenterCrop(24)):
        for images, options in ((as_arrays(encoded), {"encoded": True}),
                                (rows, {"encoded": False, "sizes": hw})):
            last = stage(images, indices=idx, **options)
            planar = stage(images, indices=idx, channels_last=False, **options)
            assert last.is_contiguous(memory_format=torch.channels_last)
            assert planar.is_contiguous() and torch.equal(planar, last)
    grey = packdata.Resize(16)(as_arrays(encoded), encoded=True, mode="L", channels_last=False)
    assert grey.shape == (6, 1, 16, 16) and grey.is_contiguous()


def test_a_batch_buffer_is_reused_only_once_nothing_holds_its_batch():
    encoded = as_arrays(crops(count=4, seed=9))
    stage = packdata.Resize(32, pin_memory=False)
    first = stage(encoded, encoded=True)
    kept, address = first[1:2].clone(), first.data_ptr()
    view = first[2:]  # a view keeps the buffer
    del first
    second = stage(encoded, encoded=True)
    assert second.data_ptr() != address
    assert torch.equal(view, second[2:])
    view_values = view.clone()
    del view
    third = stage(list(reversed(encoded)), encoded=True)  # the first buffer, free again
    assert third.data_ptr() == address
    assert torch.equal(third[2:], torch.stack([second[1], second[0]]))
    assert torch.equal(view_values, second[2:]) and torch.equal(kept, second[1:2])


@pytest.mark.parametrize("size", ["a", "ab", 2.5, (224, "x"), (224, 0), (3, 4, 5), None])
def test_a_crop_size_that_is_not_a_pair_of_positive_integers_is_refused_by_name(size):
    # a string or float failed unpacking inside the size parser
    for stage in (packdata.CenterCrop, packdata.Resize, packdata.RandomResizedCrop):
        with pytest.raises(packdata.errors.ArgumentError, match="expected positive integers"):
            stage(size)
    assert packdata.CenterCrop((24, 32.0)) is not None  # whole numbers, whatever their type


@pytest.mark.parametrize(("option", "value", "least"), [
    ("threads", -1, 1), ("threads", 0, 1), ("threads", 1.5, 1), ("seed", -1, 0), ("seed", "7", 0)])
def test_a_decode_stage_count_that_is_not_one_is_refused_by_name(option, value, least):
    # each was kept as given, to fail at the first batch or never (a negative thread count)
    with pytest.raises(packdata.errors.ArgumentError, match=f"{option} must be an integer ≥ {least}"):
        packdata.RandomResizedCrop(32, **{option: value})
