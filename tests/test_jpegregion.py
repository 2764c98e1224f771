"""A crop of a stored JPEG decoded alone (packdata/_jpeg.c) holds the pixels of the whole decode,
bit for bit, at every DCT scale, in colour and grey; decode stages give the same batches with it
as without it; files it refuses are decoded whole. Real photographs from tests/fixtures/images
(see SOURCE.md there)."""

from __future__ import annotations

import numpy as np
import pytest
import simplejpeg
import torch

import packdata
from packdata import jpegregion
from tests.test_imagedecode import as_arrays, crops

pytestmark = pytest.mark.skipif(
    not jpegregion.NATIVE, reason="packdata's JPEG extension was not built here (it needs "
    "libjpeg-turbo's headers, e.g. Debian's libjpeg62-turbo-dev)")


def whole(data: np.ndarray, scale: int, grey: bool) -> np.ndarray:
    h, w = simplejpeg.decode_jpeg_header(data)[:2]
    pixels = simplejpeg.decode_jpeg(data, colorspace="Gray" if grey else "RGB",
                                    min_height=-(-h // scale), min_width=-(-w // scale))
    return pixels if pixels.ndim == 3 else pixels[:, :, None]


def boxes(h: int, w: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Boxes touching each edge and corner, the whole image, one pixel, and random ones."""
    edge = [[0, 0, w, h], [0, 0, 1, 1], [w - 1, h - 1, w, h], [0, h // 3, w // 2, h],
            [w // 3, 0, w, h // 2], [17, 5, 18, h]]
    random = [sorted(rng.uniform(0, w, 2)) + sorted(rng.uniform(0, h, 2)) for _ in range(12)]
    out = [np.array(b, np.float64) for b in edge]
    for left, right, top, bottom in random:
        box = np.round([left, top, right, bottom])
        box[2:] = np.maximum(box[2:], box[:2] + 1)
        out.append(np.minimum(box, [w, h, w, h]))
    return out


@pytest.mark.parametrize("grey", [False, True], ids=["rgb", "grey"])
@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_a_crop_decoded_alone_is_the_whole_decodes_crop(scale, grey):
    rng = np.random.default_rng(scale)
    for data in as_arrays(crops(count=6, seed=scale)):
        h, w = simplejpeg.decode_jpeg_header(data)[:2]
        full = whole(data, scale, grey)
        for box in boxes(h, w, rng):
            got = jpegregion.decode_crop(data, (h, w), scale, box, grey)
            left, top, right, bottom = (int(v) for v in jpegregion.scaled_box(box, full.shape, h, w))
            assert right > left and bottom > top
            want = torch.from_numpy(full[top:bottom, left:right]).permute(2, 0, 1).unsqueeze(0)
            assert got is not None and got.shape == want.shape, (box, scale)
            assert torch.equal(got, want), (box, scale)


@pytest.mark.parametrize("stage", [packdata.RandomResizedCrop(64, seed=3),
                                   packdata.RandomResizedCrop(64, seed=3, draft=False),
                                   packdata.CenterCrop(48, resize=56), packdata.Resize(40)],
                         ids=["train", "train-full-scale", "eval", "resize"])
def test_decode_stages_give_the_same_batches_with_and_without_it(stage, monkeypatch):
    encoded = as_arrays(crops(count=12, seed=5))
    for mode in ("RGB", "L"):
        alone = stage(encoded, encoded=True, mode=mode, indices=np.arange(12))
        with monkeypatch.context() as m:
            m.setattr(jpegregion, "_jpeg", None)
            assert torch.equal(stage(encoded, encoded=True, mode=mode, indices=np.arange(12)),
                               alone)


def test_files_it_refuses_are_decoded_whole_or_named():
    good = as_arrays(crops(count=1))[0]
    h, w = simplejpeg.decode_jpeg_header(good)[:2]
    top = np.array([0.0, 0.0, w, 8.0])
    assert jpegregion.decode_crop(good, (h, w), 1, top, False) is not None
    # cut short below the box: not decoded alone (the box's rows are all there), so the whole
    # decode finds the cut and the stage names it
    cut = good[: len(good) * 3 // 4]
    assert jpegregion.decode_crop(cut, (h, w), 1, top, False) is None
    with pytest.raises(packdata.DatasetError, match="cannot be decoded"):
        packdata.Resize(8)([cut], encoded=True)
    # the entropy-coded data damaged (end marker kept): libjpeg's warning is a refusal
    damaged = good.copy()
    damaged[len(good) // 2 : len(good) // 2 + 64] = 0xFF
    assert jpegregion.decode_crop(damaged, (h, w), 1, np.array([0.0, 0, w, h]), False) is None
