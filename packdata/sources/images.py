"""Image sources: a flat folder plus a labels file, class sub-folders (ImageFolder), or no labels.

Records: ``image`` and ``label`` (int64) when labels are known. ``image`` is one of

- decoded uint8 pixels, every image the same size (``encoding="raw"`` when the images' headers
  all give one size, or with ``resize``), stored C×H×W (``pixel_order="chw"``, the default: a
  batch read is already the contiguous N×C×H×W batch torch models take) or H×W×C
  (``pixel_order="hwc"``, what datasets written before the option hold: their batches cost a
  transposing copy unless read with ``channels_last=True``);
- decoded pixels of any size (``encoding="raw"`` when the headers give several sizes, unscaled;
  or with ``max_size``: the shorter side scaled down to at most ``max_size``, aspect kept): rows
  of (H·W)×C pixels in one variable-length field, plus ``image_size`` (int32 H, W);
- the original file bytes (``encoding="keep"``).

Batches of images of different sizes need a decode stage (:mod:`packdata.imagedecode`), passed
as ``packdata.open(path, decode=...)``; it crops and resizes them to one size while decoding
(:mod:`packdata.loading.samples` makes the tensors a dataset serves).
"""

from __future__ import annotations

import io
import os
import stat
import struct
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from packdata.errors import OptionError, PackdataError, SampleError
from packdata.manifest import Field, Manifest
from packdata.options import Option, resolve
from packdata.remote.files import RemotePath
from packdata.sources import labels as labelling
from packdata.sources import pixels
from packdata.sources.base import BLOCK, FileTable, Item, Source, Survey, paths_of

KIND = "image"
select = None  # every record serves all of itself
SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
ENCODINGS = ("raw", "keep")
REMOTE_READS = 16  # image headers read at once from a URL source while listing
#: a manifest without it was written before it existed, with H×W×C pixels
PIXEL_ORDER = Option(
    "pixel_order", str, "chw", "How fixed-size raw pixels are stored: 'chw' (a batch read is "
    "already contiguous N×C×H×W) or 'hwc' (channels-last batches need no copy: for "
    "packdata.open(DST, channels_last=True)). Images of any size are stored as H×W×C rows.",
    ("chw", "hwc"), legacy="hwc")
OPTIONS = (
    labelling.LABELS,
    Option("encoding", str, "raw", "'raw' stores decoded uint8 pixels (no decode when loading); "
           "'keep' stores the original file bytes (smaller, for large JPEGs).", ENCODINGS),
    Option("resize", str, None, "Resize to N×N or WxH pixels at conversion (needs --encoding raw)."),
    Option("mode", str, "RGB", "Pillow mode the pixels are converted to (RGB, L, RGBA...)."),
    PIXEL_ORDER,
    Option("max_size", int, None, "Store images of any size, scaling down those whose shorter "
           "side exceeds N to a shorter side of N (aspect kept; needs --encoding raw). Crop them "
           "at load through a decode stage, e.g. packdata.RandomResizedCrop(224)."),
    Option("keep_16bit", bool, False, "Store 16-bit values as uint16 (8-bit images times 257) "
           "instead of clipping them to 255 as torchvision's ImageFolder does (--mode L or RGB; "
           "needs --encoding raw)."),
    Option("exif_orientation", bool, False, "Rotate and mirror each image as its EXIF "
           "orientation says, as a photo viewer shows it (torchvision's ImageFolder does not; "
           "needs --encoding raw)."),
)


def parse_size(text: str | int | tuple[int, int] | list[int] | None) -> tuple[int, int] | None:
    """``"32"`` → (32, 32); ``"64x48"`` or ``[64, 48]`` (as a manifest records it) → width 64,
    height 48."""
    if text is None:
        return None
    if isinstance(text, (tuple, list)):
        text = "x".join(str(v) for v in text)
    parts = str(text).lower().split("x")
    try:
        w, h = (int(parts[0]),) * 2 if len(parts) == 1 else (int(parts[0]), int(parts[1]))
    except ValueError:
        w = h = 0
    if len(parts) > 2 or w <= 0 or h <= 0:
        raise PackdataError(f"resize '{text}': expected N or WxH with positive integers")
    return w, h


