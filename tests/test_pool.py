"""WorkerPool: a worker's death is a WorkerDied naming the task in flight, wherever the pool
notices it (waiting for a result, or queuing the next task), never a raw BrokenProcessPool."""

from __future__ import annotations

import os
import signal
import time

import pytest

from packdata.conversion.pool import WorkerPool
from packdata.errors import WorkerDied


def _pid(_task):
    return os.getpid()


def _slow(task):
    time.sleep(30)
    return task


def _broken(pool: WorkerPool, pid: int) -> None:
    """Kill worker ``pid`` and wait until the pool knows it is broken."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not pool._pool._broken:
        assert time.monotonic() < deadline, "the pool never noticed its dead worker"
        time.sleep(0.01)


def test_death_noticed_while_queuing_names_the_task_in_flight():
    """The next task is queued after each result: a worker that died meanwhile (here while the
    tasks' iterator makes the next task) is blamed on the task it was running, not on the one
    being queued; the error comes before the first task's result is handed on."""
    with WorkerPool(1) as pool:
        pid = pool._pool.submit(_pid, None).result()

        def tasks():
            yield "first"
            yield "second"  # in flight when the worker dies
            _broken(pool, pid)
            yield "third"

        got = []
        with pytest.raises(WorkerDied) as info:
            for task, _ in pool.ordered(_slow_after_first, tasks(), window=2):
                got.append(task)
        assert got == [] and info.value.task == "second"


def _slow_after_first(task):
    return task if task == "first" else _slow(task)


@pytest.mark.parametrize("how", ["ordered", "as_completed"])
def test_a_pool_broken_before_queuing_is_worker_died(how):
    with WorkerPool(1) as pool:
        _broken(pool, pool._pool.submit(_pid, None).result())
        with pytest.raises(WorkerDied):
            if how == "ordered":
                list(pool.ordered(_pid, [1, 2], window=2))
            else:
                list(pool.as_completed(_pid, [1, 2]))


def test_an_interrupt_closes_the_pool_at_once_its_workers_killed():
    """Left by an exception (here Ctrl-C or SIGTERM while tasks run for 30 s), the pool kills
    its workers instead of letting their tasks finish: closed in well under a task's time."""
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt), WorkerPool(2) as pool:
        for n in range(2):
            pool._submit(_slow, n)
        time.sleep(0.5)  # both workers inside a task
        raise KeyboardInterrupt
    assert time.monotonic() - start < 10


def test_a_manager_thread_an_interrupt_left_unstarted_does_not_fail_the_close():
    """An interrupt that lands while the pool's first submit starts its manager thread leaves
    a thread that is not started yet (a join raises "cannot join thread before it is
    started", which once replaced the interrupt with a traceback): the close still ends."""
    import threading

    with WorkerPool(1) as pool:
        pool._submit(_pid, None).result()
        started = pool._pool._executor_manager_thread
        pool._pool._executor_manager_thread = threading.Thread(target=lambda: None)
        started.join(0)  # (the real one keeps running; it ends with the pool's workers)
    # left without an exception: the close joined what it could, without raising
