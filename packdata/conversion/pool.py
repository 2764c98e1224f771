"""The one process pool of conversion: forked workers that die with their parent, and a watchdog
that turns a worker killed mid-task into an error instead of a hang.

Both the local record loop (:mod:`.local`, blocks of inputs in order) and the local engine
(:mod:`.engines`, independent parts as they finish) run on it.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import multiprocessing as mp
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from packdata import interrupts
from packdata.errors import WorkerDied

#: how long the pool may take to notice a dead worker itself before the watchdog steps in
WORKER_DEATH_GRACE_S = 2.0
#: how often a wait for results looks at the workers
POLL_S = 1.0



def _start_worker(parent: int, initializer: Callable[..., None] | None, initargs: tuple) -> None:
    interrupts.worker_started(parent)
    if initializer is not None:
        initializer(*initargs)


class WorkerPool:
    """``workers`` forked processes. A worker that dies (killed, out of memory, a crash in a
    native decoder) makes every wait raise :class:`WorkerDied`, never hang. Closing lets the
    tasks being run finish and drops the queued ones."""

    def __init__(self, workers: int, initializer: Callable[..., None] | None = None,
                 initargs: tuple = ()) -> None:
        self._pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"),
                                         initializer=_start_worker,
                                         initargs=(os.getpid(), initializer, initargs))
        self._died_at: float | None = None
        self._forked = False

    def _submit(self, fn: Callable[[Any], Any], task: Any) -> Future:
        """``fn(task)`` queued. The pool forks its workers at its first submit: the parent's
        objects are frozen out of the garbage collector across it, so the workers' collections
        never write to them: each write to an inherited object copies its page into the worker,
        and a collection visits every object it tracks (tests/test_convert_memory.py)."""
        if self._forked:
            return self._pool.submit(fn, task)
        gc.freeze()
        try:
            return self._pool.submit(fn, task)
        finally:
            gc.unfreeze()
            self._forked = True

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: Any) -> None:
        self.close(kill=kind is not None)

    def close(self, kill: bool = False) -> None:
        """Stop the workers: queued tasks are dropped, the ones being run finish (killing a
        worker instead could cut a result off mid-send). Bounded: once a worker has died, the
        others get :data:`WORKER_DEATH_GRACE_S` and are then killed, since a worker killed while
        waiting for a task dies holding the task queue's lock, and the others then never read
        their stop signal. With ``kill`` (left by an exception: an interrupt, a failed input;
        no result is awaited any more), the workers are killed at once, so that a SIGTERM or
        Ctrl-C ends the conversion without waiting for the tasks being run."""
        procs = list((getattr(self._pool, "_processes", None) or {}).values())
        manager = getattr(self._pool, "_executor_manager_thread", None)
        results = getattr(self._pool, "_result_queue", None)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if kill:
            self._kill(procs, results)
        died_at = None
        while any(p.is_alive() for p in procs):
            if any(p.exitcode not in (None, 0) for p in procs):
                died_at = died_at or time.monotonic()
                if time.monotonic() - died_at > WORKER_DEATH_GRACE_S:
                    self._kill(procs, results)
                    break
            for p in procs:
                p.join(timeout=0.05)
        if manager is not None:  # it joins the workers and closes the queues; all gone now
            _join(manager, WORKER_DEATH_GRACE_S)
            if manager.is_alive():
                self._kill(procs, results)
                _join(manager, None)

    @staticmethod
    def _kill(procs: list, results: Any) -> None:
        """Kill the workers and close this process's write end of the result pipe, so that the
        pool's reader thread sees end-of-file instead of waiting for half a message."""
        for p in procs:
            with contextlib.suppress(Exception):
                p.kill()
        with contextlib.suppress(Exception):
            results._writer.close()

    def ordered(self, fn: Callable[[Any], Any], tasks: Iterator[Any] | list[Any],
                window: int) -> Iterator[tuple[Any, Any]]:
        """``(task, fn(task))`` in the order of ``tasks``, at most ``window`` in flight (memory
        stays bounded whatever the number of tasks)."""
        todo = iter(tasks)
        pending: deque[tuple[Any, Future]] = deque()
        for task in itertools.islice(todo, window):
            self._queue(pending, fn, task)
        while pending:
            task, future = pending.popleft()
            try:
                result = self._result(future)
            except BrokenProcessPool:
                raise WorkerDied(task) from None
            nxt = next(todo, None)
            if nxt is not None:
                self._queue(pending, fn, nxt)
            yield task, result

    def _queue(self, pending: deque[tuple[Any, Future]], fn: Callable[[Any], Any],
               task: Any) -> None:
        """``fn(task)`` queued behind ``pending``. A worker death noticed here is blamed on the
        earliest task in flight (none: on no task), not on the one being queued."""
        try:
            pending.append((task, self._submit(fn, task)))
        except BrokenProcessPool:
            raise WorkerDied(pending[0][0] if pending else None) from None

    def as_completed(self, fn: Callable[[Any], Any],
                     tasks: list[Any]) -> Iterator[tuple[int, Any]]:
        """``(number, fn(tasks[number]))`` as tasks finish."""
        try:
            running = {self._submit(fn, task): n for n, task in enumerate(tasks)}
        except BrokenProcessPool:  # a worker died while tasks were still being queued
            raise WorkerDied() from None
        while running:
            done, _ = wait(running, timeout=POLL_S, return_when=FIRST_COMPLETED)
            if not done:
                try:
                    self._watch()
                except BrokenProcessPool:
                    raise WorkerDied() from None
            for future in done:
                try:
                    result = future.result()
                except BrokenProcessPool:
                    raise WorkerDied() from None
                yield running.pop(future), result

    def _result(self, future: Future) -> Any:
        while True:
            try:
                return future.result(timeout=POLL_S)
            except TimeoutError:
                self._watch()

    def _watch(self) -> None:
        """Raise BrokenProcessPool when a worker died and the pool did not notice.

        A worker killed while sending a result (the OOM killer, SIGKILL) leaves half a message in
        the result pipe and, holding the pipe's lock, blocks the other workers' sends: the pool's
        reader thread then waits forever for the rest. Seen here, the remaining workers are
        killed and the parent's copy of the pipe's write end is closed, so that reader gets
        end-of-file, marks the pool broken and lets shutdown finish."""
        procs = list((getattr(self._pool, "_processes", None) or {}).values())
        if all(p.exitcode is None for p in procs):
            self._died_at = None
            return
        self._died_at = self._died_at or time.monotonic()
        if time.monotonic() - self._died_at > WORKER_DEATH_GRACE_S:
            self._kill(procs, getattr(self._pool, "_result_queue", None))
            raise BrokenProcessPool("a worker died and the pool did not notice")


def _join(thread: threading.Thread, timeout: float | None) -> None:
    """``thread.join(timeout)``, for the pool's manager thread: one an interrupt reached while
    the pool's first submit was starting it is given the moment it needs to be started (a
    join before that raises), and one never started is not waited for."""
    for _ in range(100):
        try:
            thread.join(timeout)
            return
        except RuntimeError:  # "cannot join thread before it is started"
            time.sleep(0.02)
