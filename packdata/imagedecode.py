"""Batched image decode stages: images of any size in, one fixed-size uint8 batch N×C×H×W out.

A decode stage is given to :func:`packdata.open` (``decode=``) and runs on every batch the
dataset reads, whatever the images' storage: stored file bytes (``--encoding keep``), raw pixels of
any size (``--max-size``) or raw pixels of one size.

- :class:`RandomResizedCrop` — training: torchvision's ImageNet rule (a box of 8–100 % of the
  area and aspect 3/4–4/3, ten tries, then the centre crop), resized to ``size``, mirrored with
  probability ``flip``;
- :class:`CenterCrop` — evaluation: torchvision's ``Resize(resize)`` + ``CenterCrop(size)``, as one
  resampling of the same region;
- :class:`Resize` — the whole image squashed to ``size``.

Crop and decode are fused: boxes are drawn for the whole batch at once from the images' sizes
(JPEG headers, or the stored sizes), then each image is decoded in a thread pool of this process
(Pillow releases the GIL while decoding and resampling) at the smallest JPEG DCT scale (1/2, 1/4,
1/8, libjpeg-turbo via ``Image.draft``) that keeps the box at least as large as the output, only
the box is resampled, and the result is written straight into one preallocated batch tensor
(pinned when CUDA is present). pillow-simd, when
installed in place of Pillow, is used as is.
"""

from __future__ import annotations

import io
import math
import os
import threading
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from PIL import Image

from packdata.errors import DatasetError

BILINEAR = Image.Resampling.BILINEAR  # torchvision's default for RandomResizedCrop and Resize
_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    if int(h) <= 0 or int(w) <= 0:
        raise ValueError(f"size {size!r}: expected positive integers (H, W)")
    return int(h), int(w)


def _pool(threads: int) -> ThreadPoolExecutor:
    """This process's decode pool (pools do not survive a fork: one per process id)."""
    key = (os.getpid(), threads)
    with _pools_lock:
        if key not in _pools:
            _pools[key] = ThreadPoolExecutor(threads, thread_name_prefix="packdata-decode")
        return _pools[key]


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class ImageDecode:
    """A batched decode stage (subclasses say where the box of each image lies).

    ``threads``: decode threads (default: the cores this process may use); ``pin_memory``: put
    the batch in pinned memory (default: when CUDA is available); ``seed``: random boxes depend
    only on (seed, epoch, the batch's indices) when given, fresh entropy otherwise; ``draft``:
    decode JPEGs at a reduced DCT scale where the box allows (``False``: always at full size,
    which makes the result equal decoding in full, cropping and resizing).
    """

    flip: float = 0.0

    def __init__(self, size: int | Sequence[int], *, threads: int | None = None,
                 pin_memory: bool | None = None, seed: int | None = None,
                 draft: bool = True) -> None:
        self.size = _pair(size)
        self.draft = draft
        self.threads = threads
        self.pin_memory = pin_memory
        self.seed = seed

    def boxes(self, heights: np.ndarray, widths: np.ndarray,
              rng: np.random.Generator) -> np.ndarray:
        """Per image, the region to resample as float (left, top, right, bottom) in pixels."""
        raise NotImplementedError

    def plan(self, heights: np.ndarray, widths: np.ndarray, indices: np.ndarray | None = None,
             epoch: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Each image's box (float left, top, right, bottom) and whether it is mirrored."""
        if self.seed is None:
            rng = np.random.default_rng()
        else:
            batch = 0 if indices is None else zlib.crc32(
                np.ascontiguousarray(indices, dtype=np.int64).tobytes())
            rng = np.random.default_rng([self.seed, epoch, batch])
        boxes = self.boxes(np.asarray(heights), np.asarray(widths), rng)
        flips = rng.random(len(boxes)) < self.flip if self.flip else np.zeros(len(boxes), bool)
        return boxes, flips

    def __call__(self, images: Sequence[np.ndarray] | np.ndarray, *, encoded: bool,
                 sizes: np.ndarray | None = None, mode: str = "RGB",
                 indices: np.ndarray | None = None, epoch: int = 0) -> torch.Tensor:
        """Decode ``images`` into one uint8 batch N×C×H×W (channels-last memory).

        ``encoded``: the items are file bytes (uint8 1-D arrays); otherwise pixels, H×W×C
        arrays, or rows (H·W)×C with ``sizes`` giving each record's (H, W)."""
        n, (oh, ow) = len(images), self.size
        channels = len(mode) if mode in ("L", "RGB", "RGBA", "CMYK") else Image.getmodebands(mode)
        pin = torch.cuda.is_available() if self.pin_memory is None else self.pin_memory
        out = torch.empty((n, oh, ow, channels), dtype=torch.uint8, pin_memory=pin)
        if n == 0:
            return out.permute(0, 3, 1, 2)
        threads = max(1, min(self.threads or default_threads(), n))
        chunks = np.array_split(np.arange(n), threads)
        run = _pool(threads).map if threads > 1 else map
        if encoded:
            opened = [im for part in run(lambda c: [_open(images[j]) for j in c], chunks)
                      for im in part]
            hw = np.array([(im.size[1], im.size[0]) for im in opened], np.int64).reshape(n, 2)
        else:
            opened = images
            hw = (np.asarray(sizes, np.int64).reshape(n, 2) if sizes is not None
                  else np.array([im.shape[:2] for im in images], np.int64).reshape(n, 2))
        boxes, flips = self.plan(hw[:, 0], hw[:, 1], indices, epoch)
        target = out.numpy()
        work = _resample_encoded if encoded else _resample_pixels
        draft = self.draft

        def decode_chunk(chunk: np.ndarray) -> None:
            for j in chunk:
                work(opened[j], hw[j], boxes[j], flips[j], target[j], mode, draft)

        list(run(decode_chunk, chunks))
        return out.permute(0, 3, 1, 2)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size})"


