"""A loader's feeder: a background process that reads the epoch's batches ahead of the training
loop and hands each over through shared memory, so that the training thread's share of a batch
is taking it, not reading it.

Why a process and not a thread: an eager training step keeps the training thread busy, holding
the interpreter lock while it launches kernels; a reading thread in the same process needs that
lock for the Python around every read, and each time it asks it either waits out the step's
switch interval (falling behind) or takes the lock from the step (slowing it).
``bench/bench_feed.py`` measures the loop both ways. A process has an interpreter of its own.

The feeder is the loader's in-process pipeline run elsewhere: it reads each batch as the loader
would (threads included), and the batch crosses through the ring of reused shared-memory slots
DataLoader workers use (:mod:`.transfer`), read straight into a slot where the dataset can.
Order and position stay the training process's: the loader draws the epoch's batches of indices
from its sampler and sends them once; the feeder reads them in that order, at most ``ahead``
batches before the loop, and the loader counts what it delivered (``state_dict``). An epoch
left early is stopped and drained; the process lives on for the next epoch (the records it
checked stay checked) until the loader is closed or collected.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing import sharedctypes
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch

from packdata import interrupts, units
from packdata.errors import PackdataError, WorkerDied
from packdata.loading import arrivals, transfer

#: batches the feeder may read before the loop takes them: each holds a shared-memory slot, and
#: a worker's ring has SLOTS_PER_WORKER of them for these, the one being read and those the loop
#: still holds (a batch that finds none free goes by value: a copy through the pipe)
AHEAD = 2
#: how long a feeder with no slot to spare sleeps before looking again
IDLE_S = 0.0002
#: how long an epoch left early may take to stop before the feeder is ended instead
STOP_S = 5.0

#: what a feeder runs: one epoch's batches of indices in, its batches out, in the same order
Produce = Callable[[Iterable[np.ndarray]], Iterator[Any]]


class Feeder:
    """Runs ``produce`` in a background process, one epoch at a time (:meth:`run`)."""

    def __init__(self, produce: Produce, *, ahead: int = AHEAD, pin: bool = False) -> None:
        self.produce = produce
        self.ahead = ahead
        self.pin = pin  # register the slots with CUDA as they arrive (batches go to a GPU)
        self._process: Any = None
        self._conn: Connection | None = None
        self._taken = sharedctypes.RawArray("q", 1)  # batches of the epoch the loop took
        self._epoch = 0
        self._finalizer: weakref.finalize | None = None

    @property
    def pid(self) -> int | None:
        """The feeder process's id, once started."""
        return None if self._process is None else self._process.pid

    def run(self, batches: Sequence[np.ndarray]) -> Iterator[Any]:
        """The batches ``produce`` makes of ``batches`` (index arrays), read ahead in the
        feeder process; an error there is raised here, at the batch it concerns."""
        if not len(batches):
            return
        self._start()
        self._epoch += 1
        order = np.concatenate([np.asarray(b, dtype=np.int64).reshape(-1) for b in batches])
        bounds = np.cumsum([0, *map(len, batches)])
        self._taken[0] = 0
        self._send(("epoch", self._epoch, order, bounds))
        ended = False
        try:
            while True:
                message = self._receive()
                kind, epoch, payload = message[0], message[1], list(message[2:])
                del message  # the batch is held by ``payload`` alone, which yielding empties
                if epoch != self._epoch:  # left over from an epoch stopped early
                    continue
                if kind == "batch":
                    self._taken[0] += 1
                    # nothing here holds the batch once it is yielded: its slot is free as soon
                    # as the loop lets go of it
                    yield payload.pop()
                elif kind == "error":
                    ended = True
                    raise _raised(payload[0])
                else:
                    ended = True
                    return
        finally:
            if not ended:
                self._stop_epoch()

    def close(self) -> None:
        """End the feeder process (it is started again by the next :meth:`run`)."""
        if self._finalizer is not None:
            self._finalizer()
        self._process = self._conn = self._finalizer = None

    def _start(self) -> None:
        if self._process is not None and self._process.is_alive():
            return
        self.close()
        context = mp.get_context("fork") if "fork" in mp.get_all_start_methods() \
            else mp.get_context()
        here, there = context.Pipe()
        process = context.Process(
            target=_serve, args=(there, self.produce, self._taken, self.ahead, os.getpid()),
            name="packdata-feeder", daemon=True)
        gc.freeze()  # the feeder's collections then never copy the parent's pages (as the pool's)
        try:
            process.start()
        finally:
            gc.unfreeze()
        there.close()
        if self.pin:
            arrivals.pin_arrivals(process.pid)
        self._process, self._conn = process, here
        self._finalizer = weakref.finalize(self, _end, process, here)

    def _send(self, message: Any) -> None:
        try:
            self._conn.send(message)  # type: ignore[union-attr]
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise self._died() from None

    def _receive(self) -> tuple[str, int, Any]:
        try:
            return self._conn.recv()  # type: ignore[union-attr]
        except (EOFError, ConnectionResetError, OSError):
            raise self._died() from None

    def _died(self) -> WorkerDied:
        process = self._process
        if process is not None:
            process.join(1.0)  # its exit code, once it is gone
        code = None if process is None else process.exitcode
        pid = None if process is None else process.pid
        self.close()
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return WorkerDied(which=f"the loader's feeder process (pid {pid}, {how})")

    def _stop_epoch(self) -> None:
        """Stop the epoch in flight and take what the feeder still sends of it (freeing its
        slots), so that the next epoch starts clean; end the feeder if it does not stop."""
        conn = self._conn
        if conn is None:
            return
        try:
            conn.send(("stop", self._epoch))
            deadline = time.monotonic() + STOP_S
            while conn.poll(max(deadline - time.monotonic(), 0)):
                kind, epoch, _ = conn.recv()
                if epoch == self._epoch and kind != "batch":
                    return
        except (EOFError, OSError):
            pass
        self.close()


