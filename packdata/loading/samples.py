"""What a dataset of each sample kind serves: a batch read from any container, as tensors.

The sample kinds' conversion side (:mod:`packdata.sources`) imports no torch, so that
``packdata convert`` never loads it; the tensors are made here, on the read side. A kind declares
what its batches take besides the batch (:class:`SampleKind`): a decode stage (images), channels-last
memory (images), one stored variant per record (``select``, from its source module: point clouds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from packdata import sources
from packdata.errors import DatasetError
from packdata.imagedecode import ImageDecode
from packdata.manifest import Manifest
from packdata.sources.images import decode_image, stored_chw
from packdata.units import reads_for_another_process


@dataclass(frozen=True)
class SampleKind:
    """How a dataset of kind ``name`` serves batches: ``to_torch(batch, manifest, *, indices,
    epoch)`` (with ``decode=`` where ``decodes``, ``channels_last=True`` where
    ``channels_last``, ``apart=True`` where ``apart``) makes its tensors; ``select(manifest,
    indices, epoch)``, where the kind has one, names the one entry of a field each record serves
    (what the container then reads). ``apart``: with ``apart=True``, samples that cannot stack
    into one tensor (images of different sizes) come as a list of tensors, one per sample, for a
    per-sample ``transform`` that makes them one shape."""

    name: str
    to_torch: Callable[..., tuple]
    select: Callable[[Manifest, np.ndarray, int], dict[str, np.ndarray]] | None
    decodes: bool = False
    channels_last: bool = False
    apart: bool = False

    def check_asked(self, where: Any, *, decode: Any = None, channels_last: bool = False) -> None:
        """Refuse what a dataset at ``where`` asks of this kind that it does not take."""
        for asked, taken, name in ((decode is not None, self.decodes, "decode="),
                                   (channels_last, self.channels_last, "channels_last=")):
            if asked and not taken:
                raise DatasetError(f"{where}: {name} applies to image datasets, not {self.name}")


def get(kind: str) -> SampleKind:
    """How datasets of sample kind ``kind`` serve batches (a PackdataError for an unknown kind,
    as :func:`packdata.sources.get` raises)."""
    select = sources.get(kind).select  # refuses a kind it does not know
    to_torch, decodes, channels_last, apart = SERVED[kind]
    return SampleKind(kind, to_torch, select, decodes, channels_last, apart)


def images_to_torch(
    batch: dict, manifest: Manifest, *, indices: np.ndarray, epoch: int,
    decode: ImageDecode | None = None, channels_last: bool = False, apart: bool = False,
) -> tuple[torch.Tensor | list[torch.Tensor], ...]:
    """``(images, labels)`` as uint8 B×C×H×W and int64 B. Images are contiguous, as torchvision's
    datasets give them (``x.view(B, -1)`` works); ``channels_last=True`` hands them in
    channels-last memory instead. Pixels stored C×H×W (the default) are the contiguous batch as
    read, no copy; pixels stored H×W×C are the channels-last batch as read. The other layout
    costs one transposing copy per batch.

    With a ``decode`` stage, images of any storage are decoded, cropped and resized by it into
    one batch; without one, the batch's images must all have the same size, or with ``apart``
    they come as a list of contiguous C×H×W images (one per sample, for a per-sample
    transform that resizes them)."""
    images = batch["image"]
    mode = manifest.options.get("mode", "RGB")
    encoded = manifest.fields["image"].codec == "image"
    sizes = batch.get("image_size")
    chw = stored_chw(manifest)
    if decode is not None:
        if chw:  # the stage takes H×W×C pixels: views, it reads only each crop's box
            images = np.asarray(images).transpose(0, 2, 3, 1)
        x = decode(images, encoded=encoded, sizes=sizes, mode=mode, indices=indices, epoch=epoch,
                   channels_last=channels_last)  # laid out by the decode threads
    else:
        if encoded:
            images = [decode_image(b, mode) for b in images]
        elif sizes is not None:
            images = [rows.reshape(int(h), int(w), -1) for rows, (h, w) in zip(images, sizes)]
        if isinstance(images, list):
            if apart and len({im.shape for im in images}) > 1:
                return _with_labels([_image_tensor(im) for im in images], batch)
            images = _stack(images, Image.getmodebands(mode))
        x = torch.from_numpy(images)
        if not chw:  # H×W×C pixels, or H×W ones (one channel, e.g. mode "L")
            x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
    if channels_last:
        x = _channels_last(x)
    else:
        # a decode stage may have pinned its batch for the GPU copy: so is the contiguous one (asked
        # only then, since asking starts CUDA)
        x = _contiguous(x, pinned=decode is not None and torch.cuda.is_available()
                        and not reads_for_another_process() and x.is_pinned())
    return _with_labels(x, batch)


def check_one_size(kind: SampleKind, batch: tuple, where: Any) -> None:
    """Refuse a batch of a kind that serves samples ``apart`` whose first part a per-sample
    transform left in several shapes (images it did not resize to one size)."""
    if kind.apart and isinstance(batch[0], list) and batch[0]:
        shapes = sorted({tuple(x.shape) for x in batch[0]})
        raise DatasetError(
            f"{where}: the transform left this batch's images in {len(shapes)} shapes "
            f"({', '.join('x'.join(map(str, s)) for s in shapes[:3])}"
            f"{' ...' if len(shapes) > 3 else ''}); make it resize them to one (e.g. "
            "torchvision's v2.Resize(256) then v2.CenterCrop(224)), or give a decode stage: "
            "packdata.open(path, decode=packdata.CenterCrop(224, resize=256))")


def _with_labels(images: torch.Tensor | list[torch.Tensor], batch: dict) -> tuple:
    if "label" in batch:
        return images, torch.from_numpy(np.asarray(batch["label"]))
    return (images,)


def _image_tensor(pixels: np.ndarray) -> torch.Tensor:
    """One image's H×W×C (or H×W) pixels as a contiguous C×H×W tensor."""
    chw = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
    return torch.from_numpy(np.ascontiguousarray(chw))


