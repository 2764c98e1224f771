"""Image sources: a flat folder plus a labels file, class sub-folders (ImageFolder), or no labels.

Records: ``image`` — decoded uint8 H×W×C pixels (``encoding="raw"``) or the original file bytes
(``encoding="keep"``) — and ``label`` (int64) when labels are known.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from packdata.errors import PackdataError, SampleError
from packdata.manifest import Field, Manifest
from packdata.sources import labels as labelling
from packdata.sources.base import Item, Source
from packdata.sources.options import Option, resolve

KIND = "image"
SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
ENCODINGS = ("raw", "keep")
OPTIONS = (
    labelling.LABELS,
    Option("encoding", str, "raw", "'raw' stores decoded uint8 pixels (no decode when loading); "
           "'keep' stores the original file bytes (smaller, for large JPEGs).", ENCODINGS),
    Option("resize", str, None, "Resize to N×N or WxH pixels at conversion (needs --encoding raw)."),
    Option("mode", str, "RGB", "Pillow mode the pixels are converted to (RGB, L, RGBA...)."),
)


def parse_size(text: str | int | tuple[int, int] | None) -> tuple[int, int] | None:
    """``"32"`` → (32, 32); ``"64x48"`` → width 64, height 48."""
    if text is None or isinstance(text, tuple):
        return text
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
    shape_hint = "resize at conversion (--resize 32x32) or keep the file bytes (--encoding keep)"

    def __init__(self, root: str | Path, **options: Any) -> None:
        """``options``: see :data:`OPTIONS` (labels, encoding, resize, mode)."""
        o = resolve(KIND, OPTIONS, options)
        self.root = Path(root)
        self.resize = parse_size(o["resize"])
        if o["encoding"] == "keep" and self.resize:
            raise PackdataError("--resize needs --encoding raw: 'keep' stores the file unchanged")
        self.encoding, self.mode = o["encoding"], o["mode"]
        self.labels_path = Path(o["labels"]) if o["labels"] else labelling.find_labels_file(self.root)
        if self.labels_path and not self.labels_path.is_file():
            raise PackdataError(f"{self.labels_path}: labels file not found")

    def _files(self) -> list[str]:
        return self.list_inputs(SUFFIXES, used=self.labels_path)

    @property
    def layout(self) -> str:
        return labelling.layout(self._files(), self.labels_path)

    def items(self) -> list[Item]:
        root = self.root if self.root.is_dir() else self.root.parent
        files = self._files()
        keys = [os.path.splitext(f)[0] for f in files]
        unused: list[str] = []
        labels, self.classes = labelling.assign(files, self.labels_path, unused)
        self.ignore(f"entries of {self.labels_path} naming no input file", unused)
        return [Item(k, root / f, label) for k, f, label in zip(keys, files, labels)]

    def load(self, item: Item) -> dict[str, np.ndarray]:
        if item.label == labelling.MISSING:
            raise SampleError(str(item.path), f"no label for '{item.path.name}' in {self.labels_path}")
        try:
            data = item.path.read_bytes()  # one read; Pillow's small reads on a file cost more
            with Image.open(io.BytesIO(data)) as im:
                im.load()  # decode fully, so a truncated file fails here and not at training time
                if self.encoding == "keep":
                    image = np.frombuffer(data, dtype=np.uint8)
                else:
                    im = im.convert(self.mode) if im.mode != self.mode else im
                    if self.resize and im.size != self.resize:
                        im = im.resize(self.resize, Image.Resampling.BILINEAR)
                    image = np.asarray(im)
        except UnidentifiedImageError:  # Pillow's message names an object address: not stable
            raise SampleError(str(item.path), "not an image format Pillow recognises") from None
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise SampleError(str(item.path), f"cannot decode image ({exc})") from None
        record = {"image": image}
        if item.label is not None:
            record["label"] = np.asarray(item.label, dtype=np.int64)
        return record

    def fields(self, record: dict[str, np.ndarray]) -> dict[str, Field]:
        image = record["image"]
        fields = {
            "image": Field("uint8", (None,), codec="image")
            if self.encoding == "keep"
            else Field("uint8", tuple(image.shape))
        }
        if "label" in record:
            fields["label"] = Field("int64", ())
        return fields

    def describe(self) -> dict[str, Any]:
        return {
            "source": {"path": str(self.root), "layout": self.layout,
                       "labels": str(self.labels_path) if self.labels_path else None},
            "options": {"encoding": self.encoding, "mode": self.mode,
                        "resize": list(self.resize) if self.resize else None},
        }


def decode_image(data: np.ndarray, mode: str = "RGB") -> np.ndarray:
    """Decode stored image bytes into uint8 H×W×C pixels."""
    with Image.open(io.BytesIO(data.tobytes())) as im:
        return np.asarray(im.convert(mode) if im.mode != mode else im)


def to_torch(
    batch: dict, manifest: Manifest, *, indices: np.ndarray, epoch: int
) -> tuple[torch.Tensor, ...]:
    """``(images, labels)`` as uint8 B×C×H×W (channels-last memory, no copy) and int64 B."""
    images = batch["image"]
    if manifest.fields["image"].codec == "image":
        mode = manifest.options.get("mode", "RGB")
        decoded = [decode_image(b, mode) for b in images]
        images = (np.stack(decoded) if decoded
                  else np.zeros((0, 0, 0, Image.getmodebands(mode)), np.uint8))
    x = torch.from_numpy(images)
    x = x.unsqueeze(-1) if x.ndim == 3 else x
    x = x.permute(0, 3, 1, 2)
    if "label" in batch:
        return x, torch.from_numpy(np.asarray(batch["label"]))
    return (x,)


SOURCE = ImageSource
