"""The starting points packdata is measured against.

:class:`PerFileImageDataset` is the classic tutorial Dataset: one image file opened and decoded
per sample. :class:`InMemoryBatches` gathers batches from a numpy array in RAM: the ceiling for
any storage.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from packdata.conversion.survey import survey
from packdata.sources.images import SUFFIXES, ImageSource
from packdata.sources.labels import load_labels
from packdata.sources.pixels import named_warnings, prepared


class PerFileImageDataset(Dataset):
    """One PNG/JPEG per sample, labels from a file keyed by file name (the tutorial's way)."""

    #: whether the images' headers give several sizes (known from :meth:`from_source`)
    mixed_sizes = False
    #: run on each image (uint8 C×H×W) as it is read, as a torchvision Dataset's transform
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __init__(self, folder: str | Path, labels: str | Path | None = None) -> None:
        self.folder = Path(folder)
        self.files = sorted(p.name for p in self.folder.iterdir() if p.suffix.lower() in SUFFIXES)
        self.labels = load_labels(Path(labels))[0] if labels else None

    @classmethod
    def from_source(cls, folder: str | Path) -> PerFileImageDataset:
        """The images under ``folder`` with labels found as ``packdata convert`` finds them
        (``labels.*`` inside the folder, or class sub-folders); unlabelled samples get -1."""
        source = ImageSource(folder)
        items = source.items()
        survey(source, items, workers=1)  # the headers' sizes: one or several
        ds = cls.__new__(cls)
        ds.mixed_sizes = source.mixed_sizes
        ds.folder = Path(folder) if Path(folder).is_dir() else Path(folder).parent
        ds.files = [item.path.relative_to(ds.folder).as_posix() for item in items]
        labelled = any(item.label is not None for item in items)
        ds.labels = {f: item.label for f, item in zip(ds.files, items)} if labelled else None
        return ds

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        name = self.files[i]
        with named_warnings(self.folder / name), Image.open(self.folder / name) as im:
            x = torch.from_numpy(np.array(prepared(im, "RGB"))).permute(2, 0, 1)
        if self.transform is not None:
            x = self.transform(x)
        return x, (self.labels[name] if self.labels else -1)


class InMemoryBatches:
    """Shuffled batches gathered from arrays in RAM, as the same tensors packdata returns:
    ``images`` N×C×H×W (a gather of them is the contiguous batch packdata's default serves)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int = 0):
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.rng = np.random.default_rng(seed)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self.rng.permutation(len(self.images))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            yield (
                torch.from_numpy(self.images[idx]),
                torch.from_numpy(self.labels[idx]),
            )


def tile_image_folder(sample: Path, out: Path, count: int) -> Path:
    """Build a flat folder of ``count`` images (+ labels.json) by repeating the images of
    ``sample`` (a flat folder with labels.json): a realistic many-small-files dataset."""
    meta = json.loads((sample / "labels.json").read_text())
    names = sorted(meta["labels"])
    out.mkdir(parents=True, exist_ok=True)
    labels = {}
    for i in range(count):
        name = names[i % len(names)]
        new = f"{Path(name).stem}_{i:06d}{Path(name).suffix}"
        (out / new).write_bytes((sample / name).read_bytes())
        labels[new] = meta["labels"][name]
    (out / "labels.json").write_text(json.dumps({"classes": meta["classes"], "labels": labels}))
    return out


class ClassicCifarTransform:
    """The tutorial's per-sample CIFAR recipe, as torchvision runs it on one PIL image:
    ``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip()`` [+ ``ColorJitter``] +
    ``ToTensor()`` + ``Normalize(mean, std)``, written with PIL and torch (torchvision does not
    install beside the CPU torch). Takes a uint8 C×H×W tensor or H×W×C array; random numbers
    come from torch's generator, as torchvision's do."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...], padding: int = 4,
                 jitter: float = 0.0) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)
        self.padding, self.jitter = padding, jitter

    def __call__(self, image: torch.Tensor | np.ndarray) -> torch.Tensor:
        from PIL import ImageEnhance, ImageOps

        if isinstance(image, torch.Tensor):
            image = image.permute(1, 2, 0).numpy()
        im = Image.fromarray(np.ascontiguousarray(image))
        w, h = im.size
        im = ImageOps.expand(im, border=self.padding, fill=0)
        top = int(torch.randint(0, 2 * self.padding + 1, (1,)))
        left = int(torch.randint(0, 2 * self.padding + 1, (1,)))
        im = im.crop((left, top, left + w, top + h))
        if float(torch.rand(1)) < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if self.jitter:
            j = self.jitter
            for step in torch.randperm(4).tolist():
                if step == 0:
                    im = ImageEnhance.Brightness(im).enhance(float(torch.empty(1).uniform_(1 - j, 1 + j)))
                elif step == 1:
                    im = ImageEnhance.Contrast(im).enhance(float(torch.empty(1).uniform_(1 - j, 1 + j)))
                elif step == 2:
                    im = ImageEnhance.Color(im).enhance(float(torch.empty(1).uniform_(1 - j, 1 + j)))
                else:  # hue: torchvision shifts H in HSV space
                    hsv = np.array(im.convert("HSV"))
                    shift = int(float(torch.empty(1).uniform_(-j / 4, j / 4)) * 255)
                    hsv[..., 0] = (hsv[..., 0].astype(np.int16) + shift).astype(np.uint8)
                    im = Image.fromarray(hsv, "HSV").convert("RGB")
        x = torch.from_numpy(np.array(im, dtype=np.uint8)).permute(2, 0, 1).float().div(255)
        return (x - self.mean) / self.std
