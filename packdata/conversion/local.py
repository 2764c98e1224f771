"""The record loop on this machine: inputs loaded in worker processes, in order, records appended
to the container's writer, the manifest written last, all under one atomic commit.

The output is built under a hidden partial name beside the destination and renamed into place
only once complete (:func:`packdata.atomic.committing`); any failure or interruption deletes it,
so nothing half-written ever opens as a dataset.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import pickle
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from packdata import atomic, interrupts
from packdata.checksum import record_checksum
from packdata.containers.base import ShardClosed, Writer
from packdata.containers.placement import Placement
from packdata.conversion import placing
from packdata.conversion.costs import Costs, WorkerClock
from packdata.conversion.job import ConvertResult, Job
from packdata.conversion.placing import Placed
from packdata.conversion.pool import WorkerPool
from packdata.conversion.rows import Hashed, Rows, handed_over, pack
from packdata.errors import PackdataError, SampleError, SkippedSample, WorkerDied
from packdata.manifest import Field, Manifest
from packdata.recordmeta import MetaSpool
from packdata.sources.base import (
    SHOWN,
    STOPS,
    Item,
    Loaded,
    Source,
    keys_of,
    reason_of,
    safe_load,
)
from packdata.units import available_cores

Progress = Callable[[int, int], None]


def write(job: Job, *, workers: int | None = None, progress: Progress | None = None,
          on_shard_closed: ShardClosed | None = None, costs: Costs | None = None
          ) -> ConvertResult:
    """Run ``job`` here: its inputs loaded by ``workers`` processes (default: the cores this
    process may use), its records written and committed at ``job.dst``. What it spends goes to
    ``costs`` (see :mod:`.costs`)."""
    start = time.perf_counter()
    costs = costs if costs is not None else Costs()
    blocks = job.source.blocks(job.items)
    workers = max(1, min(workers or available_cores(), len(blocks)))
    with atomic.committing(job.dst) as partial:
        records = _Records(job, partial.path, on_shard_closed, costs)
        loading = None
        try:
            done = 0
            loading = load_blocks(job.source, blocks, workers, costs=costs,
                                  places=records.place(workers))
            for block, loaded in loading:
                records.add_block(block, loaded)
                done += len(block)
                interrupts.check()  # an interrupt some finaliser swallowed
                if progress:
                    progress(done, len(job.items))
            with costs.phase("finish"):
                manifest = records.finish()
            committed = costs.mark()
        except BaseException as exc:
            if loading is not None:
                loading.close()  # its workers stopped now, not when the traceback is freed
            records.abort()
            if _is_write_error(exc):
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                reason = " ".join(str(reason).split())  # libhdf5's messages span lines
                raise PackdataError(f"{job.dst}: cannot write the output ({reason}); nothing was "
                                    "left behind") from None
            raise
    costs.since("commit", committed)
    return ConvertResult(job.dst, manifest, time.perf_counter() - start, partial.removed_stale,
                         costs)


class _Records:
    """Where loaded inputs go: checked against the fields of the first, appended to the writer
    (made for those fields), counted for the manifest; failed inputs per ``on_error``."""

    def __init__(self, job: Job, path: Path, on_shard_closed: ShardClosed | None,
                 costs: Costs) -> None:
        self.job, self.path, self.on_shard_closed = job, path, on_shard_closed
        self.costs = costs
        self.writer: Writer | None = None
        self.fields: dict[str, Field] = {}
        self.first: Item | None = None
        self.meta: MetaSpool | None = None  # made with the writer: files beside the output
        self.skipped: list[dict[str, str]] = []

    def place(self, workers: int) -> Callable[[list[Item]], placing.Placing | None] | None:
        """Where the writer lays the output out for the workers to write their records into
        (see :mod:`.placing`), each block's place; None where the records come here."""
        source, container = self.job.source, self.job.container
        if (workers <= 1 or not container.WRITER.PLACES_ROWS or source.OBSERVES
                or source.ISOLATE_LOADING):  # a probe here would be a crash here
            return None
        probed = placing.probe(self.job, self.costs)
        if probed is None:
            return None
        fields, first = probed
        if any(f.variable for f in fields.values()) and self.job.rows is None:
            return None
        if self._start(fields, first, place=True) is None:
            return None
        return placing.slots(self.job, self.writer)  # type: ignore[arg-type]

    def add_block(self, block: list[Item], loaded: Rows | Hashed | list[Loaded] | Placed
                  ) -> None:
        """What the items of ``block`` loaded: written in place by a worker (only the
        checksums came), rows checked in the worker (see :mod:`.rows`) stored as one table
        where they are records of this conversion's fields; anything else item by item."""
        if isinstance(loaded, Placed):
            with self.costs.phase("writing"):
                self.writer.placed(loaded.slot)  # type: ignore[union-attr]
            with self.costs.phase("metadata"):
                self.meta.append_packed(*loaded.keys, loaded.checksums)  # type: ignore[union-attr]
            return
        if isinstance(loaded, Rows):
            if self.writer is None:
                self._start(loaded.fields, block[0])
            if not loaded.fit(self.fields):  # let the record-by-record check name the input
                loaded = loaded.records()
            else:
                with self.costs.phase("metadata"):
                    keys = keys_of(block)
                with self.costs.phase("writing"):
                    self.writer.append_rows(keys, loaded.table)  # type: ignore[union-attr]
                with self.costs.phase("metadata"):
                    self.meta.append_block(keys, loaded.checksums)  # type: ignore[union-attr]
                if self.job.source.OBSERVES:
                    for record in loaded.records():
                        self.job.source.observe(record)
                return
        if isinstance(loaded, Hashed):  # hashed in the worker, over the fields of its first
            names, sums = loaded.names, loaded.checksums
            for item, one, checksums in zip(block, loaded.loaded, sums):
                self.add(item, one, checksums, names)
            return
        for item, one in zip(block, loaded):
            self.add(item, one)

    def _start(self, fields: dict[str, Field], first: Item, place: bool = False
               ) -> Placement | None:
        """The writer, made for ``fields`` (those of the first record, from ``first``), told
        the inputs and the rows the survey counted, or (``place``) laying the output out for
        the workers (its placement, or None where it cannot)."""
        self.fields, self.first = fields, first
        self.writer = self.job.container.WRITER(self.path, self.fields, self.job.options,
                                                self.on_shard_closed)
        # keys and checksums stream to files: memory stays flat in the record count
        self.meta = MetaSpool(self.path.with_name(f"{self.path.name}.records"))
        surveyed = self.job.rows or {}
        rows = {name: int(surveyed[name].sum()) for name, f in fields.items()
                if f.variable and name in surveyed}
        with self.costs.phase("writing"):
            if place:
                placement = self.writer.place(len(self.job.items), rows)
                if placement is not None:
                    return placement
            self.writer.expect(len(self.job.items), rows if self.writer.LAYS_OUT_ROWS else None)
        return None

    def add(self, item: Item, loaded: Loaded, checksums: list[int] | None = None,
            names: list[str] | None = None) -> None:
        """One item's records, checked against the conversion's fields; ``checksums`` (over
        fields ``names``, by a worker) are taken where those are the conversion's fields."""
        pairs = _pairs(item, loaded)  # one input may make several records (chunks)
        if self.writer is None and pairs and not isinstance(pairs, SampleError):
            self._start(self.job.source.fields(pairs[0][1]), item)
        if not isinstance(pairs, SampleError):
            pairs = self._checked(pairs, item)
        if isinstance(pairs, SampleError):
            if self.job.on_error == "fail" and not isinstance(pairs, SkippedSample):
                raise pairs
            self.skipped.append({"path": pairs.path, "reason": pairs.reason})
            return
        if checksums is None or names != list(self.fields):
            with self.costs.phase("hashing"):
                checksums = [record_checksum(record, self.fields) for _, record in pairs]
        for (key, record), checksum in zip(pairs, checksums):
            with self.costs.phase("writing"):
                self.writer.append(key, record)  # type: ignore[union-attr]
            if self.job.source.OBSERVES:
                self.job.source.observe(record)
            with self.costs.phase("metadata"):
                self.meta.append(key, checksum)  # type: ignore[union-attr]

    def _checked(self, pairs: list[tuple[str, dict]], item: Item) -> list | SampleError:
        """The pairs, or a SampleError naming the file when a record does not match the fields
        (set by the first input converted)."""
        source = self.job.source
        for _, record in pairs:
            for name, field in self.fields.items():
                if name not in record:
                    return SampleError(str(item.path), f"missing field '{name}'")
                try:
                    field.check(name, record[name])
                except ValueError as exc:
                    hint = f"; {source.shape_hint}" if source.shape_hint else ""
                    return SampleError(str(item.path), f"{exc} (records must match the first "
                                                       f"input, {self.first.path}{hint})")
        return pairs

    def finish(self) -> Manifest:
        """The manifest, stored by the writer: after this the output is complete."""
        if self.writer is None:
            first = self.skipped[0]
            raise PackdataError(
                f"no input could be converted ({len(self.skipped)} failed); first: "
                f"{first['path']}: {first['reason']}")
        source = self.job.source
        keys, checksums = self.meta.finish()  # type: ignore[union-attr]
        manifest = Manifest(
            container=self.job.container.NAME, kind=source.kind, fields=self.fields,
            count=len(keys), classes=source.classes, keys=keys,
            checksums=checksums, skipped=self.skipped, **source.describe(),
        )
        manifest.options.update(self.job.options)
        ignored = {why: {"count": len(names), "first": names[:SHOWN]}
                   for why, names in source.__dict__.get("ignored", {}).items() if names}
        if ignored:  # what the listing left out, so that it is never silent
            manifest.source["ignored"] = ignored
        changed = {why: {"count": count, "first": names}
                   for why, (count, names) in source.__dict__.get("noted", {}).items()}
        if changed:  # what converting inputs changed in their values (see Source.note)
            manifest.source["changed"] = changed
        self.writer.finish(manifest)
        self.meta.remove()  # type: ignore[union-attr]  # mapped: readable until dropped
        return manifest

    def abort(self) -> None:
        """Everything the writer and the spools hold closed and deleted, each step whatever the
        others raised (a full disk fails every flush): the writer first, whose open files
        (an HDF5 file and its objects) must be closed before anything frees them."""
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.abort()
        if self.meta is not None:
            with contextlib.suppress(Exception):
                self.meta.remove()


