"""How batches cross from DataLoader worker processes (and a loader's feeder process,
:mod:`.feeder`) to the training process.

Torch sends a tensor between processes by moving its storage into a new shared-memory segment
and passing the segment's file descriptor over a socket, one round trip per tensor; for a batch
of small records that handshake, not the bytes, is the cost (several milliseconds a batch on a
busy 2-core machine for a 0.8 MB CIFAR batch). :func:`leave_worker` sends a batch's small tensors
through a **ring of reused shared-memory slots** instead: each worker allocates a few slots once,
copies the batch's tensors into a free one and sends only the slot's name and the tensors'
layout; in the training process the batch's tensors are views of the slot, which is marked free
again when the last of them (and every view of them) is gone. A slot is never written while
the loop still holds anything of its batch; a loop that keeps batches simply keeps their slots,
and when a worker finds none free (or a batch outgrows them), its tensors go by value through
the worker's result pipe.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import weakref
from multiprocessing import resource_tracker, shared_memory, util
from typing import Any

import numpy as np
import torch

from packdata.loading.arrivals import (
    CLAIMED,
    FLAGS_CLAIMED,
    SLOTS_PER_WORKER,
    Arrived,
    from_slot,
)
from packdata.loading.device import map_tensors
from packdata.units import reads_for_another_process

#: larger tensors go through torch's own shared memory, where the fixed cost is spread over more
#: bytes (a limit chosen, not measured)
BY_VALUE_MAX_BYTES = 4 << 20
_ALIGN = 64


class ByValueTensor(torch.Tensor):
    """A CPU tensor pickled as its bytes (a numpy array), arriving as a plain tensor."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # ops give plain tensors

    def __reduce_ex__(self, protocol: int) -> tuple:
        dense, inverse = _dense(self.as_subclass(torch.Tensor))
        return _from_numpy, (dense.numpy(), inverse)


