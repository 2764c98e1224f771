"""The torch face of a packed dataset: map-style, batched, safe across workers and DDP ranks.

Indexing follows numpy: ``ds[i]`` is one sample, ``ds[[i, j, …]]`` one batch read with a few
vectorised calls. ``__getitems__`` (what torch's DataLoader calls with automatic batching) reads
the batch the same way and hands the stock collate one :class:`~packdata.loading.rows.BatchRow` (a
tuple) per sample, which the default collate turns back into the batch read, without a copy.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.data import Dataset

from packdata import containers
from packdata.containers.base import Reader, selected_entries
from packdata.containers.integrity import ChecksummedReader, at_open
from packdata.errors import ArgumentError, ArgumentTypeError, DatasetError, PackdataError
from packdata.loading import samples
from packdata.loading.rows import rows_of
from packdata.loading.shared import SharedEpoch
from packdata.loading.transfer import worker_arrays
from packdata.manifest import Manifest
from packdata.recordmeta import Keys
from packdata.remote.storage import CACHE_LIMIT, Storage
from packdata.units import callable_argument, reads_for_another_process
from packdata.urls import is_url

Transform = Callable[[Any], Any]
# what a kind's code raises where a manifest's facts do not fit the records
_KIND_ERRORS = (KeyError, IndexError, TypeError, ValueError, RuntimeError, ZeroDivisionError)
#: records read at once for ``targets`` (a few MB of CIFAR records)
TARGETS_CHUNK = 4096


class PackedDataset(Dataset):
    """A packdata dataset of any container (found from the path) and any sample kind.

    Samples are what the kind defines, e.g. ``(image, label)`` with ``image`` a uint8 C×H×W
    tensor. On every path (``ds[i]``, ``ds[[...]]``, a stock DataLoader with or without
    workers, :func:`packdata.loader`) ``transform`` runs on the first element of each sample and
    ``batch_transform`` then on the first element of the batch those samples make (``ds[i]`` is
    row 0 of the batch ``[i]``).
    ``decode`` (images) is a batched decode stage, e.g. ``packdata.RandomResizedCrop(224)``,
    that turns images of any size into one fixed-size batch (see :mod:`packdata.imagedecode`).
    Images are contiguous N×C×H×W (C×H×W), as code written for torchvision expects;
    ``channels_last=True`` serves them in channels-last memory instead, as stored, saving a copy
    per batch (for a model run in ``torch.channels_last``, or augmentations that convert anyway).
    File handles open lazily in each process, so the dataset can be handed to DataLoader workers.
    """

    #: the container this class opens; None: whichever holds the dataset at ``path``
    container: ClassVar[str | None] = None

    def __init__(
        self,
        path: str | Path,
        transform: Transform | None = None,
        batch_transform: Transform | None = None,
        decode: Any = None,
        *,
        storage: Storage | None = None,
        verify: str = "full",
        channels_last: bool = False,
    ) -> None:
        # how to reach object storage applies to a URL only (given for a local path, where its
        # options were still checked when it was made, it is set aside)
        self.storage = (storage or Storage()) if is_url(path) else None
        self.path: Path | str = str(path).rstrip("/") if self.storage else Path(path)
        self.container_name = containers.for_existing(self.path).NAME  # a URL's too
        if self.container is not None and self.container_name != self.container:
            raise DatasetError(f"{self.path}: a {self.container_name} dataset, not {self.container}; "
                               "packdata.open(path) opens any container")
        self.verify = verify  # "full" (every record read checked), "sample" (here) or "off"
        for name, given in (("transform", transform), ("batch_transform", batch_transform),
                            ("decode", decode)):
            callable_argument(name, given)
        self.transform = transform
        self.batch_transform = batch_transform
        self.decode = decode
        self.channels_last = channels_last
        reader = self._open_reader()
        try:
            self.manifest: Manifest = reader.manifest
            try:
                kind = samples.get(self.manifest.kind)
            except PackdataError as exc:  # an edited manifest, or one of a newer packdata
                raise DatasetError(f"{self.path}: {exc}") from None
            kind.check_asked(self.path, decode=decode, channels_last=channels_last)
            # object storage: every fetched shard (or ranged record) is checked against the
            # manifest's checksums as it arrives, whatever the level. The reader opened here
            # serves this process's reads (opening another would double the cost of a fresh
            # open); a process forked or unpickled from this one opens its own (``reader``)
            self._reader: Reader | None = at_open(reader, self.path,
                                                  "off" if self.storage else verify)
        except BaseException:
            reader.close()
            raise
        self._pid = os.getpid()
        self._epoch = SharedEpoch()
        self._kind_module: samples.SampleKind | None = kind
        self._targets: list[int] | None = None

    @property
    def reader(self) -> Reader:
        """This process's reader, opened on first use (again after a fork)."""
        if self._reader is None or self._pid != os.getpid():
            if self._reader is not None:  # inherited through fork: release the parent's copy
                self._reader.close()
            self._reader = self._open_reader()
            if self.verify == "full" and not self.storage:
                self._reader = ChecksummedReader(self._reader, self.path)
            self._pid = os.getpid()
        return self._reader

    def _open_reader(self) -> Reader:
        return containers.open_reader(self.path, self.storage, self.container_name)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = state["_kind_module"] = state["_targets"] = None
        return state

    def __len__(self) -> int:
        return self.manifest.count

    @property
    def classes(self) -> list[str] | None:
        return self.manifest.classes

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Each class name's label, as torchvision's datasets give it (empty without names)."""
        return {name: i for i, name in enumerate(self.manifest.classes or [])}

    @property
    def targets(self) -> list[int]:
        """Every sample's label, in index order, as torchvision's datasets give them (e.g. for a
        class-balanced sampler). Read once, on first use, through the reader, whole records
        (every one checked, as any read) in blocks: a pass over the dataset. An AttributeError
        for a dataset without labels."""
        if "label" not in self.manifest.fields:
            raise AttributeError(f"{self.path}: no labels, so no targets (its fields: "
                                 f"{', '.join(self.manifest.fields)})")
        if self._targets is None:
            chunks = np.array_split(np.arange(len(self)), max(1, -(-len(self) // TARGETS_CHUNK)))
            self._targets = np.concatenate(
                [self.reader.read(idx)["label"] for idx in chunks]).tolist()
        return self._targets

    @property
    def keys(self) -> Keys:
        """Each sample's key: for images and point clouds its source file's path under the
        source folder without suffix (``cats/cat_0001``); for text the file's path with its
        suffix (``docs/a.txt``), then ``:LINE`` for a line of it (``--per-line``, JSONL) and
        ``#N`` for a chunk (``--split``). A sequence over arrays (``keys[i]``, ``len``,
        iteration, ``keys.index_of(key)``), not a list in memory."""
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
        variable-length fields); a lone tensor when samples have one part. A per-sample
        ``transform`` runs on each sample, then ``batch_transform`` on the collated batch."""
        out = self.read_batch(indices)
        return out if len(out) > 1 else out[0]

    def read_batch(self, indices: Sequence[int] | np.ndarray) -> tuple:
        """The batch as every path serves it, as a tuple of its parts: read, each sample's first
        part transformed and the samples collated again (only with a ``transform``), then
        ``batch_transform`` (:meth:`read_samples`, then :meth:`finish_batch`)."""
        return self.finish_batch(self.read_samples(indices))

    def read_samples(self, indices: Sequence[int] | np.ndarray) -> tuple:
        """The first half of :meth:`read_batch`: read and per-sample ``transform`` (safe to run
        in several threads at once, given a thread-safe ``transform``)."""
        idx = self._indices(indices)
        out = self._read(idx, apart=self.transform is not None)
        if self.transform is not None and len(idx):
            out = _batch_of([self._transformed(out, j) for j in range(len(idx))])
            samples.check_one_size(self._kind, out, self.path)
        return out

    def finish_batch(self, out: tuple) -> tuple:
        """The second half of :meth:`read_batch`: ``batch_transform``, called in batch order (a
        seeded random augmentation then draws the same sequence however the reads were run)."""
        if self.batch_transform is not None:
            out = (self.batch_transform(out[0]), *out[1:])
        return out

    def set_epoch(self, epoch: int) -> None:
        """Tell epoch-dependent sample kinds (e.g. point-cloud variants) which epoch this is.
        Held in shared memory: it reaches DataLoader workers, persistent ones included."""
        self._epoch.set(epoch)

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def _read(self, indices: np.ndarray, apart: bool = False) -> tuple:
        """The batch of ``indices`` as the kind's tensors; with ``apart`` (for a per-sample
        transform), samples that cannot stack as one tensor each, as ``ds[i]`` serves them."""
        kind = self._kind
        try:  # select: e.g. one of K stored variants per record
            select = kind.select(self.manifest, indices, self.epoch) if kind.select else None
        except _KIND_ERRORS as exc:
            raise self._samples_error(kind, exc) from None
        out = self._slot_arrays(len(indices)) if select is None else None
        try:
            batch = self.reader.read(indices, select) if out is None else \
                self.reader.read_into(indices, out)
        except IndexError:
            if select:  # the readers check the entries first; one they refuse is named here
                self._check_select(select, len(indices))
            raise
        extra: dict[str, Any] = {"decode": self.decode} if self.decode is not None else {}
        if self.channels_last:
            extra["channels_last"] = True
        if apart and kind.apart and self.decode is None:
            extra["apart"] = True
        try:
            return kind.to_torch(batch, self.manifest, indices=indices, epoch=self.epoch, **extra)
        except _KIND_ERRORS as exc:
            raise self._samples_error(kind, exc) from None

    @property
    def _kind(self) -> samples.SampleKind:
        """How the dataset's sample kind serves batches (looked up again once unpickled)."""
        if self._kind_module is None:
            self._kind_module = samples.get(self.manifest.kind)
        return self._kind_module

    def _samples_error(self, kind: samples.SampleKind, exc: Exception) -> Exception:
        """Samples made from records by the kind's code: where the manifest's facts (fields,
        options) do not fit the records, its errors name the dataset."""
        if isinstance(exc, PackdataError):
            return exc
        return DatasetError(
            f"{self.path}: its {kind.name} samples cannot be made from its records "
            f"({type(exc).__name__}: {exc}); the manifest does not fit the records (edited?) "
            "or the dataset is damaged")

    def _check_select(self, select: dict[str, np.ndarray], count: int) -> None:
        """The entries the kind selects exist in the stored records (e.g. variant k of K): the
        containers' check (:func:`selected_entries`), failing by the dataset's name."""
        for name, rows in select.items():
            field = self.manifest.fields.get(name)
            if not len(rows):
                continue
            with contextlib.suppress(IndexError):  # the containers' check: passed, nothing to name
                if field is not None and not field.variable:
                    selected_entries(select, name, field, count)
                    continue
            stored = field.shape[0] if field is not None and field.shape else 0
            raise DatasetError(
                f"{self.path}: the manifest asks for entry {int(np.max(rows))} of '{name}', "
                f"which stores {stored}; the manifest was edited or the dataset is damaged")

    def _slot_arrays(self, n: int) -> dict[str, np.ndarray] | None:
        """In a process that hands its batches over (a DataLoader worker, a loader's feeder),
        where the batch is handed over as read (fixed fields, no decode stage, transform or
        channels-last copy), arrays in a shared-memory slot to read it into: it then leaves the
        process without a copy (:func:`packdata.loading.transfer.worker_arrays`)."""
        m = self.manifest
        if (not n or not reads_for_another_process() or self.decode is not None or self.channels_last
                or self.transform is not None or self.batch_transform is not None
                or m.variable_fields):
            return None
        arrays = worker_arrays([((n, *f.shape), f.np_dtype) for f in m.fields.values()])
        return None if arrays is None else dict(zip(m.fields, arrays))

    def _transformed(self, batch: tuple, j: int) -> tuple:
        sample = tuple(part[j] for part in batch)
        return (self.transform(sample[0]), *sample[1:]) if self.transform else sample

    def __getitem__(self, index: int | slice | Sequence[int] | np.ndarray | torch.Tensor) -> Any:
        """``ds[i]``: sample ``i`` (row 0 of the batch ``[i]``: a view, no copy, with the same
        ``transform`` and ``batch_transform`` as any batch); ``ds[[i, j, …]]``, ``ds[a:b]``:
        one batch (:meth:`get_batch`)."""
        if isinstance(index, slice):
            index = range(*index.indices(len(self)))
        if np.ndim(index) == 0:  # an int, or a 0-d array or tensor: one sample
            batch = self.read_batch([index])
            sample = tuple(part[0] for part in batch)
            return sample if len(sample) > 1 else sample[0]
        return self.get_batch(index)

    def __getitems__(self, indices: Sequence[int]) -> list:
        """What DataLoader's automatic batching calls: the batch read (and transformed) as in
        :meth:`get_batch`, handed over as one :class:`~packdata.loading.rows.BatchRow` (a tuple of views)
        per sample, which torch's default collate turns back into that batch without copying it."""
        idx = self._indices(indices)
        if self.transform is not None and self.batch_transform is None:
            # each sample transformed on its own: nothing batched to hand over
            read = self._read(idx, apart=True)
            return [_unwrap(self._transformed(read, j)) for j in range(len(idx))]
        batch = self.read_batch(idx)
        if len(batch) == 1:  # one-part samples are tensors themselves: no row type can stand in
            return list(batch[0].unbind(0) if isinstance(batch[0], torch.Tensor) else batch[0])
        return rows_of(batch)

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
        if array.dtype.kind == "u" and array.max() > np.iinfo(np.int64).max:  # would wrap round
            raise IndexError(f"index {array.max()} out of range")
        return array.astype(np.int64, copy=False)

    def __repr__(self) -> str:
        m = self.manifest
        return f"{type(self).__name__}('{self.path}', {m.count} {m.kind} samples, {m.container})"


