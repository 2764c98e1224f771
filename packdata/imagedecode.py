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
(Pillow and torch release the GIL) at the smallest JPEG DCT scale (1/2, 1/4, 1/8, libjpeg-turbo
via ``Image.draft``) that keeps the box at least as large as the output (decoding only the box's
rows and columns where packdata's JPEG extension was built: :mod:`packdata.jpegregion`), and only
the box is resized — torch's antialiased bilinear uint8 kernel, torchvision's tensor semantics (crop, then
resize) — straight into one preallocated batch tensor (pinned when CUDA is present). Boxes are
whole pixels of the original image, or of the reduced one when JPEG decoding was scaled. pillow-simd, when
installed in place of Pillow, is used as is.
"""

from __future__ import annotations

import io
import math
import os
import threading
import weakref
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from PIL import Image

from packdata.errors import ArgumentError, DatasetError
from packdata.jpegregion import decode_crop, scaled_box, scaled_size
from packdata.units import available_cores, count_argument, reads_for_another_process, size_pair

try:  # libjpeg-turbo without Pillow's per-image overhead (same pixels, ~25 % less CPU: measured)
    import simplejpeg
except ImportError:  # pragma: no cover - optional (extra "jpeg")
    simplejpeg = None

_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    """This process's decode pool (pools do not survive a fork: one per process id)."""
    key = (os.getpid(), threads)
    with _pools_lock:
        if key not in _pools:
            _pools[key] = ThreadPoolExecutor(threads, thread_name_prefix="packdata-decode")
        return _pools[key]


class ImageDecode:
    """A batched decode stage (subclasses say where the box of each image lies).

    ``threads``: decode threads (default: the cores this process may use); ``pin_memory``: put
    the batch in pinned memory (default: when CUDA is available, outside processes that read
    for another, DataLoader workers and feeders);
    ``seed``: random boxes depend
    only on (seed, epoch, the batch's indices) when given, fresh entropy otherwise; ``draft``:
    decode JPEGs at a reduced DCT scale where the box allows (``False``: always at full size,
    which makes the result equal decoding in full, cropping and resizing).
    """

    flip: float = 0.0

    def __init__(self, size: int | Sequence[int], *, threads: int | None = None,
                 pin_memory: bool | None = None, seed: int | None = None,
                 draft: bool = True) -> None:
        self.size = size_pair(size, "size")
        self.draft = draft
        self.threads = None if threads is None else count_argument("threads", threads, 1)
        self.pin_memory = pin_memory
        self.seed = None if seed is None else count_argument("seed", seed)

    def boxes(self, heights: np.ndarray, widths: np.ndarray,
              rng: np.random.Generator) -> np.ndarray:
        """Per image, the region to resample as float (left, top, right, bottom) in pixels."""
        raise NotImplementedError

    def crop_boxes(self, heights: np.ndarray, widths: np.ndarray, indices: np.ndarray | None = None,
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
                 indices: np.ndarray | None = None, epoch: int = 0,
                 channels_last: bool = True) -> torch.Tensor:
        """Decode ``images`` into one uint8 batch N×C×H×W, in channels-last memory, or
        contiguous with ``channels_last=False`` (each image laid out by its decode thread).

        ``encoded``: the items are file bytes (uint8 1-D arrays); otherwise pixels, H×W×C
        arrays, or rows (H·W)×C with ``sizes`` giving each record's (H, W)."""
        n, (oh, ow) = len(images), self.size
        # Hold these records until this thread's next batch is read: glibc gives a freed batch
        # of records (61 MB at 256 px) back to the kernel at once, and the next read pays page
        # faults and zeroing for all of it
        _scratch.held = images
        channels = len(mode) if mode in ("L", "RGB", "RGBA", "CMYK") else Image.getmodebands(mode)
        pin = self.pin_memory
        if pin is None:  # not in a process reading for another: CUDA must not start there
            pin = not reads_for_another_process() and torch.cuda.is_available()
        shape = (n, oh, ow, channels) if channels_last else (n, channels, oh, ow)
        out = _batch_buffer(shape, pin)
        target = out.permute(0, 3, 1, 2) if channels_last else out
        if n == 0:
            return target
        threads = max(1, min(self.threads or available_cores(), n))
        chunks = np.array_split(np.arange(n), threads)
        run = _pool(threads).map if threads > 1 else map
        if encoded:
            opened = [im for part in run(lambda c: [_open(images[j], mode) for j in c], chunks)
                      for im in part]
            hw = np.array([im[1] for im in opened], np.int64).reshape(n, 2)
        else:
            opened = images
            hw = (np.asarray(sizes, np.int64).reshape(n, 2) if sizes is not None
                  else np.array([im.shape[:2] for im in images], np.int64).reshape(n, 2))
        boxes, flips = self.crop_boxes(hw[:, 0], hw[:, 1], indices, epoch)
        work = _resample_encoded if encoded else _resample_pixels
        draft = self.draft

        def decode_chunk(chunk: np.ndarray) -> None:
            for j in chunk:
                work(opened[j], hw[j], boxes[j], flips[j], target[j : j + 1], mode, draft)

        list(run(decode_chunk, chunks))
        return target

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
            raise ArgumentError(f"scale {scale} and ratio {ratio}: expected 0 < low <= high")
        self.scale, self.ratio, self.flip = tuple(scale), tuple(ratio), float(flip)

    def boxes(self, heights: np.ndarray, widths: np.ndarray,
              rng: np.random.Generator) -> np.ndarray:
        return random_resized_boxes(heights, widths, self.scale, self.ratio, rng)

    def __repr__(self) -> str:
        return (f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio="
                f"({self.ratio[0]:.4g}, {self.ratio[1]:.4g}), flip={self.flip})")


class CenterCrop(ImageDecode):
    """torchvision's ``Resize(resize)`` (shorter side to ``resize``, aspect kept) followed by
    ``CenterCrop(size)``, resampled once from the original pixels: the same region (to the
    nearest whole pixel of the original). ``resize`` defaults to the crop's larger side (the
    largest centred box)."""

    def __init__(self, size: int | Sequence[int], resize: int | None = None,
                 **options: Any) -> None:
        super().__init__(size, **options)
        self.resize = max(self.size) if resize is None else int(resize)
        if self.resize < max(self.size):
            raise ArgumentError(f"resize {self.resize} is smaller than the crop {self.size}")

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
        sy, sx = h / new_h, w / new_w  # the region in the original, to whole pixels
        return np.round(np.stack([left * sx, top * sy, (left + cw) * sx, (top + ch) * sy], 1))

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


def _open(data: np.ndarray, mode: str) -> tuple[Any, tuple[int, int]]:
    """Stored file bytes ready to decode, and the image's (H, W) from its header: the bytes
    themselves for a JPEG that simplejpeg decodes, an opened Pillow image otherwise."""
    data = np.ascontiguousarray(data)
    if simplejpeg is not None and mode in _JPEG_COLOURS and data[:2].tobytes() == b"\xff\xd8":
        try:
            h, w, colour, _ = simplejpeg.decode_jpeg_header(data)
            if colour in ("YCbCr", "Gray", "RGB"):  # not CMYK/YCCK: Pillow converts those
                return data, (h, w)
        except ValueError:
            pass  # Pillow gives the error its words below
    try:
        im = Image.open(io.BytesIO(memoryview(data)))
    except Exception as exc:  # noqa: BLE001 - a stored file Pillow cannot read
        raise DatasetError(f"a stored image cannot be opened ({type(exc).__name__}: {exc})") from None
    return im, (im.height, im.width)


_JPEG_COLOURS = {"RGB": "RGB", "L": "Gray"}


_BUFFERS_KEPT = 2  # free batch buffers kept per shape: enough for a loop that drops each batch
_free_buffers: dict[tuple[int, ...], list[np.ndarray]] = {}
_scratch = threading.local()


def _batch_buffer(shape: tuple[int, ...], pin: bool) -> torch.Tensor:
    """An uninitialised uint8 batch of ``shape``: pinned (torch caches those), or a buffer of an
    earlier batch that nothing (no tensor, view or array) holds any more. malloc maps a batch of
    256 images at 224 (38 MB) afresh each time, to be zeroed page by page as it is faulted
    in."""
    if pin:
        return torch.empty(shape, dtype=torch.uint8, pin_memory=True)
    with _pools_lock:
        free = _free_buffers.get(shape)
        base = free.pop() if free else None
    if base is None:
        base = np.empty(shape, np.uint8)
    view = base[...]  # the batch holds this view; when it goes, the buffer is free again
    weakref.finalize(view, _release, shape, base).atexit = False
    return torch.from_numpy(view)


def _release(shape: tuple[int, ...], base: np.ndarray) -> None:
    with _pools_lock:
        free = _free_buffers.setdefault(shape, [])
        if len(free) < _BUFFERS_KEPT:
            free.append(base)


def _resize_into(crop: torch.Tensor, flip: bool, slot: torch.Tensor) -> None:
    """Antialiased bilinear resize of a 1×C×h×w uint8 crop into ``slot`` (1×C×H×W, a view into
    the batch): torch's uint8 kernel, torchvision's tensor semantics (crop, then resize), 2–4×
    faster than Pillow's resize without pillow-simd (measured). The kernel is fastest writing
    channels-last memory (a planar slot costs it 60 % more, measured): a planar slot is filled
    from a channels-last scratch image of this thread, still in cache."""
    if slot.stride(1) != 1 and slot.shape[1] > 1:
        key = tuple(slot.shape)
        scratch = getattr(_scratch, "images", {}).get(key)
        if scratch is None:
            scratch = torch.empty((1, *key[2:], key[1]), dtype=torch.uint8).permute(0, 3, 1, 2)
            _scratch.images = {**getattr(_scratch, "images", {}), key: scratch}
        _resize_channels_last(crop, flip, scratch)
        # numpy's copy, not torch's: torch may split it over its intra-op threads
        np.copyto(slot.numpy(), scratch.numpy())
        return
    _resize_channels_last(crop, flip, slot)


def _resize_channels_last(crop: torch.Tensor, flip: bool, slot: torch.Tensor) -> None:
    if flip:  # mirroring the crop first gives the mirrored result bit for bit (tested)
        crop = crop.flip(3)
    try:
        _upsample_aa_out(crop, list(slot.shape[2:]), False, None, None, out=slot)
    except (RuntimeError, NotImplementedError):  # a kernel without this dtype or channel count
        resized = torch.nn.functional.interpolate(crop.float(), size=slot.shape[2:],
                                                  mode="bilinear", antialias=True)
        slot.copy_(resized.round_().clamp_(0, 255))


_upsample_aa_out = torch.ops.aten._upsample_bilinear2d_aa.out


def _crop_tensor(pixels: np.ndarray, box: np.ndarray) -> torch.Tensor:
    """Pixels H×W×C inside integer ``box`` as a 1×C×h×w tensor (a view where numpy allows)."""
    left, top, right, bottom = (int(v) for v in box)
    region = pixels[top:bottom, left:right]
    if not region.flags.writeable:  # torch wants writable memory: copy only the box
        region = region.copy()
    return torch.from_numpy(region).permute(2, 0, 1).unsqueeze(0)


def _resample_encoded(opened: tuple[Any, tuple[int, int]], hw: np.ndarray, box: np.ndarray,
                      flip: bool, slot: torch.Tensor, mode: str, draft: bool = True) -> None:
    """Decode at the smallest JPEG scale that keeps ``box`` at least the output's size, then
    resize the box into ``slot``."""
    oh, ow = slot.shape[2:]
    source, _ = opened
    h, w = int(hw[0]), int(hw[1])
    left, top, right, bottom = box
    want = ((math.ceil(h * oh / max(bottom - top, 1)), math.ceil(w * ow / max(right - left, 1)))
            if draft else (h, w))
    if isinstance(source, np.ndarray):  # a JPEG for simplejpeg
        # 1/2, 1/4 or 1/8 as Pillow's draft picks (libjpeg's other n/8 scales measured worse)
        factor = max(1, min(h // max(want[0], 1), w // max(want[1], 1)))
        scale = next(s for s in (8, 4, 2, 1) if s <= factor)
        crop = decode_crop(source, (h, w), scale, box, grey=mode == "L")  # the box alone
        if crop is not None:
            _resize_into(crop, flip, slot)
            return
        try:
            dh, dw = scaled_size(h, w, scale)
            pixels = simplejpeg.decode_jpeg(source, colorspace=_JPEG_COLOURS[mode],
                                            min_height=dh, min_width=dw)
        except ValueError:  # let Pillow decode it, or name what is wrong with it
            source = _open(source, "")[0]
        else:
            pixels = pixels if pixels.ndim == 3 else pixels[:, :, None]
            _resize_into(_crop_tensor(pixels, scaled_box(box, pixels.shape, h, w)), flip, slot)
            return
    im = source
    if draft and im.format == "JPEG":
        im.draft(mode if mode in ("RGB", "L") else None, (want[1], want[0]))
    try:
        im.load()
        if im.mode == "P" and "transparency" in im.info:  # the same colours, no Pillow warning
            im = im.convert("RGBA")
        if im.mode != mode:
            im = im.convert(mode)
        pixels = np.array(im)
    except Exception as exc:  # noqa: BLE001 - a truncated or corrupt stored file
        raise DatasetError(f"a stored image cannot be decoded ({type(exc).__name__}: {exc})") from None
    pixels = pixels if pixels.ndim == 3 else pixels[:, :, None]
    _resize_into(_crop_tensor(pixels, scaled_box(box, pixels.shape, h, w)), flip, slot)


def _resample_pixels(pixels: np.ndarray, hw: np.ndarray, box: np.ndarray, flip: bool,
                     slot: torch.Tensor, mode: str, draft: bool = True) -> None:
    """Resize ``box`` of raw pixels (stored in the dataset's mode) into ``slot``, reading only
    the box."""
    _resize_into(_crop_tensor(pixels.reshape(int(hw[0]), int(hw[1]), -1), box), flip, slot)