def _contiguous(x: torch.Tensor, pinned: bool) -> torch.Tensor:
    """``x`` in contiguous memory (pinned memory if ``pinned``)."""
    if x.is_contiguous():
        return x
    out = torch.empty(x.shape, dtype=x.dtype, pin_memory=pinned)
    # numpy's copy, not torch's: torch splits this transpose over its intra-op threads, which
    # stall beside busy processes (bench/bench_gather.py measures that for the gather)
    np.copyto(out.numpy(), x.numpy())
    return out


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    """N×C×H×W ``x`` in channels-last memory."""
    if x.is_contiguous(memory_format=torch.channels_last):
        return x
    n, c, h, w = x.shape
    out = torch.empty((n, h, w, c), dtype=x.dtype)
    if x.is_contiguous():
        # one strided copy per channel, reading each plane in order, not numpy's copy of the
        # transposed view, whose innermost source axis strides by a whole plane; not torch's
        # copy either (see _contiguous)
        rows, planes = out.numpy().reshape(n, h * w, c), x.numpy().reshape(n, c, h * w)
        for channel in range(c):
            rows[:, :, channel] = planes[:, channel]
    else:
        np.copyto(out.numpy(), x.permute(0, 2, 3, 1).numpy())
    return out.permute(0, 3, 1, 2)


def _stack(images: list[np.ndarray], channels: int) -> np.ndarray:
    if not images:
        return np.zeros((0, 0, 0, channels), np.uint8)
    shapes = sorted({im.shape[:2] for im in images})
    if len(shapes) > 1:
        seen = ", ".join(f"{h}x{w}" for h, w in shapes[:3]) + (" ..." if len(shapes) > 3 else "")
        raise DatasetError(
            f"this batch holds images of {len(shapes)} different sizes (HxW {seen}); give a "
            "decode stage that makes them one size: packdata.open(path, "
            "decode=packdata.RandomResizedCrop(224)) for training, or "
            "decode=packdata.CenterCrop(224, resize=256) for evaluation")
    return np.stack(images)


def text_to_torch(
    batch: dict, manifest: Manifest, *, indices: np.ndarray, epoch: int
) -> tuple[list[torch.Tensor]]:
    """``(documents,)``: one 1-D int64 tensor per document (views of one converted buffer)."""
    docs = batch["tokens"]
    if not docs:
        return ([],)
    flat = torch.from_numpy(np.concatenate(docs).astype(np.int64))
    return (list(flat.split([len(d) for d in docs])),)


def points_to_torch(
    batch: dict, manifest: Manifest, *, indices: np.ndarray, epoch: int
) -> tuple[torch.Tensor, ...]:
    """``(points, label?, point_labels?, mask?)`` from a batch read with the kind's ``select``: B×N×F
    points of one variant per sample (float32; float64 when stored so), int64 B labels, int64
    B×N point labels, bool B×N mask (each present when stored)."""
    points = batch["points"]
    dtype = np.float64 if points.dtype == np.float64 else np.float32  # float16 is for storage
    out = [torch.from_numpy(np.asarray(points, dtype=dtype))]
    if "label" in batch:
        out.append(torch.from_numpy(np.asarray(batch["label"], dtype=np.int64)))
    if "point_labels" in batch:
        out.append(torch.from_numpy(batch["point_labels"].astype(np.int64)))
    if "mask" in batch:
        out.append(torch.from_numpy(np.ascontiguousarray(batch["mask"])))
    return tuple(out)


#: each kind of :data:`packdata.sources.KINDS`: its ``to_torch``, whether it takes a decode stage,
#: whether it serves channels-last memory, whether it serves samples apart
SERVED: dict[str, tuple[Callable[..., tuple], bool, bool, bool]] = {
    "image": (images_to_torch, True, True, True),
    "text": (text_to_torch, False, False, False),
    "pointcloud": (points_to_torch, False, False, False),
}
