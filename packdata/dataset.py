"""The torch face of a packed dataset: map-style, batched, safe across workers and DDP ranks.

Indexing follows numpy: ``ds[i]`` is one sample, ``ds[[i, j, …]]`` one batch read with a few
vectorised calls. ``__getitems__`` (what torch's DataLoader calls with automatic batching) reads
the batch the same way and hands the stock collate a list of per-sample views.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.data import Dataset

from packdata import containers, sources
from packdata.containers.base import Reader
from packdata.errors import ArgumentError, ArgumentTypeError
from packdata.manifest import Manifest
from packdata.sampling import SharedEpoch
from packdata.verify import ChecksummedReader, at_open

Transform = Callable[[Any], Any]


class PackedDataset(Dataset):
    """A packdata dataset of any container (found from the path) and any sample kind.

    Samples are what the kind defines, e.g. ``(image, label)`` with ``image`` a uint8 C×H×W
    tensor. ``transform`` is applied to the first element of every sample, however it is read
    (a batch with one is collated from transformed samples); ``batch_transform`` to the first
    element of each batch on batched access (``ds[[...]]``, :func:`packdata.loader`).
    File handles open lazily in each process, so the dataset can be handed to DataLoader workers.
    """

    container: ClassVar[str | None] = None

    def __init__(
        self,
        path: str | Path,
        transform: Transform | None = None,
        batch_transform: Transform | None = None,
        verify: str = "sample",
    ) -> None:
        self.path = Path(path)
        if self.container is None:
            self.container_name = containers.for_existing(self.path).NAME
        else:
            self.container_name = self.container
        reader = containers.get(self.container_name).READER(self.path)
        self.verify = verify  # see packdata.verify: "off", "sample" (checked here) or "full"
        at_open(reader, self.path, verify).close()
        self.manifest: Manifest = reader.manifest  # handles must not cross a fork; each process opens its own
        self.transform = transform
        self.batch_transform = batch_transform
        self._epoch = SharedEpoch()
        self._reader: Reader | None = None
        self._pid = -1

    @property
    def reader(self) -> Reader:
        """This process's reader, opened on first use (again after a fork)."""
        if self._reader is None or self._pid != os.getpid():
            if self._reader is not None:  # inherited through fork: release the parent's copy
                self._reader.close()
            self._reader = containers.get(self.container_name).READER(self.path)
            if self.verify == "full":
                self._reader = ChecksummedReader(self._reader, self.path)
            self._pid = os.getpid()
        return self._reader

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None
        return state

    def __len__(self) -> int:
        return self.manifest.count

    @property
    def classes(self) -> list[str] | None:
        return self.manifest.classes

    @property
    def keys(self) -> list[str]:
        """Each sample's key: its source file's path without suffix."""
        return self.manifest.keys

    def lengths(self, field: str | None = None) -> np.ndarray:
        """Per-sample length of a variable-length field (the only one, if not named)."""
        if field is None:
            names = list(self.manifest.variable_fields)
            if len(names) != 1:
                raise ArgumentError(f"name the field: variable-length fields are {names}")
            field = names[0]
        return self.reader.lengths(field)

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> Any:
        """The samples ``indices`` as one batch: a tuple of batched tensors (or lists, for
        variable-length fields); a lone tensor when samples have one part. With a per-sample
        ``transform``, each sample is transformed and the batch collated as DataLoader would."""
        idx = self._indices(indices)
        if self.transform is not None and len(idx):
            out = _batch_of(self.__getitems__(idx))
        else:
            out = self._read(idx)
        if self.batch_transform is not None:
            out = (self.batch_transform(out[0]), *out[1:])
        return out if len(out) > 1 else out[0]

    def set_epoch(self, epoch: int) -> None:
        """Tell epoch-dependent sample kinds (e.g. point-cloud variants) which epoch this is.
        Held in shared memory: it reaches DataLoader workers, persistent ones included."""
        self._epoch.set(epoch)

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def _read(self, indices: np.ndarray) -> tuple:
        kind = sources.get(self.manifest.kind)
        select = getattr(kind, "select", None)  # e.g. one of K stored variants per record
        batch = self.reader.read(
            indices, select(self.manifest, indices, self.epoch) if select else None
        )
        return kind.to_torch(batch, self.manifest, indices=indices, epoch=self.epoch)

    def _sample(self, batch: tuple, j: int) -> Any:
        sample = tuple(part[j] for part in batch)
        if self.transform is not None:
            sample = (self.transform(sample[0]), *sample[1:])
        return sample if len(sample) > 1 else sample[0]

    def __getitem__(self, index: int | slice | Sequence[int] | np.ndarray | torch.Tensor) -> Any:
        if isinstance(index, slice):
            index = range(*index.indices(len(self)))
        if np.ndim(index) == 0:  # an int, or a 0-d array or tensor: one sample
            batch = tuple(
                part.contiguous() if isinstance(part, torch.Tensor) else part
                for part in self._read(self._indices([index]))
            )
            return self._sample(batch, 0)
        return self.get_batch(index)

    def __getitems__(self, indices: Sequence[int]) -> list:
        batch = self._read(self._indices(indices))
        return [self._sample(batch, j) for j in range(len(indices))]

    @staticmethod
    def _indices(indices: Any) -> np.ndarray:
        """Sample indices as int64, or a clear error for anything but a flat list of integers
        (floats and booleans would silently read the wrong samples)."""
        if isinstance(indices, torch.Tensor):
            indices = indices.cpu().numpy()
        array = np.asarray(indices)
        if array.size == 0:
            return array.astype(np.int64).reshape(0)
        if array.dtype.kind not in "iu":
            raise ArgumentTypeError(f"sample indices must be integers, got {array.dtype} ({indices!r:.60})")
        if array.ndim != 1:
            raise IndexError(f"expected one index or a flat list of them, got shape {array.shape}")
        return array.astype(np.int64, copy=False)

    def __repr__(self) -> str:
        m = self.manifest
        return f"{type(self).__name__}('{self.path}', {m.count} {m.kind} samples, {m.container})"


def _batch_of(samples: list) -> tuple:
    """Samples back into batch parts as ``_read`` gives them: a part is stacked where every
    sample's has the same shape, a list otherwise (variable-length token ids)."""
    parts = zip(*(s if isinstance(s, tuple) else (s,) for s in samples))
    return tuple(
        torch.stack(part) if all(isinstance(x, torch.Tensor) for x in part)
        and len({x.shape for x in part}) == 1 else list(part)
        for part in parts
    )


class LMDBDataset(PackedDataset):
    """A packdata LMDB dataset (``*.lmdb``)."""

    container = "lmdb"


class HDF5Dataset(PackedDataset):
    """A packdata HDF5 dataset (``*.h5``, ``*.hdf5``), read through a memory map."""

    container = "hdf5"


class TarDataset(PackedDataset):
    """A packdata tar-shard dataset (a directory of webdataset-style shards + index)."""

    container = "tar"


def open_dataset(
    path: str | Path,
    transform: Transform | None = None,
    batch_transform: Transform | None = None,
    verify: str = "sample",
) -> PackedDataset:
    """Open any packdata dataset; the container is recognised from what is at ``path``.
    ``verify``: "sample" checks a few records' CRC-32 at open, "full" every record read, "off"
    neither (the structural checks at open always run)."""
    name = containers.for_existing(path).NAME
    cls = next((c for c in PackedDataset.__subclasses__() if c.container == name), PackedDataset)
    return cls(path, transform=transform, batch_transform=batch_transform, verify=verify)
