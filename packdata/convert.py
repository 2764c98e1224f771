"""Conversion: source → records (in parallel worker processes) → container, committed atomically.

The output is built under a hidden ``.NAME.partial-*`` path beside the destination and renamed into
place only once complete; any failure or interruption deletes it, so nothing half-written ever
opens as a dataset.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import itertools
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packdata import containers
from packdata.errors import (
    DatasetError,
    OutputExistsError,
    PackdataError,
    SampleError,
    SkippedSample,
)
from packdata.manifest import Manifest, record_checksum
from packdata.sources.base import BLOCK, SHOWN, STOPS, Item, Loaded, Source, reason_of, safe_load
from packdata.storage import Storage, is_url
from packdata.upload import convert_to_url

ON_ERROR = ("fail", "skip")
__all__ = ["BLOCK", "ConvertResult", "convert"]

Progress = Callable[[int, int], None]


@dataclass
class ConvertResult:
    path: Path
    manifest: Manifest
    seconds: float
    #: partial outputs of killed earlier conversions to the same destination, removed by this one
    removed_stale: list[str] = dataclasses.field(default_factory=list)

    @property
    def skipped(self) -> list[dict[str, str]]:
        return self.manifest.skipped


# Worker-side state: the source is sent once per worker, not once per task.
_worker_source: Source | None = None


def _init_worker(source: Source, parent: int) -> None:
    global _worker_source
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # undo the parent's handler inherited by fork
    _die_with_parent(parent)
    _worker_source = source


PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this worker when the converting process dies, however it dies
    (a SIGKILL leaves it no chance to stop its pool): Linux's parent-death signal."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _load_block(items: list[Item]) -> list[Loaded]:
    """The worker's task. What it raises travels back pickled: an error that cannot be (a
    library's own exception class) is replaced by a PackdataError keeping its type and message,
    and nothing is chained to it (where exceptions pickle their chain, as with tblib's support
    installed, a chained library exception would not pickle either)."""
    try:
        return _load_block_with(_worker_source, items)  # type: ignore[arg-type]
    except BaseException as exc:
        failure = exc
    failure.__context__ = failure.__cause__ = None
    try:
        pickle.loads(pickle.dumps(failure))
    except Exception:
        failure = PackdataError(f"{items[0].path}: {reason_of(failure)}")
    raise failure  # outside any handler: nothing chains to it


def _load_block_with(source: Source, items: list[Item]) -> list[Loaded]:
    try:
        return source.load_block(items)
    except (PackdataError, *STOPS):
        raise
    except BaseException:  # a batch call failed as a whole: find the culprit item by item
        return [safe_load(source, item) for item in items]


def _records(
    source: Source, blocks: list[list[Item]], workers: int
) -> Iterator[tuple[Item, Loaded]]:
    """Load items in order; at most ``2 × workers`` blocks are in flight, bounding memory.

    A worker that dies (killed, out of memory, a crash in a native decoder) or sends back what
    cannot be unpickled breaks the pool: that is an error naming the block, never a hang.
    """
    if workers <= 1:
        for block in blocks:
            yield from zip(block, _load_block_with(source, block))
        return
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"),
                               initializer=_init_worker, initargs=(source, os.getpid()))
    pending: deque = deque()
    todo = iter(blocks)
    block: list[Item] = []
    try:
        for block in itertools.islice(todo, 2 * workers):
            pending.append((block, pool.submit(_load_block, block)))
        while pending:
            block, future = pending.popleft()
            loaded = _result(pool, future)
            nxt = next(todo, None)
            if nxt is not None:
                pending.append((nxt, pool.submit(_load_block, nxt)))
            yield from zip(block, loaded)
    except BrokenProcessPool:  # the culprit is in this block or one queued after it
        raise PackdataError("a conversion worker stopped unexpectedly (killed, out of memory, or "
                            f"crashed in a decoder) while loading inputs from {block[0].path} "
                            "on") from None
    finally:
        # queued blocks are dropped, the ones being loaded finish: killing a worker instead
        # could cut a result off mid-send and leave the pool's reader thread (and so the
        # interpreter's exit) waiting for the rest forever
        pool.shutdown(wait=True, cancel_futures=True)


WORKER_DEATH_GRACE_S = 2.0  # how long the pool may take to notice a dead worker itself


def _result(pool: ProcessPoolExecutor, future) -> list[Loaded]:
    """``future.result()``, or BrokenProcessPool when a worker died and the pool did not notice.

    A worker killed while sending a result (the OOM killer, SIGKILL) leaves half a message in
    the result pipe and, holding the pipe's lock, blocks the other workers' sends: the pool's
    reader thread then waits forever for the rest. Seen here, the remaining workers are killed
    and the parent's copy of the pipe's write end is closed, so that reader gets end-of-file,
    marks the pool broken and lets shutdown finish."""
    died_at = None
    while True:
        try:
            return future.result(timeout=1.0)
        except TimeoutError:
            pass
        procs = list((getattr(pool, "_processes", None) or {}).values())
        if all(p.exitcode is None for p in procs):
            died_at = None
            continue
        died_at = died_at or time.monotonic()
        if time.monotonic() - died_at > WORKER_DEATH_GRACE_S:
            for p in procs:
                with contextlib.suppress(Exception):
                    p.kill()
            with contextlib.suppress(Exception):
                pool._result_queue._writer.close()  # type: ignore[attr-defined]
            raise BrokenProcessPool("a worker died and the pool did not notice")


def _plan(source: Source, dst: str | Path, container: str | None,
          container_options: dict[str, Any] | None, overwrite: bool
          ) -> tuple[Any, Path, dict[str, Any], list[Item]]:
    """What every conversion settles first: the container module, the real destination and its
    options, and the checked list of inputs."""
    dst = Path(dst)
    module = containers.for_destination(dst, container)
    options = dict(container_options or {})
    if hasattr(module, "destination"):  # e.g. tar: "out/cifar-%04d.tar" names the shards
        dst, options = module.destination(dst, options)
    _check_destination(dst, source.root, overwrite)
    items = source.items()
    if not items:
        raise PackdataError(f"{source.root}: no {source.kind} inputs found")
    _check_unique_keys(items)
    return module, dst, options, items


def _check_unique_keys(items: list[Item]) -> None:
    """Samples are found by key (the file's path without suffix): two inputs may not share one."""
    first: dict[str, Item] = {}
    for item in items:
        other = first.setdefault(item.key, item)
        if other is not item:
            raise PackdataError(f"{other.path} and {item.path} would both be sample "
                                f"'{item.key}' (keys are paths without suffix); rename one")


def _check_destination(dst: Path, src: Path, overwrite: bool) -> None:
    if dst.is_symlink():  # replacing it would replace the link, not what it points to
        raise PackdataError(f"{dst} is a symbolic link; give the path it points to")
    src_abs, dst_abs = src.resolve(), dst.resolve()
    if dst_abs == src_abs or src_abs in dst_abs.parents or dst_abs in src_abs.parents:
        raise PackdataError(f"{dst}: the output must lie outside the source {src} (and not hold it)")
    if not dst.exists():
        return
    if not overwrite:
        raise OutputExistsError(f"{dst} exists; pass --overwrite to replace it")
    try:
        containers.for_existing(dst)
    except DatasetError:
        raise OutputExistsError(
            f"{dst} exists and is not a packdata dataset; refusing to delete it even with "
            "--overwrite"
        ) from None


def _remove_stale_partials(dst: Path) -> list[str]:
    """Delete partial outputs for ``dst`` left by conversions that were killed (SIGKILL, power
    loss): their process id is in the name, and that process no longer exists. Returns what
    was removed."""
    removed = []
    for partial in dst.parent.glob(f".{glob.escape(dst.name)}.partial-*"):
        pid = partial.name.rsplit(".partial-", 1)[1].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            removed.append(str(partial))
            if partial.name.endswith(".spool"):
                partial.unlink(missing_ok=True)
            else:
                _remove(partial)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


class _TermAsInterrupt:
    """Turn SIGTERM into KeyboardInterrupt while converting, so `kill` also cleans up."""

    def __enter__(self) -> None:
        self.previous = None
        if mp.current_process().name == "MainProcess":
            with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
                self.previous = signal.signal(signal.SIGTERM, self._raise)

    @staticmethod
    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def convert(
    source: Source,
    dst: str | Path,
    *,
    container: str | None = None,
    container_options: dict[str, Any] | None = None,
    workers: int | None = None,
    on_error: str = "fail",
    overwrite: bool = False,
    progress: Progress | None = None,
    engine: str | None = None,
    client: Any = None,
    scheduler: str | None = None,
    part_size: int | None = None,
    resume: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> ConvertResult:
    """Convert ``source`` into a packed dataset at ``dst``.

    The container is ``container`` ("lmdb", "hdf5", "tar") or chosen by ``dst``'s suffix. A URL
    ``dst`` (``s3://bucket/ds``) receives tar shards, uploaded with the manifest last, reached
    with ``storage_options`` for fsspec.
    ``on_error="skip"`` skips inputs that fail to load and records them in the manifest;
    ``"fail"`` stops at the first, naming the file. ``workers`` defaults to the CPU count.

    Given ``engine`` ("local" or "dask"), a Dask ``client`` or ``scheduler`` address,
    ``part_size`` or ``resume``, the output is a sharded dataset converted part by part as
    independent tasks (see :mod:`packdata.partitioned`; ``resume`` keeps the parts an
    interrupted run finished).
    """
    if on_error not in ON_ERROR:
        raise PackdataError(f"on_error '{on_error}': expected one of {', '.join(ON_ERROR)}")
    partitioned = bool(engine or client is not None or scheduler or part_size or resume)
    if is_url(dst):  # object storage: built locally, then uploaded (see packdata.storage)
        return convert_to_url(
            str(dst), container, resume, lambda local: convert(
                source, local, container=container, container_options=container_options,
                workers=workers, on_error=on_error, progress=progress, engine=engine,
                client=client, scheduler=scheduler, part_size=part_size),
            Storage(storage_options or {}), overwrite)
    if partitioned:
        from packdata.partitioned import convert_parts

        return convert_parts(
            source, Path(dst), container=container, container_options=container_options,
            workers=workers, on_error=on_error, overwrite=overwrite, progress=progress,
            engine=engine or "local", client=client, scheduler=scheduler, part_size=part_size,
            resume=resume)
    start = time.perf_counter()
    module, dst, options, items = _plan(source, dst, container, container_options, overwrite)
    blocks = source.blocks(items)
    workers = max(1, min(workers or os.cpu_count() or 1, len(blocks)))

    dst.parent.mkdir(parents=True, exist_ok=True)
    stale = _remove_stale_partials(dst)
    tmp = dst.parent / f".{dst.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    writer = None
    keys: list[str] = []
    checksums: list[int] = []
    skipped: list[dict[str, str]] = []
    try:
        with _TermAsInterrupt():
            for done, (item, loaded) in enumerate(_records(source, blocks, workers), 1):
                pairs = _pairs(item, loaded)  # one input may make several records (chunks)
                if writer is None and pairs and not isinstance(pairs, SampleError):
                    fields, first = source.fields(pairs[0][1]), item
                    writer = module.WRITER(tmp, fields, options)
                if not isinstance(pairs, SampleError):
                    pairs = _checked(pairs, fields, item, source, first)
                if isinstance(pairs, SampleError):
                    if on_error == "fail" and not isinstance(pairs, SkippedSample):
                        raise pairs
                    skipped.append({"path": pairs.path, "reason": pairs.reason})
                    pairs = []
                for key, record in pairs:
                    writer.append(key, record)
                    source.observe(record)
                    keys.append(key)
                    checksums.append(record_checksum(record, fields))
                if progress:
                    progress(done, len(items))
            if writer is None:
                first = skipped[0]
                raise PackdataError(
                    f"no input could be converted ({len(skipped)} failed); first: "
                    f"{first['path']}: {first['reason']}"
                )
            manifest = Manifest(
                container=module.NAME, kind=source.kind, fields=fields, count=len(keys),
                classes=source.classes, keys=keys, checksums=checksums, skipped=skipped,
                **source.describe(),
            )
            manifest.options.update(options)
            ignored = {why: {"count": len(names), "first": names[:SHOWN]}
                       for why, names in getattr(source, "ignored", {}).items() if names}
            if ignored:  # what the listing left out, so that it is never silent
                manifest.source["ignored"] = ignored
            writer.finish(manifest)
            if dst.exists():
                _remove(dst)
            os.replace(tmp, dst)
    except BaseException as exc:
        if writer is not None:
            with contextlib.suppress(Exception):  # e.g. a full disk again while flushing
                writer.abort()
        _remove(tmp)
        for leftover in tmp.parent.glob(f"{glob.escape(tmp.name)}.*"):  # spools named after it
            _remove(leftover)
        if _is_write_error(exc):
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise PackdataError(f"{dst}: cannot write the output ({reason}); nothing was "
                                "left behind") from None
        raise
    return ConvertResult(dst, manifest, time.perf_counter() - start, stale)


def _is_write_error(exc: BaseException) -> bool:
    """An error of the output's storage (disk full, file too large, I/O error), rather than
    packdata's own or the user's: inputs' errors arrive as SampleErrors."""
    if isinstance(exc, PackdataError):
        return False
    return isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("lmdb", "h5py")


def _pairs(item: Item, loaded: Loaded) -> list[tuple[str, dict]] | SampleError:
    """What one item loaded as ``(key, record)`` pairs (or its error)."""
    if isinstance(loaded, (SampleError, list)):
        return loaded
    return [(item.key, loaded)]


def _checked(pairs, fields, item: Item, source: Source, first: Item):
    """The pairs, or a SampleError naming the file when a record does not match the fields (set
    by the ``first`` input converted)."""
    for _, record in pairs:
        for name, field in fields.items():
            if name not in record:
                return SampleError(str(item.path), f"missing field '{name}'")
            try:
                field.check(name, record[name])
            except ValueError as exc:
                hint = f"; {source.shape_hint}" if source.shape_hint else ""
                return SampleError(str(item.path), f"{exc} (records must match the first input, "
                                                   f"{first.path}{hint})")
    return pairs