class SlotTensor(torch.Tensor):
    """A CPU tensor whose bytes were copied into a shared-memory slot: pickled as its place in
    the slot, arriving as a plain tensor copied out of it."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __reduce_ex__(self, protocol: int) -> tuple:
        slot, offset, dtype, shape, inverse = self._packdata_slot
        return from_slot, (slot, offset, dtype, shape, inverse)


def _dense(t: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """``t`` as a contiguous tensor in its own memory order (a channels-last batch stays
    channels-last), and the permutation that restores its dimensions."""
    if t.is_contiguous():  # the common case, without the sort below
        return t, tuple(range(t.ndim))
    order = sorted(range(t.ndim), key=lambda d: -t.stride(d))
    dense = t.permute(order)
    if not dense.is_contiguous():
        dense, order = t.contiguous(), list(range(t.ndim))
    return dense, tuple(np.argsort(order).tolist())


def _from_numpy(array: np.ndarray, inverse: tuple) -> torch.Tensor:
    return torch.from_numpy(array).permute(inverse)


def leave_worker(batch: Any) -> Any:
    """``batch`` made ready to leave a DataLoader worker: its small CPU tensors copied into a
    reused shared-memory slot (or, with none free, marked to go by value); in the training process,
    unchanged. Each tensor arrives as a plain tensor with the same values and memory order."""
    if not reads_for_another_process():
        return batch
    tensors: list[torch.Tensor] = []
    map_tensors(batch, lambda t: tensors.append(t) if _small(t) else None)
    if not tensors:
        return batch
    gathered = _ring().holding(tensors)
    if gathered is not None:  # read straight into a slot (worker_arrays): nothing to copy
        return _sent_from(gathered, batch)
    nbytes = max(sum(_aligned(t.nbytes) for t in tensors), _ALIGN)  # a segment is never empty
    slot = _ring().acquire(nbytes)
    if slot is None:
        return map_tensors(batch, lambda t: t.as_subclass(ByValueTensor) if _small(t) else t)
    offset = 0

    def into_slot(t: torch.Tensor) -> torch.Tensor:
        nonlocal offset
        if not _small(t):
            return t
        dense, inverse = _dense(t)
        target = np.frombuffer(slot.memory.buf, np.uint8, t.nbytes, offset)
        np.copyto(target, dense.reshape(-1).view(torch.uint8).numpy())
        del target  # no view left on the slot's buffer
        marked = t.as_subclass(SlotTensor)
        marked._packdata_slot = (slot, offset, _DTYPE_NAMES[t.dtype], tuple(dense.shape), inverse)
        offset += _aligned(t.nbytes)
        return marked

    return map_tensors(batch, into_slot)


def worker_arrays(parts: list[tuple[tuple[int, ...], np.dtype]]) -> list[np.ndarray] | None:
    """In a DataLoader worker, empty arrays of these shapes and dtypes laid out in a free
    shared-memory slot, for a read to gather a batch straight into: :func:`leave_worker` then
    sends tensors over them without copying. None outside a worker, or with no slot free. A
    slot whose arrays are dropped without leaving the worker (another collate copied them) is
    free again once they are all gone."""
    if not reads_for_another_process():
        return None
    sizes = [math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in parts]
    nbytes = max(sum(_aligned(size) for size in sizes), _ALIGN)
    ring = _ring()
    slot = ring.acquire(nbytes)
    if slot is None:
        return None
    whole = np.frombuffer(slot.memory.buf, np.uint8, nbytes)
    slot.lease = _Lease(ring, slot.index)
    weakref.finalize(whole, slot.lease.release).atexit = False
    arrays, offset = [], 0
    for (shape, dtype), size in zip(parts, sizes):
        arrays.append(whole[offset : offset + size].view(dtype).reshape(shape))
        offset += _aligned(size)
    return arrays


class _Lease:
    """One batch gathered into a slot in the worker: the slot is the training process's to free
    once the batch is sent, the worker's (when its arrays are gone) if it never is."""

    def __init__(self, ring: _Ring, index: int) -> None:
        self.ring, self.index, self.sent = ring, index, False

    def release(self) -> None:
        if not self.sent and self.ring.slots:  # slots are gone once the ring closed
            self.ring.flags.buf[self.index] = 0


def _sent_from(slot: Slot, batch: Any) -> Any:
    """``batch``, whose small tensors lie in ``slot`` (:meth:`_Ring.holding`), marked to leave
    as their places in it."""
    slot.lease.sent = True  # type: ignore[union-attr]

    def mark(t: torch.Tensor) -> torch.Tensor:
        if not _small(t):
            return t
        marked = t.as_subclass(SlotTensor)
        marked._packdata_slot = (slot, t.data_ptr() - slot.address, _DTYPE_NAMES[t.dtype],
                                 tuple(t.shape), tuple(range(t.ndim)))
        return marked

    return map_tensors(batch, mark)


def by_value(batch: Any) -> Any:
    """``batch`` with its small CPU tensors marked to go by value through the worker's result pipe
    (no slots); in the training process, unchanged."""
    if not reads_for_another_process():
        return batch
    return map_tensors(batch, lambda t: t.as_subclass(ByValueTensor) if _small(t) else t)


def _small(t: torch.Tensor) -> bool:
    return (t.device.type == "cpu" and not t.requires_grad and type(t) is torch.Tensor
            and t.layout == torch.strided and not t.is_quantized
            and t.nbytes <= BY_VALUE_MAX_BYTES and t.dtype not in _NO_NUMPY)


_DTYPE_NAMES = {kind: str(kind).removeprefix("torch.") for kind in vars(torch).values()
                if isinstance(kind, torch.dtype)}
_NO_NUMPY = {torch.bfloat16, torch.complex32} | {
    getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")
    if hasattr(torch, name)}


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


