"""Batches delivered on the device: pinned host memory, copies one batch ahead on a side CUDA
stream, then the augmentation on the device. On the CPU, a plain pass-through.

>>> for images, labels in DeviceLoader(packdata.loader(ds, 256), "cuda", augment=cifar_recipe()):
...     loss = model(images)   # float32 on the GPU, augmented there
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from packdata.errors import DeviceError, PackdataError
from packdata.units import callable_argument, iterable_argument

Augment = Callable[[torch.Tensor], torch.Tensor]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"`` (or None) → the current CUDA device when there is one, else the CPU with a
    warning; an explicit device that is not present → :class:`DeviceError`."""
    if device is None or device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        warnings.warn("device='auto': no CUDA device is available, batches stay on the CPU",
                      RuntimeWarning, stacklevel=3)
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(f"device {device!r}: not a device name ({exc})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch was built without CUDA" if torch.version.cuda is None
                   else "no CUDA device is visible")
            raise DeviceError(f"device {device!r} was asked for but {why} "
                              f"(torch {torch.__version__}); use device='cpu' or device='auto'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(f"device {device!r}: only {torch.cuda.device_count()} CUDA "
                              "device(s) are visible")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Apply ``fn`` to every tensor in a batch of nested tuples (named ones too), lists, dicts and
    dataclasses (e.g. :class:`~packdata.loading.collate.PackedBatch`)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(map_tensors(b, fn) for b in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_tensors(b, fn) for b in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{
            f.name: map_tensors(getattr(batch, f.name), fn)
            for f in dataclasses.fields(batch) if f.init})
    if isinstance(batch, dict):
        return {k: map_tensors(v, fn) for k, v in batch.items()}
    return batch


def augment_images(batch: Any, augment: Augment | None) -> Any:
    """Apply ``augment`` to a batch's images: the batch itself if it is a tensor, its first part
    if it is a tuple or list (``(images, labels)``), its ``"image"`` entry if it is a dict."""
    if augment is None:
        return batch
    if isinstance(batch, torch.Tensor):
        return augment(batch)
    if isinstance(batch, (tuple, list)):
        return type(batch)([augment(batch[0]), *batch[1:]])
    if isinstance(batch, dict) and "image" in batch:
        return {**batch, "image": augment(batch["image"])}
    raise PackdataError(f"cannot find the images in a batch of type {type(batch).__name__}: "
                        "expected a tensor, (images, …) or a dict with 'image'")


def _pinned(t: torch.Tensor) -> torch.Tensor:
    return t if t.device.type != "cpu" or t.is_pinned() else t.pin_memory()


class DeviceLoader:
    """Wrap any iterable of batches (a DataLoader, :func:`packdata.loader`) so that it yields
    them on ``device``, augmented there by ``augment`` (e.g. :func:`packdata.augment.cifar_recipe`).

    On CUDA, batch ``k + 1`` is pinned (unless the DataLoader already pinned it) and copied with
    ``non_blocking=True`` on a side stream while the caller works on batch ``k``; the main
    stream waits for the copy before the augmentation. Elsewhere batches are moved (a no-op on
    the CPU) and augmented in order. ``device=None`` leaves batches where they are.
    """

    def __init__(self, loader: Iterable[Any], device: str | torch.device | None = "auto",
                 augment: Augment | None = None) -> None:
        iterable_argument("loader", loader, "batches", optional=False)  # else a TypeError later
        callable_argument("augment", augment)
        self.loader = loader
        self.device = None if device is None else resolve_device(device)
        self.augment = augment

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if self.device is not None and self.device.type == "cuda":
            yield from self._cuda_prefetch()
            return
        for batch in self.loader:
            if self.device is not None:
                batch = map_tensors(batch, lambda t: t.to(self.device))
            yield augment_images(batch, self.augment)

    def _cuda_prefetch(self) -> Iterator[Any]:
        device = self.device
        side = torch.cuda.Stream(device)
        main = torch.cuda.current_stream(device)
        batches = iter(self.loader)
        # host batches whose copies may still be running: page-locked memory that is not
        # torch's own (a feeder's shared-memory slots) must outlive its copy
        copying: deque[tuple[torch.cuda.Event, Any]] = deque()

        def issue() -> Any:
            """Start copying the next batch on the side stream; None when the loader is done."""
            try:
                host = next(batches)
            except StopIteration:
                return None
            with torch.cuda.stream(side):
                moved = map_tensors(host, lambda t: _pinned(t).to(device, non_blocking=True))
                copied = torch.cuda.Event()
                copied.record(side)
            copying.append((copied, host))
            return moved

        ahead = issue()
        while ahead is not None:
            while copying and copying[0][0].query():
                copying.popleft()
            main.wait_stream(side)  # the copy of this batch is complete before it is used
            batch = ahead
            # memory allocated on the side stream is now used on the main one
            map_tensors(batch, lambda t: t.record_stream(main))
            ahead = issue()  # the next copy overlaps the augmentation and the caller's step
            yield augment_images(batch, self.augment)

    def __repr__(self) -> str:
        return f"DeviceLoader({self.loader!r}, device={self.device}, augment={self.augment!r})"
