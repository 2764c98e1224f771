"""NVIDIA DALI path (extra ``dali``): read packdata tar shards, or batches of any packdata image
dataset, decode and augment in a DALI pipeline, and hand torch tensors to the training loop.

- :func:`tar_loader` reads the tar shards with ``fn.readers.webdataset``. packdata writes the
  DALI index files (format v1.2) from its own ``index.npz``, so DALI neither scans the shards nor
  needs ``wds2idx``; for raw records the index points at the pixel bytes past each ``.npy``
  header, so DALI reshapes them with no parsing. ``keep``-encoded JPEG/PNG records are decoded
  with ``fn.decoders.image`` — on the GPU (nvJPEG, ``device="mixed"``) when the pipeline runs on
  one, on the CPU otherwise.
- :func:`external_loader` feeds batches of a packdata dataset (any container) through
  ``fn.external_source``.

Both apply the CIFAR recipe in DALI (random crop with zero padding, mirror, normalise) and yield
``(images float32 B×C×H×W, labels int64 B)`` through DALI's PyTorch plugin. ``device_id=None``
builds a CPU-only pipeline (what CI runs). For images of any size, :func:`tar_loader` takes
``crop=packdata.RandomResizedCrop(224)`` (decoded with ``fn.decoders.image_random_crop``, which
decodes only the crop's region) or ``crop=packdata.CenterCrop(224, resize=256)`` instead.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from packdata.augment.ops import CIFAR10_MEAN, CIFAR10_STD
from packdata.containers.tar import read_manifest, shard_paths
from packdata.containers.tar.indexes import dali_index_paths
from packdata.containers.tar.reindex import write_reader_indexes
from packdata.errors import ArgumentError, DatasetError, require
from packdata.imagedecode import CenterCrop, ImageDecode, RandomResizedCrop
from packdata.loading.dataset import PackedDataset
from packdata.manifest import Manifest
from packdata.sources.images import stored_chw

LABEL_DIGITS = 20  # .cls members are decimal text: padded to this many bytes, parsed in torch


def _dali() -> Any:
    return require("nvidia.dali", "dali", "the DALI pipeline")


def _image_manifest(path: Path) -> Manifest:
    manifest = read_manifest(path)
    if manifest.container != "tar" or manifest.kind != "image":
        raise DatasetError(f"{path}: the DALI tar reader needs a tar dataset of images")
    return manifest


def npy_header_size(path: str | Path) -> int:
    """Bytes of ``.npy`` header before the pixels of a raw tar dataset's image members (one
    header for all records: the field has a fixed dtype and shape)."""
    offsets = np.load(Path(path) / "index.npz")["image.offset"]
    headers = np.unique(offsets % 512)
    if len(headers) != 1:
        raise DatasetError(f"{path}: image members have different .npy header sizes {headers}")
    return int(headers[0])


def _augment(images: Any, size: tuple[int, int], padding: int, mirror: float,
             mean: Sequence[float], std: Sequence[float], dtype: str = "float32") -> Any:
    """Zero padding, random crop, mirror and normalise in DALI (HWC uint8 → CHW float, or
    CHW uint8 with ``dtype="uint8"`` and mean 0, std 1/255)."""
    fn, types = _dali().fn, _dali().types
    h, w = size
    if padding:  # a slice starting outside the image pads it with zeros on every side
        images = fn.slice(images, start=[-padding, -padding], shape=[h + 2 * padding, w + 2 * padding],
                          axis_names="HW", out_of_bounds_policy="pad", fill_values=0)
    # DALI rounds a 0–1 crop position to a pixel; drawing from the exact offsets 0…2·padding
    # keeps every offset equally likely (a continuous draw halves the odds of both ends)
    offsets = [k / (2 * padding) for k in range(2 * padding + 1)] if padding else [0.5]
    return fn.crop_mirror_normalize(
        images, crop=(h, w), crop_pos_x=fn.random.uniform(values=offsets),
        crop_pos_y=fn.random.uniform(values=offsets),
        mirror=fn.random.coin_flip(probability=mirror) if mirror else 0,
        mean=[m * 255 for m in mean], std=[s * 255 for s in std],
        dtype=types.UINT8 if dtype == "uint8" else types.FLOAT, output_layout="CHW")


class DaliLoader:
    """Iterate a built DALI pipeline as ``(images, labels)`` torch batches (one epoch per
    ``iter``). Labels read as decimal text from tar shards are parsed here, vectorised."""

    def __init__(self, pipeline: Any, reader_name: str | None, text_labels: bool,
                 keep: Any = None) -> None:
        plugin = require("nvidia.dali.plugin.pytorch", "dali", "the DALI PyTorch plugin")
        self.pipeline = pipeline
        self.text_labels = text_labels
        self._keep = keep  # e.g. the temporary index folder, alive as long as the loader
        self._iterator = plugin.DALIGenericIterator(
            pipeline, ["images", "labels"], reader_name=reader_name, auto_reset=True,
            last_batch_policy=plugin.LastBatchPolicy.PARTIAL)

    def __len__(self) -> int:
        return len(self._iterator)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for out in self._iterator:
            images, labels = out[0]["images"], out[0]["labels"]
            yield images, parse_text_labels(labels) if self.text_labels else labels.long().view(-1)


def parse_text_labels(padded: torch.Tensor) -> torch.Tensor:
    """B×k uint8 ASCII digits padded with zeros (``b"17\\0\\0…"``) → int64 labels."""
    digits = padded.long() - ord("0")
    valid = padded != 0
    count = valid.sum(dim=1, keepdim=True)
    place = count - 1 - torch.arange(padded.shape[1], device=padded.device)  # power of ten
    weights = torch.where(valid, 10 ** place.clamp(min=0), 0)
    return (digits * weights).sum(dim=1)


def _device(device: str, device_id: int | None) -> tuple[str, int | None]:
    """("cpu"|"gpu", device_id): "auto" takes the GPU when CUDA is present; a CPU pipeline gets
    ``device_id=None`` so that DALI never touches CUDA."""
    if device == "auto":
        device = "gpu" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "gpu"):
        raise ArgumentError(f"device '{device}': expected 'cpu', 'gpu' or 'auto'")
    if device == "cpu":
        return device, None
    if not torch.cuda.is_available():
        from packdata.errors import DeviceError

        raise DeviceError("the DALI GPU pipeline needs a CUDA device; use device='cpu'")
    return device, torch.cuda.current_device() if device_id is None else device_id


def tar_loader(path: str | Path, batch_size: int, *, device: str = "auto",
               device_id: int | None = None, shuffle: bool = True, seed: int = 0,
               size: int | tuple[int, int] | None = None, padding: int = 4, mirror: float = 0.5,
               mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD,
               num_threads: int = 2, index_dir: str | Path | None = None,
               crop: ImageDecode | None = None, dtype: str = "float32") -> DaliLoader:
    """A DALI loader over the tar shards at ``path``: read, decode (GPU when ``device="gpu"``),
    crop with ``padding`` to ``size`` (default: the stored size), mirror, normalise.

    ``crop`` replaces padding, size and mirror for images of any size: a
    :class:`~packdata.RandomResizedCrop` (its size, scale, ratio and flip; DALI's own draw of the
    box) or a :class:`~packdata.CenterCrop`. ``dtype="uint8"`` skips normalisation."""
    dali = _dali()
    fn, types = dali.fn, dali.types
    device, device_id = _device(device, device_id)
    keep = None
    own = dali_index_paths(path) if index_dir is None else None  # written at conversion
    if own is not None:
        shards, index_paths = [str(p) for p in shard_paths(Path(path))], own
    else:
        if index_dir is None:
            keep = tempfile.TemporaryDirectory(prefix="packdata-dali-")
            index_dir = keep.name
        shards = [str(p) for p in shard_paths(Path(path))]
        Path(index_dir).mkdir(parents=True, exist_ok=True)  # a folder the caller named may be new
        index_paths = [str(p) for p in write_reader_indexes(path, index_dir)]
    manifest = _image_manifest(Path(path))
    image, chw = manifest.fields["image"], stored_chw(manifest)
    stored = list(image.shape)
    raw = image.codec != "image"
    ext = "image.npy" if raw else "png;jpg;jpeg"  # keep: the member's own suffix, either one
    if raw and stored[0] is None:
        raise DatasetError(f"{path}: raw images of any size (--max-size) are not readable by "
                           "DALI's tar reader; convert with --encoding keep, or read them with "
                           "packdata.open(path, decode=...)")
    if crop is not None and not isinstance(crop, (RandomResizedCrop, CenterCrop)):
        raise ArgumentError(f"crop {crop!r}: DALI offers RandomResizedCrop or CenterCrop")
    if dtype not in ("float32", "uint8"):
        raise ArgumentError(f"dtype '{dtype}': expected 'float32' or 'uint8'")
    header = npy_header_size(path) if raw else 0
    if crop is not None:
        size, padding, mirror = crop.size, 0, crop.flip
    if dtype == "uint8":
        mean, std = (0.0, 0.0, 0.0), (1 / 255, 1 / 255, 1 / 255)
    if size is None:
        if not raw:
            raise ArgumentError("give size= for keep-encoded images (their size is not in the manifest)")
        size = (stored[1], stored[2]) if chw else (stored[0], stored[1])
    size = (size, size) if isinstance(size, int) else tuple(size)

    @dali.pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id,
                       seed=seed)
    def pipeline():
        images, labels = fn.readers.webdataset(
            paths=shards, index_paths=index_paths, ext=[ext, "cls"], random_shuffle=shuffle,
            seed=seed, name="reader", missing_component_behavior="error")
        decoder = "mixed" if device == "gpu" else "cpu"
        if raw:  # skip the .npy header, then the bytes are the C×H×W (or H×W×C) pixels
            images = fn.slice(images, start=[header], shape=[int(np.prod(stored))], axes=[0])
            images = fn.reshape(images, shape=stored, layout="CHW" if chw else "HWC")
            if chw:  # DALI's image operators take H×W×C
                images = fn.transpose(images, perm=[1, 2, 0], output_layout="HWC")
            images = images.gpu() if device == "gpu" else images
        elif isinstance(crop, RandomResizedCrop):  # decodes only the crop's region
            images = fn.decoders.image_random_crop(
                images, device=decoder, output_type=types.RGB, random_area=list(crop.scale),
                random_aspect_ratio=list(crop.ratio), num_attempts=10)
        else:
            images = fn.decoders.image(images, device=decoder, output_type=types.RGB)
        if raw and isinstance(crop, RandomResizedCrop):
            images = fn.random_resized_crop(images, size=list(size), random_area=list(crop.scale),
                                            random_aspect_ratio=list(crop.ratio), num_attempts=10)
        elif isinstance(crop, RandomResizedCrop):
            images = fn.resize(images, resize_x=size[1], resize_y=size[0])
        elif isinstance(crop, CenterCrop):
            images = fn.resize(images, resize_shorter=crop.resize)
        labels = fn.pad(labels, axes=[0], shape=[LABEL_DIGITS], fill_value=0)
        return _augment(images, size, padding, mirror, mean, std, dtype), labels

    pipe = pipeline()
    pipe.build()
    return DaliLoader(pipe, "reader", text_labels=True, keep=keep)


def external_loader(dataset: PackedDataset, batch_size: int, *, device: str = "auto",
                    device_id: int | None = None, shuffle: bool = True, seed: int = 0,
                    padding: int = 4, mirror: float = 0.5, mean: Sequence[float] = CIFAR10_MEAN,
                    std: Sequence[float] = CIFAR10_STD, num_threads: int = 2) -> DaliLoader:
    """A DALI loader fed with batches of ``dataset`` (read by :func:`packdata.loader`, so any
    container and ``keep``-encoded records decoded by packdata) through ``fn.external_source``."""
    from packdata.loading.loader import loader

    dali = _dali()
    device, device_id = _device(device, device_id)
    batches = loader(dataset, batch_size, shuffle=shuffle, seed=seed, num_workers=0)

    class Source:  # called per batch; a new pass over the packdata loader per DALI epoch
        epoch, it = -1, None

        def __call__(self, info: Any) -> tuple[np.ndarray, np.ndarray]:
            if info.epoch_idx != self.epoch:
                self.epoch, self.it = info.epoch_idx, iter(batches)
            images, labels = next(self.it)  # StopIteration ends DALI's epoch
            # H×W×C for DALI: no copy from a channels_last=True dataset, numpy's otherwise
            return np.ascontiguousarray(images.permute(0, 2, 3, 1).numpy()), labels.numpy()

    sample = dataset[0][0]
    size = (int(sample.shape[1]), int(sample.shape[2]))

    @dali.pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id,
                       seed=seed)
    def pipeline():
        images, labels = dali.fn.external_source(
            source=Source(), num_outputs=2, layout=["HWC", ""], batch=True, batch_info=True,
            device="gpu" if device == "gpu" else "cpu")
        return _augment(images, size, padding, mirror, mean, std), labels

    pipe = pipeline()
    pipe.build()
    return DaliLoader(pipe, None, text_labels=False)
