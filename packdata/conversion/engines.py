"""Where conversion tasks run: this machine's processes, or a Dask cluster.

An engine runs one function over a list of independent tasks and yields ``(task number,
result)`` as tasks finish. A task that fails on purpose (a :class:`PackdataError`, e.g. a bad
input under ``on_error="fail"``) returns its error rather than raising it, so that only real
failures (a worker killed, out of memory, a lost connection) are retried.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from packdata.conversion.pool import WorkerPool
from packdata.errors import PackdataError, WorkerDied, require
from packdata.units import available_cores

ENGINES = ("local", "dask")
#: how long to wait for a scheduler named by address before giving up
CONNECT_TIMEOUT_S = 5
#: reruns of a task whose worker died or that raised anything but a PackdataError
RETRIES = 2


class Failed:
    """What a task returns instead of raising a PackdataError (which no retry would fix)."""

    def __init__(self, error: PackdataError) -> None:
        self.error = error


def guarded(fn: Callable[[Any], Any], task: Any) -> Any:
    """``fn(task)``, with a PackdataError returned as :class:`Failed` instead of raised."""
    try:
        return fn(task)
    except PackdataError as exc:
        return Failed(exc)


def run(
    fn: Callable[[Any], Any],
    tasks: list[Any],
    *,
    engine: str = "local",
    workers: int | None = None,
    client: Any = None,
    scheduler: str | None = None,
) -> Iterator[tuple[int, Any]]:
    """Run ``fn`` over ``tasks``; yield ``(number, result)`` in order of completion.

    ``engine="dask"`` uses ``client`` (a ``distributed.Client``), else connects to
    ``scheduler`` (``tcp://host:port``), else starts a ``LocalCluster`` of ``workers`` processes
    (default: the cores this process may use) for the duration of the run.
    """
    if engine not in ENGINES:
        raise PackdataError(f"engine '{engine}': expected one of {', '.join(ENGINES)}")
    if engine == "dask" or client is not None or scheduler is not None:
        with dask_client(client, scheduler, workers) as dask:
            yield from _run_dask(dask, fn, tasks)
        return
    yield from _run_local(fn, tasks, max(1, min(workers or available_cores(), len(tasks))))


def _unwrap(number: int, result: Any) -> tuple[int, Any]:
    if isinstance(result, Failed):
        raise result.error
    return number, result


def _run_local(fn: Callable, tasks: list, workers: int) -> Iterator[tuple[int, Any]]:
    if workers <= 1:
        for number, task in enumerate(tasks):
            yield _unwrap(number, guarded(fn, task))
        return
    try:
        with WorkerPool(workers) as pool:
            for number, result in pool.as_completed(functools.partial(guarded, fn), tasks):
                yield _unwrap(number, result)
    except WorkerDied:
        raise PackdataError("a conversion worker stopped unexpectedly (killed, out of memory, or "
                            "crashed in a decoder); rerun with --resume to keep the finished "
                            "parts") from None


def cluster_threads(client: Any = None, scheduler: str | None = None) -> int | None:
    """How many tasks the cluster runs at once (its workers' threads, summed), asked of
    ``client`` or of the scheduler at ``scheduler``; None when no worker has joined yet."""
    with dask_client(client, scheduler) as dask:
        return sum(dask.nthreads().values()) or None


@contextlib.contextmanager
def dask_client(client: Any = None, scheduler: str | None = None, workers: int | None = None):
    """A ``distributed.Client``: the one given, one connected to ``scheduler``, or one on a
    fresh ``LocalCluster`` of ``workers`` single-threaded processes (closed on exit)."""
    if client is not None:
        yield client
        return
    distributed = require("distributed", "dask", "conversion on Dask")
    if scheduler is not None:
        try:
            connected = distributed.Client(scheduler, timeout=f"{CONNECT_TIMEOUT_S}s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise PackdataError(f"cannot reach the Dask scheduler at {scheduler} within "
                                f"{CONNECT_TIMEOUT_S} s ({exc.__class__.__name__}: {exc}); is it "
                                "running, and is the address tcp://HOST:PORT?") from None
        with connected:
            yield connected
        return
    dask = require("dask", "dask", "conversion on Dask")
    # the workers' sampling profiler takes the GIL every 10 ms: CPU a conversion can use; and
    # every task is known up front, so workers get their next one queued, without a round trip
    with dask.config.set({"distributed.worker.profile.enabled": False,
                          "distributed.scheduler.worker-saturation": float("inf")}), \
            _workers_ignore_sigint():
        # CRITICAL, not ERROR: a worker whose heartbeat meets the scheduler closing (a Ctrl-C)
        # logs an ERROR and a traceback; a task's failure reaches the user as packdata's error
        cluster = distributed.LocalCluster(
            n_workers=workers or available_cores(), threads_per_worker=1, processes=True,
            dashboard_address=":0", silence_logs=logging.CRITICAL,
        )
    with cluster, distributed.Client(cluster) as local:
        yield local


@contextlib.contextmanager
def _workers_ignore_sigint() -> Iterator[None]:
    """SIGINT ignored while the cluster starts its worker processes, which inherit that (an
    ignored signal stays ignored across exec; a handler does not): a terminal's Ctrl-C reaches
    the whole process group, and is this process's to handle (one line, the cluster closed),
    not a traceback from each worker. A Ctrl-C during those seconds is lost (no way to hold it
    back: a spawn resets the signal mask), so the next one stops the conversion."""
    if threading.current_thread() is not threading.main_thread():  # only it may set handlers
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_dask(client: Any, fn: Callable, tasks: list) -> Iterator[tuple[int, Any]]:
    distributed = require("distributed", "dask", "conversion on Dask")
    futures = [client.submit(guarded, fn, task, pure=False, retries=RETRIES) for task in tasks]
    number = {f.key: n for n, f in enumerate(futures)}
    try:
        for future in distributed.as_completed(futures):
            try:
                result = future.result()
            except distributed.client.FutureCancelledError:
                raise PackdataError("the Dask cluster cancelled a conversion task (did the "
                                    "scheduler restart?)") from None
            except Exception as exc:  # KilledWorker, or an error raised RETRIES + 1 times
                raise PackdataError(
                    f"conversion task {number[future.key]} failed {RETRIES + 1} times on the "
                    f"Dask cluster ({exc.__class__.__name__}: {exc}); rerun with --resume to "
                    "keep the finished parts") from None
            yield _unwrap(number[future.key], result)
    finally:
        client.cancel(futures)
