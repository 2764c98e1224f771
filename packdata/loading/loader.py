"""One loader type for packed datasets: whole batches read in one call each, in this process, in
a pool of threads, or in DataLoader worker processes; optionally delivered on a device and
augmented there, or served from a copy of the whole dataset held in memory (resident mode)."""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from packdata.errors import ArgumentError, ArgumentTypeError
from packdata.loading.dataset import PackedDataset
from packdata.loading.device import Augment, DeviceLoader, map_tensors
from packdata.loading.feeder import Feeder
from packdata.loading.order import batch_order
from packdata.loading.sampling import SeededSampler
from packdata.loading.settings import LoaderSettings, WorkerKind
from packdata.loading.transfer import leave_worker
from packdata.units import callable_argument

# datasets a loader has served a whole shuffled epoch of: a new loader for one of them without
# epoch= would replay epoch 0's order
_SERVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _setting(name: str) -> property:
    return property(lambda self: getattr(self.settings, name),
                    doc=f"The loader's ``{name}`` (:class:`LoaderSettings`).")


class Loader:
    """Batches of ``dataset`` in the order of ``batch_sampler``: what :func:`loader` returns.

    The same interface however the batches are produced: iterate it (each iteration is an
    epoch), ``len()`` (batches per epoch), ``dataset``, ``batch_sampler``, :meth:`set_epoch`.
    ``workers`` is how reads run: ``"thread"`` (a pool in this process), ``"process"``
    (DataLoader worker processes), or None (this process, no pool); ``num_workers`` their count.
    With ``feeder``, the reads (threads included) run in a background process of the loader's
    own (:mod:`packdata.loading.feeder`), and the training thread only takes each batch.
    """

    def __init__(self, dataset: PackedDataset, batch_sampler: Sampler,
                 settings: LoaderSettings | None = None, *, resident: Any = None) -> None:
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.settings = settings or LoaderSettings()
        self.resident = resident  # a ResidentLoader holding the data, in resident mode
        self._dataloader: DataLoader | None = None
        self._pool: ThreadPoolExecutor | None = None  # kept across epochs if persistent_workers
        self._feeder: Feeder | None = None  # started at the first epoch, kept for the next
        self._delivered_count: int | None = None  # batches of the running epoch delivered so far
        self._start_state: dict[str, Any] = {}  # the batch sampler's state at the epoch's start

    collate = _setting("collate")
    num_workers = _setting("num_workers")
    workers = _setting("workers")
    prefetch_factor = _setting("prefetch_factor")
    persistent_workers = _setting("persistent_workers")
    pin_memory = _setting("pin_memory")
    device = _setting("device")
    augment = _setting("augment")
    feeder = _setting("feeder")

    @property
    def dataloader(self) -> DataLoader | None:
        """The DataLoader running worker processes (built once, so persistent workers stay),
        or None when batches are read in this process."""
        if self._dataloader is None and self.workers == "process":
            options = dict(self.settings.dataloader_options)
            options["collate_fn"] = _LeaveWorkerCollate(self.collate)
            self._dataloader = DataLoader(
                self.dataset, batch_size=None, sampler=self.batch_sampler,
                num_workers=self.num_workers, persistent_workers=self.persistent_workers,
                prefetch_factor=self.prefetch_factor, pin_memory=self.pin_memory, **options)
        return self._dataloader

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (its shuffle), as DistributedSampler's."""
        set_epoch = getattr(self.batch_sampler, "set_epoch", None)
        if set_epoch is None:
            raise ArgumentTypeError(f"{type(self.batch_sampler).__name__} has no set_epoch()")
        set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[Any]:
        # packdata's samplers own the epoch: the dataset (e.g. point-cloud variants) follows it
        if isinstance(self.batch_sampler, SeededSampler):
            self.dataset.set_epoch(self.batch_sampler.next_epoch)
        # the state at this epoch's start (read before the sampler begins it)
        self._start_state = getattr(self.batch_sampler, "state_dict", dict)()
        host = self._host_batches()
        if self.device is None and self.augment is None:
            return self._counted(iter(host))
        return self._counted(iter(DeviceLoader(host, self.device, augment=self.augment)))

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        self._delivered_count = 0
        for box in map(_boxed, batches):
            self._delivered_count += 1
            # yielded out of a box, so that this frame holds no batch while the loop works on
            # it: a batch in shared memory frees its slot when the loop lets go of it
            yield box.pop()
        self._delivered_count = None
        if isinstance(self.batch_sampler, SeededSampler) and self.batch_sampler.shuffle:
            # a dataset that cannot be weakly referenced gets no warning
            with contextlib.suppress(TypeError):
                _SERVED[self.dataset] = True

    def state_dict(self) -> dict[str, Any]:
        """Epoch and position (batches delivered so far), O(1) in the dataset size: save it with
        a checkpoint; :meth:`load_state_dict` on a rebuilt loader serves exactly the rest."""
        from packdata.loading.resume import loader_state

        delivered = self._delivered_count
        return loader_state(self, delivered, self._start_state if delivered == 0 else None)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next iteration serves the rest of its epoch
        (also with another ``num_workers``; at another world size the rest is re-split). A state
        of another dataset, packdata version or a corrupted one raises ResumeError."""
        from packdata.loading.resume import load_loader_state

        load_loader_state(self, state)
        self._delivered_count = None

    def _host_batches(self) -> Iterable[Any]:
        if self.resident is not None:
            return self.resident
        if self.dataloader is not None:
            return self.dataloader
        if self.settings.feeder:
            if self._feeder is None:
                here = replace(self.settings, feeder=False, pin_memory=False, device=None,
                               augment=None)
                self._feeder = Feeder(_Pipeline(self.dataset, here), pin=self.pin_memory)
            return self._feeder.run(list(self._index_batches()))
        return self.read(self._index_batches())

    def read(self, index_batches: Iterable[Any]) -> Iterator[Any]:
        """The batches of ``index_batches``, read in this process as the settings say (in a
        pool of threads, or not), each as the loop takes it."""
        if self.workers == "thread":
            if self.persistent_workers and self._pool is None:
                self._pool = ThreadPoolExecutor(self.num_workers, "packdata-read")
            ds = self.dataset
            samples = _threaded(ds.read_samples, index_batches, self._pool or self.num_workers,
                                self.num_workers * (self.prefetch_factor or 2))
            # batch_transform and collate here, in batch order: the same draws as with no workers
            return (self._delivered(ds.finish_batch(parts)) for parts in samples)
        return map(self._batch, index_batches)

    def close(self) -> None:
        """End the loader's feeder process and thread pool, if it has them (they are ended
        when the loader is collected, too; the next epoch starts them again)."""
        if self._feeder is not None:
            self._feeder.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _index_batches(self) -> Iterator[Any]:
        """The batch sampler's batches; as arrays from packdata's samplers (no list per batch)."""
        sampler = self.batch_sampler
        return sampler.arrays() if isinstance(sampler, SeededSampler) else iter(sampler)

    def _batch(self, indices: Any) -> Any:
        return self._delivered(self.dataset.read_batch(indices))

    def _delivered(self, parts: tuple) -> Any:
        """A batch's parts as the loop takes them: a lone part unwrapped, collated, pinned."""
        batch = parts if len(parts) > 1 else parts[0]
        if self.collate is not None:
            batch = self.collate(batch)
        return map_tensors(batch, torch.Tensor.pin_memory) if self.pin_memory else batch

    def __repr__(self) -> str:
        how = "resident" if self.resident is not None else (
            f"{self.num_workers} {self.workers} workers" if self.workers else "in process")
        if self.settings.feeder:
            how += ", in a feeder process"
        return (f"Loader({self.dataset!r}, {len(self)} batches, {how}"
                f"{f', device={self.device}' if self.device is not None else ''})")