def _unwrap(sample: tuple) -> Any:
    return sample if len(sample) > 1 else sample[0]


def _batch_of(samples: list) -> tuple:
    """Samples back into batch parts as ``_read`` gives them: a part is stacked where every
    sample's has the same shape, a list otherwise (variable-length token ids)."""
    parts = zip(*(s if isinstance(s, tuple) else (s,) for s in samples))
    return tuple(
        torch.stack(part) if all(isinstance(x, torch.Tensor) for x in part)
        and len({x.shape for x in part}) == 1 else list(part)
        for part in parts
    )


# The container is found from the path (one registry: packdata.containers); these classes only
# pin it, refusing a dataset of another container.
class LMDBDataset(PackedDataset):
    """A packdata LMDB dataset (``*.lmdb``); :func:`open_dataset` opens any container."""

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
    decode: Any = None,
    *,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | Path | None = None,
    cache_limit: int | str = CACHE_LIMIT,
    verify: str = "full",
    access: str = "shards",
    channels_last: bool = False,
) -> PackedDataset:
    """Open any packdata dataset; the container is recognised from what is at ``path``.
    ``verify``: "full" (the default) checks every record a read returns against its checksum
    (each once per process: later reads of it cost a bit test), "sample" a few records at open,
    "off" neither (the structural checks at open always run).
    Images come as contiguous N×C×H×W batches (C×H×W samples), or in channels-last memory with
    ``channels_last=True``.

    A URL (``s3://bucket/ds``) opens tar shards in object storage, fetched into ``cache_dir``
    (at most ``cache_limit`` bytes of shards) with ``storage_options`` for fsspec; with
    ``access="ranges"`` each batch's records are fetched by ranged GETs instead (map-style access
    to a few records, no shard cached)."""
    return PackedDataset(path, transform=transform, batch_transform=batch_transform, decode=decode,
                         storage=Storage(storage_options or {}, cache_dir, cache_limit,
                                         access=access), verify=verify,
                         channels_last=channels_last)