class RandomResizedCrop(ImageDecode):
    """torchvision's ``RandomResizedCrop(size, scale, ratio)`` + ``RandomHorizontalFlip(flip)``,
    fused with decoding: ten tries at a box of ``scale`` × the area and aspect (w/h) drawn
    log-uniformly from ``ratio`` that fits the image, then the centre crop (the whole image,
    or its largest centred box within the ratio bounds)."""

    def __init__(self, size: int | Sequence[int], scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), flip: float = 0.5,
                 **options: Any) -> None:
        super().__init__(size, **options)
        if not (0 < scale[0] <= scale[1]) or not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"scale {scale} and ratio {ratio}: expected 0 < low <= high")
        self.scale, self.ratio, self.flip = tuple(scale), tuple(ratio), float(flip)

    def boxes(self, heights: np.ndarray, widths: np.ndarray,
              rng: np.random.Generator) -> np.ndarray:
        return random_resized_boxes(heights, widths, self.scale, self.ratio, rng)

    def __repr__(self) -> str:
        return (f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio="
                f"({self.ratio[0]:.4g}, {self.ratio[1]:.4g}), flip={self.flip})")


class CenterCrop(ImageDecode):
    """torchvision's ``Resize(resize)`` (shorter side to ``resize``, aspect kept) followed by
    ``CenterCrop(size)``, resampled once from the original pixels. ``resize`` defaults to the
    crop's larger side (the largest centred box)."""

    def __init__(self, size: int | Sequence[int], resize: int | None = None,
                 **options: Any) -> None:
        super().__init__(size, **options)
        self.resize = max(self.size) if resize is None else int(resize)
        if self.resize < max(self.size):
            raise ValueError(f"resize {self.resize} is smaller than the crop {self.size}")

    def boxes(self, heights: np.ndarray, widths: np.ndarray,
              rng: np.random.Generator) -> np.ndarray:
        h, w = heights.astype(np.float64), widths.astype(np.float64)
        short, long = np.minimum(h, w), np.maximum(h, w)
        new_long = np.floor(self.resize * long / short)  # torchvision truncates the long side
        new_h = np.where(h <= w, self.resize, new_long)
        new_w = np.where(h <= w, new_long, self.resize)
        ch, cw = self.size
        top = np.round((new_h - ch) / 2.0)  # torchvision: int(round((h - crop) / 2))
        left = np.round((new_w - cw) / 2.0)
        sy, sx = h / new_h, w / new_w
        return np.stack([left * sx, top * sy, (left + cw) * sx, (top + ch) * sy], axis=1)

    def __repr__(self) -> str:
        return f"CenterCrop(size={self.size}, resize={self.resize})"


class Resize(ImageDecode):
    """The whole image resized to ``size`` (H, W), aspect not kept. For torchvision's
    aspect-keeping ``Resize(256)`` + ``CenterCrop(224)`` use ``CenterCrop(224, resize=256)``."""

    def boxes(self, heights: np.ndarray, widths: np.ndarray,
              rng: np.random.Generator) -> np.ndarray:
        zeros = np.zeros(len(heights))
        return np.stack([zeros, zeros, widths.astype(np.float64), heights.astype(np.float64)], 1)