class ImageSource(Source):
    """Images under ``root``: class sub-folders, or a flat folder with an optional labels file."""

    kind = KIND
    shape_hint = ("store images of any size with --max-size N (aspect kept, shorter side <= N) "
                  "or --encoding keep, and crop them at load (packdata.open(path, "
                  "decode=packdata.RandomResizedCrop(224))); --resize WxH squashes all to one size")

    def __init__(self, root: str | Path, **options: Any) -> None:
        """``options``: see :data:`OPTIONS` (labels, encoding, resize, mode, max_size)."""
        o = resolve(KIND, OPTIONS, options)
        self.root = root if isinstance(root, Path) else Path(root)  # a RemotePath stays one
        self.resize = parse_size(o["resize"])
        if o["encoding"] == "keep" and self.resize:
            raise PackdataError("--resize needs --encoding raw: 'keep' stores the file unchanged")
        max_size = o["max_size"]
        if max_size is not None and (max_size <= 0 or o["encoding"] != "raw" or self.resize):
            raise PackdataError("--max-size needs a positive size, --encoding raw and no --resize "
                                "(it keeps each image's aspect; 'keep' stores the file unchanged)")
        self.max_size = max_size
        if o["mode"] not in Image.MODES:  # else each image's decode fails, blamed on the file
            raise OptionError(f"--mode '{o['mode']}': expected a Pillow mode "
                              f"({', '.join(Image.MODES)})")
        self.encoding, self.mode = o["encoding"], o["mode"]
        pixels.check(self.mode, self.encoding, o["keep_16bit"], o["exif_orientation"])
        self.keep_16bit, self.exif_orientation = o["keep_16bit"], o["exif_orientation"]
        self.pixel_order = o["pixel_order"]
        self.labels_path = Path(o["labels"]) if o["labels"] else labelling.find_labels_file(self.root)
        if self.labels_path and not self.labels_path.is_file():
            raise PackdataError(f"{self.labels_path}: labels file not found")
        #: raw pixels of differing sizes: stored as variable-size rows, unscaled (decided by
        #: :meth:`surveyed` from the images' headers, before anything is converted)
        self.mixed_sizes = False

    def _files(self) -> list[str]:
        return self.list_inputs(SUFFIXES, used=self.labels_path)

    @property
    def layout(self) -> str:
        return labelling.layout(self._files(), self.labels_path)

    def items(self) -> FileTable:
        root = self.root if self.root.is_dir() else self.root.parent
        files = self._files()
        unused: list[str] = []
        labels, self.classes = labelling.assign(files, self.labels_path, unused)
        self.ignore(f"entries of {self.labels_path} naming no input file", unused)
        if files and labelling.layout(files, self.labels_path) == "unlabelled":
            labelling.warn_unlabelled(self.root, "an image", files)
        return FileTable.of(root, files, labels)

    def load(self, item: Item) -> dict[str, np.ndarray]:
        if item.label == labelling.MISSING:
            raise SampleError(str(item.path), f"no label for '{item.path.name}' in {self.labels_path}")
        try:
            data = item.path.read_bytes()  # one read; Pillow's small reads on a file cost more
            if not data:
                raise SampleError(str(item.path), "empty file (0 bytes)")
            with pixels.named_warnings(item.path, lambda text: self.note(text, str(item.path))), \
                    Image.open(io.BytesIO(data)) as im:
                if self.encoding == "keep":
                    # kept as they are, only checked: a JPEG's whole bitstream is still decoded
                    # (a truncated or damaged one fails as in a full decode), at the smallest
                    # DCT scale, which halves the decode's CPU
                    im.draft(im.mode, (1, 1))
                im.load()  # decode fully, so a truncated file fails here and not at training time
                for why in pixels.changes(im, self.mode, self.keep_16bit, self.exif_orientation):
                    self.note(why, str(item.path))
                if self.encoding == "keep":
                    image = np.frombuffer(data, dtype=np.uint8)
                else:
                    im = pixels.prepared(im, self.mode, self.keep_16bit, self.exif_orientation)
                    if self.resize and im.size != self.resize:
                        im = im.resize(self.resize, Image.Resampling.BILINEAR)
                    elif self.max_size and min(im.size) > self.max_size:
                        im = im.resize(limited_size(im.size, self.max_size),
                                       Image.Resampling.BILINEAR)
                    image = pixels.array(im, self.mode, self.keep_16bit)
        except SampleError:
            raise
        except UnidentifiedImageError:  # Pillow's message names an object address: not stable
            raise SampleError(str(item.path), "not an image format Pillow recognises") from None
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise SampleError(str(item.path), f"cannot decode image ({exc})") from None
        record = {"image": image}
        if self.variable:  # any size: pixel rows plus the image's height and width
            record = {"image": image.reshape(image.shape[0] * image.shape[1], -1),
                      "image_size": np.array(image.shape[:2], dtype=np.int32)}
        elif self.encoding == "raw" and self.pixel_order == "chw" and image.ndim == 3:
            record = {"image": np.ascontiguousarray(image.transpose(2, 0, 1))}
        if item.label is not None:
            record["label"] = np.asarray(item.label, dtype=np.int64)
        return record

    def fields(self, record: dict[str, np.ndarray]) -> dict[str, Field]:
        image = record["image"]
        if self.encoding == "keep":
            fields = {"image": Field("uint8", (None,), codec="image")}
        elif self.variable:
            fields = {"image": Field(image.dtype.name, (None, image.shape[1])),
                      "image_size": Field("int32", (2,))}
        else:
            fields = {"image": Field(image.dtype.name, tuple(image.shape))}
        if "label" in record:
            fields["label"] = Field("int64", ())
        return fields

    @property
    def surveying(self) -> bool:
        """Every image's header is read before any is converted (:meth:`survey`), unless all
        are resized to one size: its size decides how raw pixels are stored (one size: fixed
        C×H×W; several: rows) and the rows a writer lays out."""
        return not self.resize

    def survey(self, items: Sequence[Item]) -> Survey:
        """Each image's pixel rows from its header (H×W, as ``max_size`` scales them), or, kept,
        its file's bytes; and the block's sizes (two at most, turned as their EXIF orientation
        says where ``exif_orientation`` asks: whether they differ is what :meth:`surveyed`
        asks). Rows are None where a header cannot be read (that input's load
        names it) or a kept file is not local."""
        if self.encoding == "keep":
            paths = paths_of(items)
            if paths and isinstance(paths[0], RemotePath):
                return Survey(None)
            try:
                sizes = np.array([os.stat(path).st_size for path in paths], dtype=np.int64)
            except OSError:
                return Survey(None)
            return Survey({"image": sizes})
        seen: list[tuple[int, int]] = []
        rows = np.empty(len(items), dtype=np.int64)
        known = True
        oriented = _oriented_size_or_none if self.exif_orientation else None
        for i, size in enumerate(_header_sizes(items, oriented)):
            if size is None:
                known = False
                continue
            if len(seen) < 2 and size not in seen:
                seen.append(size)
            if self.max_size and min(size) > self.max_size:
                size = limited_size(size, self.max_size)
            rows[i] = size[0] * size[1]
        return Survey({"image": rows} if known else None, seen)

    def surveyed(self, surveys: Sequence[Survey]) -> None:
        """Raw pixels of several sizes (neither resized nor limited): stored as rows."""
        if self.encoding == "raw" and not self.max_size:
            sizes = {size for survey in surveys for size in survey.facts}
            self.mixed_sizes = len(sizes) > 1

    @property
    def variable(self) -> bool:
        """Raw pixels stored as rows of any size (``max_size``, or images of mixed sizes)."""
        return self.encoding == "raw" and (self.max_size is not None or self.mixed_sizes)

    def options(self) -> dict[str, Any]:
        return {"labels": labelling.recorded(self.labels_path, self.root),
                "encoding": self.encoding, "mode": self.mode, "pixel_order": self.pixel_order,
                "resize": list(self.resize) if self.resize else None, "max_size": self.max_size,
                "keep_16bit": self.keep_16bit, "exif_orientation": self.exif_orientation}

    def describe(self) -> dict[str, Any]:
        return {
            "source": {"path": str(self.root), "layout": self.layout,
                       "labels": str(self.labels_path) if self.labels_path else None,
                       "mixed_sizes": self.mixed_sizes},
            "options": self.options(),
        }


