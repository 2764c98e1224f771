"""Batches from worker processes as the training process receives them (the other half of
:mod:`.transfer`): each worker's shared-memory slots mapped once, a batch's tensors made as views
of its slot, and the slot marked free for the worker again when the last of them is gone.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import weakref
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import torch

#: slots in a worker's ring at most (each is made when a batch finds none free)
SLOTS_PER_WORKER = 8


# Who unlinks a segment: the training process, as soon as it mapped it (then the name is gone and
# the memory goes with the last mapping), and says so in the ring's flags; the worker then takes
# it off the resource tracker's list. A segment never mapped there is unlinked by the worker at its
# exit, or, if the worker is killed, by the resource tracker.
#: a ring's flags: [i] slot i holds a batch on its way; [CLAIMED + i] slot i unlinked by the
#: training process; [FLAGS_CLAIMED] the flags segment itself unlinked by it
CLAIMED = SLOTS_PER_WORKER
FLAGS_CLAIMED = 2 * SLOTS_PER_WORKER


def unlink(name: str) -> None:
    """Unlink a worker's segment here, without telling the resource tracker (the worker does)."""
    if os.name == "posix":  # elsewhere a segment goes with its last handle
        import _posixshmem

        with contextlib.suppress(FileNotFoundError):
            _posixshmem.shm_unlink("/" + name.lstrip("/"))


_mapped: dict[int, dict[str, Any]] = {}  # worker pid -> its segments mapped in this process
#: workers whose segments are registered with CUDA as they are mapped (page-locked: copies from
#: them to a GPU are asynchronous DMA, with no pinned copy made first)
_PINNED_SENDERS: set[int] = set()


def pin_arrivals(pid: int) -> None:
    """Register with CUDA every segment of worker ``pid`` mapped from now on (a loader's feeder
    whose batches go to a GPU). A slot's tensors then report ``is_pinned()``; whoever copies
    them asynchronously keeps them until the copy is done (:class:`~packdata.loading.device.DeviceLoader`)."""
    _PINNED_SENDERS.add(pid)


def _attach(pid: int, name: str, flags: Any = None, claim: int = FLAGS_CLAIMED) -> Any:
    """Worker ``pid``'s segment ``name``, mapped here (once; then unlinked, so it goes when both
    sides let it go). Segments of workers that exited are let go when a new worker shows up."""
    segments = _mapped.get(pid)
    if segments is None:
        for old in list(_mapped):
            try:
                os.kill(old, 0)
            except ProcessLookupError:
                del _mapped[old]
            except PermissionError:  # alive, another user's (a reused pid)
                pass
        segments = _mapped[pid] = {}
    memory = segments.get(name)
    if memory is None:
        memory = segments[name] = _open(name)
        unlink(name)
        (flags or memory).buf[claim] = 1
        if pid in _PINNED_SENDERS:
            _register_with_cuda(memory)
    return memory


def _register_with_cuda(memory: Any) -> None:
    """Page-lock ``memory`` for CUDA until it is unmapped (unregistered first)."""
    probe = np.frombuffer(memory.buf, np.uint8)
    address, size = probe.ctypes.data, probe.nbytes
    del probe
    cudart = torch.cuda.cudart()
    if int(cudart.cudaHostRegister(address, size, 0)) == 0:  # 0: cudaSuccess
        weakref.finalize(memory, cudart.cudaHostUnregister, address).atexit = False


def _open(name: str) -> Any:
    if os.name != "posix":
        return shared_memory.SharedMemory(name)
    import _posixshmem

    fd = _posixshmem.shm_open("/" + name.lstrip("/"), os.O_RDWR, mode=0o600)
    try:
        return _Mapping(mmap.mmap(fd, os.fstat(fd).st_size))
    finally:
        os.close(fd)


class _Mapping:
    """A mapped segment, with SharedMemory's ``buf``."""

    def __init__(self, mapped: mmap.mmap) -> None:
        self.buf = memoryview(mapped)


class Arrived:
    """A slot as the training process sees it: the batch's tensors are views of it, and it is
    freed for the worker to reuse when the last of them (and of any view of them) is gone."""

    def __init__(self, pid: int, flags: str, memory: str, index: int) -> None:
        self.flags, self.index = _attach(pid, flags), index
        self.memory = _attach(pid, memory, self.flags, CLAIMED + index)
        self.array: Any = None  # a weak reference to the array the batch's tensors view

    def bytes(self) -> np.ndarray:
        """The slot's bytes as one array, shared by the batch's tensors: the slot stays busy
        while it lives (one finalizer per batch, not one per tensor)."""
        array = self.array() if self.array is not None else None
        if array is None:
            array = np.frombuffer(self.memory.buf, np.uint8)
            weakref.finalize(array, _hold, self).atexit = False
            self.array = weakref.ref(array)
        return array

    def __del__(self) -> None:
        self.flags.buf[self.index] = 0


def from_slot(slot: Arrived, offset: int, dtype: str, shape: tuple,
               inverse: tuple) -> torch.Tensor:
    kind = getattr(torch, dtype)
    nbytes = math.prod(shape) * kind.itemsize
    # a view of the slot's array: every tensor made from it holds it, and so the slot
    view = torch.from_numpy(slot.bytes()[offset : offset + nbytes]).view(kind).view(shape)
    return view if inverse == tuple(range(len(inverse))) else view.permute(inverse)


def _hold(slot: Arrived) -> None:
    """Nothing: the finalizer's reference to ``slot`` is what keeps it until then."""