def _boxed(batch: Any) -> list[Any]:
    return [batch]


class _Pipeline:
    """What a loader's feeder runs: the loader's own reads, in that process (picklable, for a
    feeder started by spawn)."""

    def __init__(self, dataset: PackedDataset, settings: LoaderSettings) -> None:
        self.dataset, self.settings = dataset, settings
        self._loader: Loader | None = None

    def __call__(self, index_batches: Iterable[Any]) -> Iterator[Any]:
        if self._loader is None:
            self.dataset.reader  # noqa: B018 - opened here once, before any reading thread
            self._loader = Loader(self.dataset, None, self.settings)  # type: ignore[arg-type]
        return self._loader.read(index_batches)


class _LeaveWorkerCollate:
    """Run in each worker: the batch (collated by ``collate``, if given) made ready to leave the
    worker through its ring of shared-memory slots (:mod:`packdata.loading.transfer`)."""

    def __init__(self, collate: Callable[[Any], Any] | None) -> None:
        self.collate = collate

    def __call__(self, batch: Any) -> Any:
        return leave_worker(batch if self.collate is None else self.collate(batch))


def _threaded(read: Callable[[Any], Any], sampler: Iterable[Any],
              threads: int | ThreadPoolExecutor, ahead: int) -> Iterator[Any]:
    """``read(indices)`` for each batch of ``sampler``, in order, ``ahead`` batches in flight on
    ``threads`` threads of this process (a pool of that many, or the pool given)."""
    own = isinstance(threads, int)
    pool = ThreadPoolExecutor(threads, "packdata-read") if own else threads
    try:
        order = iter(sampler)
        pending = deque(pool.submit(read, i) for _, i in zip(range(max(ahead, 1)), order))
        try:
            while pending:
                batch = pending.popleft().result()
                following = next(order, None)
                if following is not None:
                    pending.append(pool.submit(read, following))
                yield batch
        finally:  # an epoch left early: drop what was queued
            for future in pending:
                future.cancel()
    finally:
        if own:
            pool.shutdown(wait=False, cancel_futures=True)