def _header_sizes(items: Sequence[Item],
                  size_of: Callable[[Path | str], tuple[int, int] | None] | None = None,
                  ) -> Iterator[tuple[int, int] | None]:
    """Each item's (W, H) (``size_of`` a path: by default :func:`_size_or_none`), or None where
    its header cannot be read. Files at a URL are read ``REMOTE_READS`` at a time (each is a
    round trip); local files one by one (microseconds)."""
    size_of = size_of or _size_or_none
    paths = paths_of(items)
    if not paths or not isinstance(paths[0], RemotePath):  # one listing: one root
        yield from map(size_of, paths)
        return
    with ThreadPoolExecutor(REMOTE_READS, thread_name_prefix="packdata-headers") as pool:
        for start in range(0, len(paths), BLOCK):
            yield from pool.map(size_of, paths[start : start + BLOCK])


def _oriented_size_or_none(path: Path | str) -> tuple[int, int] | None:
    """(W, H) as the image's EXIF orientation turns it (Pillow's lazy open reads the tag with
    the header), or None where the header cannot be read or it is no regular file."""
    try:
        if not isinstance(path, RemotePath) and not os.path.isfile(path):
            return None  # e.g. a named pipe, which an open would wait on: load() reports it
        opened = path.open("rb") if isinstance(path, RemotePath) else open(path, "rb")  # noqa: SIM115
        with opened as f, Image.open(f) as im:
            w, h = im.size
            return (h, w) if pixels.orientation(im) in (5, 6, 7, 8) else (w, h)
    except Exception:  # load() reports this file with its reason
        return None