def _pairs(item: Item, loaded: Loaded) -> list[tuple[str, dict]] | SampleError:
    """What one item loaded as ``(key, record)`` pairs (or its error)."""
    if isinstance(loaded, (SampleError, list)):
        return loaded
    return [(item.key, loaded)]


def _is_write_error(exc: BaseException) -> bool:
    """An error of the output's storage (disk full, file too large, I/O error), rather than
    packdata's own or the user's: inputs' errors arrive as SampleErrors."""
    if isinstance(exc, PackdataError):
        return False
    return isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("lmdb", "h5py")


# -- loading inputs in worker processes ---------------------------------------------------------

# Worker-side state: the source is sent once per worker, not once per task.
_worker_source: Source | None = None


def _set_worker_source(source: Source) -> None:
    global _worker_source
    _worker_source = source


def load_blocks(source: Source, blocks: Iterable[list[Item]], workers: int, packed: bool = True,
                costs: Costs | None = None,
                places: Callable[[list[Item]], placing.Placing | None] | None = None
                ) -> Iterator[tuple[list[Item], Rows | Hashed | list[Loaded] | Placed]]:
    """Every block with what its items loaded, in order: :func:`.rows.pack`ed for writing, or
    each item's record (or its SampleError) with ``packed=False`` (``packdata verify --source``).
    At most ``2 × workers`` blocks in flight; a source that declares ``ISOLATE_LOADING`` loads
    in a worker process even with ``workers=1``, so a decoder that kills its process is an error
    naming the input, not the end of packdata. With ``costs``, the time spent waiting for and
    receiving each block (or, without workers, loading it here) is counted there. With
    ``places`` (workers only), each block's place in the output, asked as its task is made:
    the worker writes the block's records there where they fit it (:mod:`.placing`)."""
    costs = costs if costs is not None else Costs()
    # a daemonic process (a Dask worker) can start no child: it is the isolation itself, a
    # crash in it is a dead worker its engine names
    isolate = source.ISOLATE_LOADING and not mp.current_process().daemon
    if workers <= 1 and not isolate:
        for block in blocks:
            with costs.phase("load"):
                loaded = _load_block_with(source, block)
                loaded = pack(source, loaded) if packed else loaded
            yield block, loaded
        return
    workers = max(workers, 1)
    try:
        with WorkerPool(workers, _set_worker_source, (source,)) as pool:
            tasks = ((block, places(block) if places else None) for block in blocks)
            results = pool.ordered(functools.partial(_load_block, packed=packed), tasks,
                                   2 * workers)
            while True:
                with costs.phase("hand-over"):  # waiting for the block, and receiving it
                    task, (loaded, spent, notes) = next(results, (None, (None, None, None)))
                if task is None:
                    return
                block = task[0]
                costs.add_workers(spent)
                costs.count("handed_over", loaded.nbytes if isinstance(loaded, Placed)
                            else handed_over(loaded))
                source.add_notes(notes)  # the worker's counts, gathered where conversion runs
                yield block, loaded
    except WorkerDied as died:  # the culprit is in this block or one queued after it
        raise PackdataError("a conversion worker stopped unexpectedly (killed, out of memory, or "
                            f"crashed in a decoder) while loading inputs from {died.task[0][0].path} "
                            "on") from None