def loader(
    dataset: PackedDataset,
    batch_size: int | None = None,
    *,
    sampler: Sampler | Iterable[int] | None = None,
    batch_sampler: Sampler | Iterable[Any] | None = None,
    collate: Callable[[Any], Any] | None = None,
    shuffle: bool = False,
    drop_last: bool = False,
    seed: int = 0,
    num_workers: int | None = None,
    workers: WorkerKind | None = None,
    pin_memory: bool | None = None,
    persistent_workers: bool | None = None,
    prefetch_factor: int | None = None,
    device: str | torch.device | None = None,
    augment: Augment | None = None,
    resident: bool = False,
    feeder: bool | None = None,
    epoch: int | None = None,
    **dataloader_options: Any,
) -> Loader:
    """A :class:`Loader` yielding whole batches, each read with a few vectorised calls.

    Batches follow the index order, as torch's DataLoader's do; with ``shuffle=True`` each epoch
    reshuffles from ``seed``. Epochs split across DDP ranks (see
    :class:`packdata.loading.sampling.EpochBatchSampler`). As in DataLoader, ``sampler`` (one index at
    a time, e.g. ``RandomSampler(ds)``) sets the order, batched by ``batch_size``; or, instead of
    ``batch_size``, ``batch_sampler`` gives whole batches of indices (e.g.
    :class:`~packdata.loading.buckets.LengthBucketBatchSampler`). ``collate`` turns each batch into what
    the loop takes (e.g. :class:`~packdata.loading.collate.PadCollate`).

    Defaults, each overridable (:class:`~packdata.loading.settings.LoaderSettings`):
    ``num_workers`` 0 for raw records (the fastest choice), more for per-sample work; ``workers``
    (``"thread"`` or ``"process"``) threads unless a per-sample Python ``transform`` needs
    processes; ``prefetch_factor=4`` batches per worker, ``persistent_workers=True`` for
    processes; ``pin_memory`` when CUDA is present and the batches go there; ``feeder``
    (a background process that reads ahead, so that the training thread only takes each batch)
    unless the reads run in DataLoader's worker processes or batches hold variable-length
    fields and no ``collate``. Other keyword arguments go to DataLoader (process workers only).

    ``device`` (``"cuda"``, ``"cpu"``, ``"auto"``) and/or ``augment`` (e.g.
    :func:`packdata.augment.cifar_recipe`): batches arrive on the device, augmented there.
    ``resident=True`` loads the whole dataset once onto ``device`` (host RAM by default) and
    serves the same batches (the same order: ``sampler`` and ``batch_sampler`` too) from there;
    it reads nothing per batch, so ``collate``, workers, ``pin_memory`` and DataLoader options
    are refused with it.

    Build the loader once and iterate it once per epoch: it owns the epoch (each iteration runs
    the next, the dataset follows) and the position (:meth:`Loader.state_dict`). ``epoch`` starts
    it at that epoch; a new shuffled loader for a dataset that already served an epoch, built
    without ``epoch=``, warns (it would replay epoch 0's order).
    """
    if resident:
        made = _resident(dataset, batch_size, sampler=sampler, batch_sampler=batch_sampler,
                         shuffle=shuffle, drop_last=drop_last, seed=seed, device=device,
                         augment=augment, refused={
                             "collate": collate, "num_workers": num_workers or None,
                             "workers": workers, "pin_memory": pin_memory or None,
                             "persistent_workers": persistent_workers,
                             "prefetch_factor": prefetch_factor, "feeder": feeder or None,
                             **dataloader_options})
    else:
        order = batch_order(dataset, batch_size, sampler, batch_sampler, shuffle, drop_last, seed)
        made = Loader(dataset, order, LoaderSettings.resolve(
            dataset, collate=collate, num_workers=num_workers, workers=workers,
            pin_memory=pin_memory, persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor, device=device, augment=augment, feeder=feeder,
            **dataloader_options))
    if epoch is not None:
        made.set_epoch(epoch)
    elif shuffle and _served(dataset):
        warnings.warn("this dataset already served an epoch through another loader, and a new "
                      "loader starts again at epoch 0 with the same order: build the loader once "
                      "and iterate it each epoch, or pass epoch=", UserWarning, stacklevel=2)
    return made


def _served(dataset: Any) -> bool:
    try:
        return bool(_SERVED.get(dataset))
    except TypeError:
        return False


def _resident(dataset: PackedDataset, batch_size: int | None, *, sampler: Any,
              batch_sampler: Any, shuffle: bool, drop_last: bool, seed: int,
              device: str | torch.device | None, augment: Augment | None,
              refused: dict[str, Any]) -> Loader:
    from packdata.loading.resident import ResidentLoader

    given = sorted(name for name, value in refused.items() if value is not None)
    if given:
        raise ArgumentError(f"resident=True serves batches from memory, so {given} cannot apply; "
                            "leave them out (or use resident=False)")
    callable_argument("augment", augment)
    store = ResidentLoader(dataset, batch_size, sampler=sampler, batch_sampler=batch_sampler,
                           device="cpu" if device is None else device, shuffle=shuffle,
                           drop_last=drop_last, seed=seed)
    return Loader(dataset, store.sampler, LoaderSettings(augment=augment), resident=store)