def random_resized_boxes(heights: np.ndarray, widths: np.ndarray, scale: tuple[float, float],
                         ratio: tuple[float, float], rng: np.random.Generator,
                         tries: int = 10) -> np.ndarray:
    """torchvision's ``RandomResizedCrop.get_params`` for a whole batch at once: boxes as float
    (left, top, right, bottom) with integer corners."""
    h = np.asarray(heights, np.int64)
    w = np.asarray(widths, np.int64)
    n = len(h)
    area = (h * w).astype(np.float64)[:, None]
    target = area * rng.uniform(scale[0], scale[1], (n, tries))
    aspect = np.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1]), (n, tries)))
    cw = np.round(np.sqrt(target * aspect)).astype(np.int64)  # round half to even, as round()
    ch = np.round(np.sqrt(target / aspect)).astype(np.int64)
    fits = (cw > 0) & (cw <= w[:, None]) & (ch > 0) & (ch <= h[:, None])
    found = fits.any(axis=1)
    first = fits.argmax(axis=1)
    bw, bh = cw[np.arange(n), first], ch[np.arange(n), first]
    top = (rng.random(n) * (h - bh + 1)).astype(np.int64)  # uniform over 0 … h - bh
    left = (rng.random(n) * (w - bw + 1)).astype(np.int64)
    # fallback: the whole image, or its centred box at the nearest allowed aspect
    in_ratio = w / h
    fw = np.where(in_ratio > ratio[1], np.round(h * ratio[1]), w).astype(np.int64)
    fh = np.where(in_ratio < ratio[0], np.round(w / ratio[0]), h).astype(np.int64)
    bw, bh = np.where(found, bw, fw), np.where(found, bh, fh)
    top = np.where(found, top, (h - bh) // 2)
    left = np.where(found, left, (w - bw) // 2)
    return np.stack([left, top, left + bw, top + bh], axis=1).astype(np.float64)


def _open(data: np.ndarray) -> Image.Image:
    try:
        return Image.open(io.BytesIO(memoryview(np.ascontiguousarray(data))))
    except Exception as exc:  # noqa: BLE001 - a stored file Pillow cannot read
        raise DatasetError(f"a stored image cannot be opened ({type(exc).__name__}: {exc})") from None


def _store(resized: Image.Image, flip: bool, target: np.ndarray) -> None:
    pixels = np.asarray(resized)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    target[...] = pixels[:, ::-1] if flip else pixels


def _resample_encoded(im: Image.Image, hw: np.ndarray, box: np.ndarray, flip: bool,
                      target: np.ndarray, mode: str, draft: bool = True) -> None:
    """Decode ``im`` at the smallest JPEG scale that keeps ``box`` at least the output's size,
    then resample the box into ``target``."""
    oh, ow = target.shape[:2]
    left, top, right, bottom = box
    if draft and im.format == "JPEG":
        want = (math.ceil(hw[1] * ow / max(right - left, 1)),
                math.ceil(hw[0] * oh / max(bottom - top, 1)))
        drafted = im.draft(mode if mode in ("RGB", "L") else None, want)
        if drafted is not None:
            scale = hw[1] / drafted[1][2]  # draft reports the original size at the new scale
            box = box / scale
    try:
        im.load()
        if im.mode != mode:
            im = im.convert(mode)
        resized = im.resize((ow, oh), BILINEAR, box=tuple(box))
    except Exception as exc:  # noqa: BLE001 - a truncated or corrupt stored file
        raise DatasetError(f"a stored image cannot be decoded ({type(exc).__name__}: {exc})") from None
    _store(resized, flip, target)


def _resample_pixels(pixels: np.ndarray, hw: np.ndarray, box: np.ndarray, flip: bool,
                     target: np.ndarray, mode: str, draft: bool = True) -> None:
    """Resample ``box`` of raw pixels into ``target``. The whole image goes to Pillow, not a cut
    around the box: box coordinates relative to a cut change Pillow's float filter weights in the
    last bit (±1 grey levels), and the copy costs little next to the resampling (measured)."""
    oh, ow = target.shape[:2]
    image = pixels.reshape(int(hw[0]), int(hw[1]), -1)
    im = Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image)
    if im.mode != mode:
        im = im.convert(mode)
    _store(im.resize((ow, oh), BILINEAR, box=tuple(box)), flip, target)