class Slot:
    """One shared-memory slot of a worker's ring, as the worker holds it; pickled as its name."""

    def __init__(self, ring: _Ring, index: int, nbytes: int) -> None:
        self.ring, self.index = ring, index
        self.memory = shared_memory.SharedMemory(create=True, size=nbytes)
        probe = np.frombuffer(self.memory.buf, np.uint8)
        self.address = probe.__array_interface__["data"][0]
        self.size = len(probe)
        del probe  # no view left on the buffer
        #: the batch last gathered into this slot by worker_arrays, if it was
        self.lease: _Lease | None = None

    def __reduce__(self) -> tuple:
        return Arrived, (self.ring.pid, self.ring.flags.name, self.memory.name, self.index)


class _Ring:
    """A worker's slots, and one shared byte per slot: 1 while a batch in it is on its way, set
    back to 0 by the training process once it copied the batch out. Thread-safe: a feeder's
    reading threads take slots at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.flags = shared_memory.SharedMemory(create=True, size=2 * SLOTS_PER_WORKER + 1)
        self.flags.buf[:] = bytes(len(self.flags.buf))
        self.slots: list[Slot] = []
        self.untracked: set[int] = set()  # claim bytes whose segment left the tracker's list
        self.pid = os.getpid()
        util.Finalize(self, self.close, exitpriority=0)  # at the worker's exit

    def acquire(self, nbytes: int) -> Slot | None:
        """A free slot of at least ``nbytes``, marked busy; a new one while there is room."""
        with self.lock:
            return self._acquire(nbytes)

    def _acquire(self, nbytes: int) -> Slot | None:
        flags = self.flags.buf
        if len(self.untracked) <= len(self.slots):
            self._untrack_claimed()
        for slot in self.slots:
            if flags[slot.index] == 0 and slot.memory.size >= nbytes:
                flags[slot.index] = 1
                return slot
        if len(self.slots) == SLOTS_PER_WORKER:
            return None
        slot = Slot(self, len(self.slots), nbytes)
        self.slots.append(slot)
        flags[slot.index] = 1
        return slot

    def holding(self, tensors: list[torch.Tensor]) -> Slot | None:
        """The slot a batch was gathered into (:func:`worker_arrays`) and not sent yet, if
        every one of ``tensors`` is a contiguous tensor inside it."""
        with self.lock:
            slots = list(self.slots)
        if not slots:
            return None
        start = tensors[0].data_ptr()
        for slot in slots:
            if slot.address <= start < slot.address + slot.size:
                break
        else:
            return None
        if slot.lease is None or slot.lease.sent or not self.flags.buf[slot.index]:
            return None
        for t in tensors:
            if not (t.is_contiguous() and slot.address <= t.data_ptr()
                    and t.data_ptr() + t.nbytes <= slot.address + slot.size):
                return None
        return slot

    def _segments(self) -> list[tuple[shared_memory.SharedMemory, int]]:
        return [(s.memory, CLAIMED + s.index) for s in self.slots] + [
            (self.flags, FLAGS_CLAIMED)]

    def _untrack_claimed(self) -> None:
        for memory, claim in self._segments():
            if claim not in self.untracked and self.flags.buf[claim]:
                resource_tracker.unregister(memory._name, "shared_memory")  # type: ignore[attr-defined]
                self.untracked.add(claim)

    def close(self) -> None:
        with self.lock:
            self._close()

    def _close(self) -> None:
        if self.flags.buf is None:  # closed already
            return
        self._untrack_claimed()
        for memory, claim in self._segments():
            if claim not in self.untracked:
                with contextlib.suppress(FileNotFoundError):
                    memory.unlink()  # never mapped by the training process
            with contextlib.suppress(BufferError):  # arrays of a batch still held: unmapped at exit
                memory.close()
        self.slots = []


_RING: _Ring | None = None
_MAKING_RING = threading.Lock()


def _ring() -> _Ring:
    global _RING
    with _MAKING_RING:
        if _RING is None or _RING.pid != os.getpid():
            _RING = _Ring()
        return _RING