def _size_or_none(path: Path | str) -> tuple[int, int] | None:
    try:
        if isinstance(path, RemotePath):
            return header_size(path)
        return _local_header_size(os.fspath(path))
    except Exception:  # load() reports this file with its reason
        return None


def _local_header_size(path: str) -> tuple[int, int] | None:
    """:func:`header_size` of a local file with plain system calls (a PNG costs a third of the
    time through pathlib and a file object: measured); None for anything but a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a named pipe must not block the scan
    try:
        head = os.read(fd, 24)  # a named pipe gives b"" or raises: load() reports it
        if head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR":  # no fstat: a third less
            return struct.unpack(">II", head[16:24])
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # e.g. a device: load() reports it
    finally:
        os.close(fd)
    return header_size(Path(path))


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def header_size(path: Path) -> tuple[int, int]:
    """An image's (W, H) from its header: a PNG's IHDR chunk read directly (a quarter of what
    Pillow's lazy open costs), any other format through Pillow's lazy open."""
    with path.open("rb") as f:
        head = f.read(24)
        if head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR":
            w, h = struct.unpack(">II", head[16:24])
            return w, h
        f.seek(0)
        with Image.open(f) as im:
            return im.size


def limited_size(size: tuple[int, int], max_size: int) -> tuple[int, int]:
    """(W, H) scaled so that the shorter side is ``max_size``, aspect kept (rounded, >= 1)."""
    w, h = size
    scale = max_size / min(w, h)
    return max(1, round(w * scale)), max(1, round(h * scale))


def decode_image(data: np.ndarray, mode: str = "RGB") -> np.ndarray:
    """Decode stored image bytes into uint8 H×W×C pixels."""
    with Image.open(io.BytesIO(data.tobytes())) as im:
        return np.asarray(pixels.prepared(im, mode))


def stored_chw(manifest: Manifest) -> bool:
    """Whether the dataset's images are fixed-size raw pixels stored C×H×W (``pixel_order="chw"``);
    a manifest without the option was written before it existed, with H×W×C pixels."""
    image = manifest.fields["image"]
    order = manifest.options.get(PIXEL_ORDER.name, PIXEL_ORDER.legacy)
    return order == "chw" and image.codec is None and not image.variable and len(image.shape) == 3


SOURCE = ImageSource
