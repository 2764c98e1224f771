"""The starting points packdata is measured against.

:class:`PerFileImageDataset` is the classic tutorial Dataset: one image file opened and decoded
per sample. :class:`InMemoryBatches` gathers batches from a numpy array in RAM: the ceiling for
any storage.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from packdata.sources.images import SUFFIXES
from packdata.sources.labels import load_labels


class PerFileImageDataset(Dataset):
    """One PNG/JPEG per sample, labels from a file keyed by file name (the tutorial's way)."""

    def __init__(self, folder: str | Path, labels: str | Path | None = None) -> None:
        self.folder = Path(folder)
        self.files = sorted(p.name for p in self.folder.iterdir() if p.suffix.lower() in SUFFIXES)
        self.labels = load_labels(Path(labels))[0] if labels else None

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        name = self.files[i]
        with Image.open(self.folder / name) as im:
            x = torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)
        return x, (self.labels[name] if self.labels else -1)


class InMemoryBatches:
    """Shuffled batches gathered from arrays in RAM, as the same tensors packdata returns."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int = 0):
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.rng = np.random.default_rng(seed)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self.rng.permutation(len(self.images))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            yield (
                torch.from_numpy(self.images[idx]).permute(0, 3, 1, 2),
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