def _load_block(task: tuple[list[Item], placing.Placing | None], packed: bool = True
                ) -> tuple[Rows | Hashed | list[Loaded] | Placed, dict[str, float],
                           dict[str, tuple[int, list[str]]]]:
    """The worker's task: the block loaded and, for writing, packed (the rows' checks and
    checksums are computed here, in parallel, not in the process that writes), and written in
    its place where it travels with one, with the CPU seconds each phase took
    (:class:`.costs.WorkerClock`) and the notes the source took while loading it
    (:meth:`Source.take_notes`). What it raises
    travels back pickled: an error that cannot be (a library's own exception class) is replaced
    by a PackdataError keeping its type and message, and nothing is chained to it (where
    exceptions pickle their chain, as with tblib's support installed, a chained library
    exception would not pickle either)."""
    clock = WorkerClock()
    items, place = task
    try:
        with clock.phase("load"):
            loaded = _load_block_with(_worker_source, items)  # type: ignore[arg-type]
        if packed:
            with clock.phase("pack"):
                loaded = pack(_worker_source, loaded, clock)  # type: ignore[arg-type]
        if place is not None:
            loaded = placing.put(items, loaded, place, clock)
        return loaded, clock.spent, _worker_source.take_notes()  # type: ignore[union-attr]
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


__all__ = ["load_blocks", "write"]
