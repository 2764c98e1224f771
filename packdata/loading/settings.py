"""How a :class:`~packdata.loading.loader.Loader` makes its batches: ``packdata.loader``'s
arguments checked once and completed with their defaults, in one record.

The defaults follow the dataset: raw records are read in this process (handing a batch between
processes costs more than reading it); per-sample work (``keep``-encoded images, a per-sample
``transform``) gets workers, threads unless a Python ``transform`` holds the interpreter lock.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from packdata.errors import ArgumentError
from packdata.loading.dataset import PackedDataset
from packdata.loading.device import Augment, resolve_device
from packdata.units import available_cores, callable_argument, count_argument

WorkerKind = Literal["thread", "process"]
#: ``workers=``: how reads run besides this process
WORKER_KINDS = ("thread", "process")
#: batches each worker keeps in flight when ``prefetch_factor`` is not given
DEFAULT_PREFETCH = 4


def default_num_workers(dataset: PackedDataset) -> int:
    """0 when batches are raw records (handing a batch between processes costs more than
    reading it), all cores (at most 8) when records need per-sample decoding (``keep``-encoded
    images) or the dataset has a per-sample ``transform``; 0 with a batched decode stage
    (``decode=``), which decodes in a thread pool of this process."""
    if dataset.decode is not None:
        return 0
    return min(available_cores(), 8) if _per_sample_work(dataset) else 0


def default_worker_kind(dataset: PackedDataset) -> WorkerKind:
    """Threads, unless the dataset runs a per-sample Python ``transform`` (which holds the GIL):
    reading raw records and decoding images release it, and a thread hands its batch over for
    free where a worker process copies it through shared memory."""
    return "process" if dataset.transform is not None else "thread"


def default_feeder(dataset: PackedDataset, workers: WorkerKind | None,
                   collate: Callable[[Any], Any] | None) -> bool:
    """A feeder process, unless the reads already run in DataLoader worker processes or a batch
    is not all fixed-shape tensors (variable-length fields with no ``collate`` to pad them),
    which shared memory does not carry as one block."""
    return workers != "process" and (collate is not None or not dataset.manifest.variable_fields)


def _per_sample_work(dataset: PackedDataset) -> bool:
    decodes = any(f.codec for f in dataset.manifest.fields.values())
    return decodes or dataset.transform is not None


@dataclass(frozen=True)
class LoaderSettings:
    """What a loader does with each batch of indices, every value checked and final:
    ``workers`` is None (reads in this process) whenever ``num_workers`` is 0;
    ``dataloader_options`` go to torch's DataLoader (process workers only); ``feeder`` runs the
    reads (and their threads) in a background process (:mod:`packdata.loading.feeder`)."""

    collate: Callable[[Any], Any] | None = None
    num_workers: int = 0
    workers: WorkerKind | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False
    device: torch.device | None = None
    augment: Augment | None = None
    dataloader_options: Mapping[str, Any] = field(default_factory=dict)
    feeder: bool = False

    @classmethod
    def resolve(
        cls,
        dataset: PackedDataset,
        *,
        collate: Callable[[Any], Any] | None = None,
        num_workers: int | None = None,
        workers: WorkerKind | None = None,
        pin_memory: bool | None = None,
        persistent_workers: bool | None = None,
        prefetch_factor: int | None = None,
        device: str | torch.device | None = None,
        augment: Augment | None = None,
        feeder: bool | None = None,
        **dataloader_options: Any,
    ) -> LoaderSettings:
        """The settings for ``dataset`` from :func:`packdata.loader`'s arguments: None takes
        the default; a value that cannot apply is refused by name."""
        if workers not in (None, *WORKER_KINDS):
            raise ArgumentError(f"workers must be 'thread', 'process' or None, got {workers!r}")
        callable_argument("collate", collate)
        callable_argument("augment", augment)  # here: the DeviceLoader is made at the first epoch
        target = None if device is None else resolve_device(device)
        num_workers = count_argument("num_workers", default_num_workers(dataset)
                                     if num_workers is None else num_workers)
        if prefetch_factor is not None:
            count_argument("prefetch_factor", prefetch_factor, 1)
        if workers is None:
            workers = default_worker_kind(dataset)
        if pin_memory is None:
            pin_memory = torch.cuda.is_available() and (target is None or target.type == "cuda")
        elif pin_memory and not torch.cuda.is_available():  # as torch's DataLoader: a warning
            warnings.warn("pin_memory=True, but no CUDA device is available: batches are not "
                          "pinned", UserWarning, stacklevel=4)
            pin_memory = False
        if num_workers == 0 and (persistent_workers or prefetch_factor is not None):
            raise ArgumentError("persistent_workers and prefetch_factor need num_workers > 0")
        if "collate_fn" in dataloader_options:
            raise ArgumentError("pass collate= (it runs on every path), not collate_fn=")
        if dataloader_options and not (workers == "process" and num_workers > 0):
            raise ArgumentError(f"{sorted(dataloader_options)} are DataLoader options: they "
                                "apply only with num_workers > 0 and workers='process'")
        in_processes = workers == "process" and num_workers > 0
        if feeder and in_processes:
            raise ArgumentError("feeder=True reads in one background process; workers='process' "
                                "reads in DataLoader's: choose one")
        if feeder is None:
            feeder = default_feeder(dataset, workers if num_workers else None, collate)
        return cls(
            collate=collate, num_workers=num_workers, workers=workers if num_workers else None,
            prefetch_factor=DEFAULT_PREFETCH if prefetch_factor is None and num_workers
            else prefetch_factor,
            persistent_workers=bool(num_workers and (persistent_workers or (
                persistent_workers is None and workers == "process"))),
            pin_memory=pin_memory, device=target, augment=augment,
            dataloader_options=dataloader_options, feeder=bool(feeder))
