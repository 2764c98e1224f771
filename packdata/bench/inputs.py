"""What ``packdata bench`` reads: a packdata dataset of any container, or a plain image folder
(the per-file Dataset: the user's starting point), with the DataLoader knobs the bench turns."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from packdata import containers, sources
from packdata.bench.baselines import PerFileImageDataset
from packdata.conversion.dispatch import convert
from packdata.errors import DatasetError, OptionError, PackdataError
from packdata.imagedecode import CenterCrop, ImageDecode, RandomResizedCrop, Resize
from packdata.loading.collate import PadCollate
from packdata.loading.dataset import open_dataset
from packdata.loading.loader import loader
from packdata.sources import open_source
from packdata.units import available_cores
from packdata.urls import is_url

FOLDER = "folder"
#: the decode stage the bench gives images of mixed sizes when none is asked for
DEFAULT_DECODE = "random-resized-crop:224"
#: ``--decode``'s stages by name: each takes SIZE, center-crop also SIZE:RESIZE
DECODES = {"random-resized-crop": RandomResizedCrop, "center-crop": CenterCrop,
           "resize": Resize}
#: where --compare writes each container, by container name
COMPARE_TARGETS = {"lmdb": "bench.lmdb", "hdf5": "bench.h5", "tar": "bench-tar"}


@dataclass(frozen=True)
class LoaderOptions:
    """The DataLoader knobs the sweep turns (``non_blocking`` is for the copy to a GPU)."""

    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    non_blocking: bool = False

    def dataloader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for DataLoader (the worker-only ones only with workers)."""
        kwargs: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kwargs["persistent_workers"] = self.persistent_workers
            if self.prefetch_factor is not None:
                kwargs["prefetch_factor"] = self.prefetch_factor
        return kwargs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BenchInput:
    """One input to measure: its dataset and how to build a loader over it."""

    name: str  # as the table shows it: "lmdb", "folder"…
    path: Path | str  # a str for a URL
    format: str  # a container name, or "folder"
    kind: str
    dataset: Dataset
    num_classes: int

    @property
    def count(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    @property
    def encoded(self) -> bool:
        """Whether records hold file bytes, decoded at every load (a folder holds no records)."""
        return self.format != FOLDER and any(
            f.codec for f in self.dataset.manifest.fields.values())  # type: ignore[attr-defined]

    def loader(self, batch_size: int, options: LoaderOptions, seed: int = 0) -> DataLoader:
        """Shuffled batches: packdata's batched loader, or a stock DataLoader over the files."""
        kwargs = options.dataloader_kwargs()
        if self.format == FOLDER:  # a seeded generator: rewind() replays the order
            return DataLoader(self.dataset, batch_size=batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(seed), **kwargs)
        # token ids of varying length become (ids, mask) B×T, what the transformer takes
        collate = PadCollate() if self.kind == "text" else None
        # every measuring round builds its loader and replays epoch 0's order on purpose
        return loader(self.dataset, batch_size, shuffle=True, seed=seed,  # type: ignore[arg-type]
                               collate=collate, epoch=0, **kwargs)

    def rewind(self, loader: Any, seed: int = 0) -> None:
        """Make ``loader`` (from :meth:`loader`) serve its first epoch's order again."""
        if self.format == FOLDER:
            loader.generator.manual_seed(seed)
        else:
            loader.set_epoch(0)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "format": self.format,
                "kind": self.kind, "count": self.count, "num_classes": self.num_classes}