def _end(process: Any, conn: Connection) -> None:
    """Ask the feeder to leave, then make sure it has."""
    try:
        conn.send(None)
        conn.close()
    except OSError:
        pass
    process.join(1.0)
    if process.is_alive():
        process.kill()
        process.join(1.0)


def _serve(conn: Connection, produce: Produce, taken: Any, ahead: int, parent: int) -> None:
    """The feeder process: each epoch's batches read and sent in order; a stop ends the epoch
    early."""
    interrupts.worker_started(parent)
    units.read_for_another_process()
    # one intra-op thread, as DataLoader's workers: a thread pool inherited through fork may be
    # one the child cannot use (OpenMP's), and torch ops in it would wait for it forever
    torch.set_num_threads(1)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        if message[0] != "epoch":
            continue  # a stop that came after its epoch was over
        _, epoch, order, bounds = message
        run = _EpochRun(conn, order, bounds, taken, ahead)
        try:
            for batch in produce(run.indices()):
                conn.send(("batch", epoch, transfer.leave_worker(batch)))
                run.sent += 1
                if run.stopped:
                    break
            conn.send(("end", epoch, None))
        except (BrokenPipeError, ConnectionResetError):
            return
        except BaseException as exc:  # noqa: BLE001 - raised in the training process
            conn.send(("error", epoch, _sendable(exc)))


class _EpochRun:
    """One epoch in the feeder: its batches of indices handed to the pipeline no more than
    ``ahead`` before the loop's count of those it took, until the epoch ends or a stop comes."""

    def __init__(self, conn: Connection, order: np.ndarray, bounds: np.ndarray, taken: Any,
                 ahead: int) -> None:
        self.conn, self.order, self.bounds, self.taken, self.ahead = conn, order, bounds, taken, ahead
        self.sent = 0
        self.stopped = False

    def indices(self) -> Iterator[np.ndarray]:
        for k in range(len(self.bounds) - 1):
            while self.sent - self.taken[0] >= self.ahead and not self.conn.poll():
                time.sleep(IDLE_S)
            if self.conn.poll():  # only a stop arrives mid-epoch
                self.conn.recv()
                self.stopped = True
                return
            yield self.order[self.bounds[k]:self.bounds[k + 1]]


def _sendable(exc: BaseException) -> bytes:
    """``exc`` pickled, or a PackdataError carrying its text when it cannot be."""
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - any failure to round-trip
        return pickle.dumps(PackdataError(f"{type(exc).__name__}: {exc}"))


def _raised(data: bytes) -> BaseException:
    return pickle.loads(data)