def endless(loader: Iterable[Any]) -> Iterator[Any]:
    """Batches from ``loader`` epoch after epoch (re-iterating keeps persistent workers)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise PackdataError("the dataset yields no batches")


def _num_classes(classes: list[str] | None) -> int:
    return len(classes) if classes else 10


def decode_stage(spec: str | ImageDecode | None) -> ImageDecode | None:
    """``--decode``: ``random-resized-crop:SIZE`` (training), ``center-crop:SIZE[:RESIZE]``
    (evaluation) or ``resize:SIZE``; a stage given from Python as it is."""
    if spec is None or isinstance(spec, ImageDecode):
        return spec
    name, _, sizes = str(spec).partition(":")
    numbers = [int(v) for v in sizes.split(":") if v.isdigit()]
    if name in DECODES and len(numbers) == len(sizes.split(":")) and 1 <= len(numbers) <= (
            2 if name == "center-crop" else 1):
        with contextlib.suppress(PackdataError):  # e.g. a crop larger than its resize
            return DECODES[name](*numbers)
    raise OptionError(f"--decode '{spec}': expected random-resized-crop:SIZE, "
                      f"center-crop:SIZE[:RESIZE] or resize:SIZE (e.g. {DEFAULT_DECODE})")


def mixed_sizes(ds: Any) -> bool:
    """Whether the images of a packdata dataset differ in size: stored at any size, or kept
    files whose first few headers differ."""
    from PIL import Image

    image = ds.manifest.fields.get("image")
    if ds.manifest.kind != "image" or image is None:
        return False
    if image.codec is None:
        return image.variable
    sizes = set()
    for data in ds.reader.read(list(range(min(len(ds), 256))))["image"]:
        with Image.open(io.BytesIO(np.ascontiguousarray(data))) as im:
            sizes.add(im.size)
    return len(sizes) > 1


def _stage_for(mixed: bool, decode: str | ImageDecode | None, path: Any,
               log: Callable[[str], Any]) -> ImageDecode | None:
    """The decode stage asked for; for images of mixed sizes without one, the default, said."""
    if decode is None and mixed:
        log(f"{path}: images of mixed sizes: each batch decoded with --decode {DEFAULT_DECODE} "
            "(a training crop; pass --decode to choose another)")
        decode = DEFAULT_DECODE
    return decode_stage(decode)


class OneImage:
    """A decode stage run on one image, as a per-sample transform (the per-file Dataset's: the
    torchvision way, one image at a time)."""

    def __init__(self, stage: ImageDecode) -> None:
        self.stage = stage

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return self.stage([image.permute(1, 2, 0).numpy()], encoded=False,
                          channels_last=False)[0]


def open_input(path: str | Path, decode: str | ImageDecode | None = None,
               log: Callable[[str], Any] = lambda m: None) -> BenchInput:
    """A packdata dataset at ``path``, or else an image folder; otherwise an error saying what
    is there. Images are batched through ``decode`` (:func:`decode_stage`); images of mixed
    sizes through :data:`DEFAULT_DECODE` when it is None, which ``log`` says."""
    if is_url(path):  # object storage holds packdata datasets only
        return _packed(path, decode, log)
    path = Path(path)
    try:
        containers.for_existing(path)
    except DatasetError as not_packed:
        if not path.is_dir():
            raise
        try:
            kind = sources.detect_kind(path)
        except PackdataError:
            raise not_packed from None  # neither: the message says what was found
        if kind != "image":
            raise DatasetError(f"{path}: a folder of {kind} files; convert it first with "
                               "`packdata convert` (the bench reads plain folders of images only)"
                               ) from None
        ds = PerFileImageDataset.from_source(path)
        stage = _stage_for(ds.mixed_sizes, decode, path, log)
        ds.transform = None if stage is None else OneImage(stage)
        classes = sorted(set(ds.labels.values())) if ds.labels else None
        n = max(classes) + 1 if classes else 10
        return BenchInput(FOLDER, path, FOLDER, "image", ds, n)
    return _packed(path, decode, log)


def _packed(path: str | Path, decode: str | ImageDecode | None,
            log: Callable[[str], Any]) -> BenchInput:
    ds = open_dataset(path)
    stage = _stage_for(mixed_sizes(ds), decode, path, log)
    if stage is not None:
        ds = open_dataset(path, decode=stage)  # refused, naming it, for a kind without images
    m = ds.manifest
    return BenchInput(m.container, path, m.container, m.kind, ds, _num_classes(m.classes))


def convert_all(folder: Path, workdir: Path, log: Callable[[str], Any] = lambda m: None,
                workers: int | None = None, decode: str | ImageDecode | None = None
                ) -> list[BenchInput]:
    """The image folder converted into every container under ``workdir`` (for ``--compare``),
    each batched through ``decode`` (as :func:`open_input`)."""
    source = open_source(folder)
    out = []
    for name in containers.CONTAINERS:
        target = workdir / COMPARE_TARGETS.get(name, f"bench.{name}")
        result = convert(source, target, container=name, overwrite=True,
                                  workers=workers or available_cores())
        log(f"converted {folder} to {name} in {result.seconds:.1f} s")
        out.append(open_input(result.path, decode))
    return out
