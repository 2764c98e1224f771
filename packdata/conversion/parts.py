"""Conversion into parts: each task converts a contiguous slice of the sorted inputs into a
complete dataset of its own (a part), and one manifest binds the parts into a sharded dataset.

Parts are built in a hidden ``.NAME.parts`` directory beside the destination, each committed by
its own atomic rename, with the recipe (every option that decides the records) in ``recipe.json``.
The dataset manifest is written last and the directory renamed into place only when every part
is there. An interrupted conversion leaves the hidden directory (never a dataset); rerunning
with ``resume=True`` keeps its finished parts and redoes the rest, after checking the recipe.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import shutil
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packdata import atomic, containers
from packdata.containers import sharded
from packdata.conversion import engines, local
from packdata.conversion.job import ConvertResult, Destination, Job
from packdata.errors import PackdataError
from packdata.interrupts import term_as_interrupt
from packdata.manifest import Manifest
from packdata.recordmeta import Keys, MetaSpool, map_npz
from packdata.sources.base import SHOWN, Source, keys_of
from packdata.spooling import ColumnSpool, copy_blocks, save_npz
from packdata.units import available_cores

RECIPE = "recipe.json"
#: most records per part when not asked otherwise: parts enough to spread the work, each big
#: enough that a task's fixed cost (scheduling, opening a writer) stays small against its work
DEFAULT_PART_SIZE = 100_000


def convert_part(part: Job) -> str:
    """Convert one part (a task, run in a worker); return its manifest as JSON."""
    # a private copy: sources gather per-record facts in observe(), which must be this part's
    part = dataclasses.replace(part, source=copy.deepcopy(part.source))
    return local.write(part, workers=1).manifest.to_json()


def work_dir(dst: Path) -> Path:
    return dst.parent / f".{dst.name}.parts"


def make_recipe(job: Job, part_size: int) -> dict[str, Any]:
    """Everything that decides which records each part holds, as plain JSON."""
    described = job.source.describe()
    recipe = {"container": job.container.NAME, "container_options": job.options,
              "part_size": part_size, "on_error": job.on_error, "kind": job.source.kind,
              "inputs": len(job.items), "inputs_crc32": _keys_crc32(job),
              "source": described.get("source", {}), "options": described.get("options", {})}
    return json.loads(json.dumps(recipe, default=str))


def _keys_crc32(job: Job, block: int = 1 << 16) -> int:
    """The CRC-32 of every input's key, newline-separated, computed block by block (the keys of
    millions of inputs are never one string)."""
    crc, items = 0, job.items
    for a in range(0, len(items), block):
        text = "\n".join(keys_of(items[a : a + block]))
        crc = zlib.crc32((text if a == 0 else "\n" + text).encode(), crc)
    return crc


def _check_recipe(old: dict[str, Any], new: dict[str, Any], where: Path) -> None:
    """Refuse to resume into parts made with other options, naming the first that differs."""
    for key in new:
        a, b = old.get(key), new[key]
        if isinstance(a, dict) and isinstance(b, dict):
            diff = next((k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)), None)
            if diff is not None:
                key, a, b = f"{key}.{diff}", a.get(diff), b.get(diff)
            else:
                continue
        if a != b:
            raise PackdataError(
                f"--resume: the unfinished conversion in {where} was made with {key}={a!r}, this "
                f"run asks {key}={b!r}; rerun with the same options, or without --resume to "
                "start over")


@dataclass
class Parts:
    """How to convert in parts: where the tasks run (``engine``: "local" or "dask"; a Dask
    ``client`` or ``scheduler`` address), records per part, and whether to keep the finished
    parts of an interrupted run (``resume``)."""

    engine: str = "local"
    client: Any = None
    scheduler: str | None = None
    part_size: int | None = None
    resume: bool = False

    @classmethod
    def asked(cls, engine: str | None, client: Any, scheduler: str | None,
              part_size: int | None, resume: bool) -> Parts | None:
        """The parts asked for, or None for a conversion in one piece."""
        if not (engine or client is not None or scheduler or part_size or resume):
            return None
        return cls(engine or "local", client, scheduler, part_size, resume)

    def flag(self) -> str:
        """The option that asked for parts, as the command line spells it."""
        if self.resume:
            return "--resume"
        if self.part_size:
            return "--part-size"
        return "--scheduler" if self.scheduler or self.client is not None else "--engine"

    def check_destination(self, target: Destination, dst: str | Path) -> None:
        """Before any input is listed. A destination named like one dataset of a container
        (``out.h5``, ``out.lmdb``) is that: parts of HDF5 or LMDB make a folder of parts (a
        sharded dataset; tar parts join into an ordinary tar dataset), so refuse, saying what
        to ask for. Object storage takes no ``--resume`` (the finished parts are kept beside a
        local destination)."""
        if target.url is not None:
            if self.resume:
                raise PackdataError(f"{dst}: --resume needs a local destination (the finished "
                                    "parts are kept beside it); convert to a local path, then "
                                    "upload")
            return
        path = Path(dst)
        if target.container == "tar" or path.suffix.lower() not in {
                s for name in containers.CONTAINERS for s in containers.get(name).SUFFIXES}:
            return
        flag, name = self.flag(), target.container
        why = (" (an interrupted conversion into one file leaves no parts to resume)"
               if flag == "--resume" else "")
        raise PackdataError(
            f"{dst}: {flag} converts in parts, which writes a folder of {name} parts (a "
            f"sharded dataset), not one {name} dataset; for parts, name a folder and the "
            f"parts' format ({path.with_suffix('')}/ --format {name}), or leave out "
            f"{flag} to write {path.name}{why}")


def write(job: Job, parts: Parts, *, workers: int | None = None, progress: Any = None
          ) -> ConvertResult:
    """Run ``job`` in parts into a sharded dataset (see the module docstring)."""
    start = time.perf_counter()
    if parts.part_size is not None and parts.part_size < 1:
        raise PackdataError(f"part size {parts.part_size}: expected at least 1 record per part")
    if (parts.client is not None or parts.scheduler) and workers is None:  # the cluster's size
        workers = engines.cluster_threads(parts.client, parts.scheduler)
    work = work_dir(job.dst)
    size = _settle_work_dir(job, work, parts, workers)
    slices = [job.items[a : a + size] for a in range(0, len(job.items), size)]
    paths = [work / sharded.part_name(job.container.NAME, n) for n in range(len(slices))]
    manifests = _finished_parts(job, paths, parts.resume)
    todo = [n for n in range(len(slices)) if n not in manifests]
    tasks = [job.part(slices[n], n * size, paths[n]) for n in todo]
    done = sum(len(slices[n]) for n in manifests)
    with term_as_interrupt():  # `kill` stops the workers as Ctrl-C does
        for number, text in engines.run(convert_part, tasks, engine=parts.engine,
                                        workers=workers, client=parts.client,
                                        scheduler=parts.scheduler):
            n = todo[number]
            manifests[n] = Manifest.from_json(text, str(paths[n]))
            done += len(slices[n])
            if progress:
                progress(done, len(job.items))
    for path in paths:  # every part must be where this machine can see it before binding them
        if not job.container.detect(path):
            raise PackdataError(f"{path}: a task reported this part written, but it is not here; "
                                "on a cluster the destination must be on a file system every "
                                "worker shares, at the same path")
    manifest = _merge(job.source, [manifests[n] for n in range(len(slices))], paths,
                      job.container.NAME, size)
    if job.container.NAME == "tar":  # tar parts join into one plain tar dataset
        manifest = _join_tar(work, paths, manifest, job.options)
    else:
        save_npz(work / sharded.RECORDS, manifest.record_arrays())
    (work / RECIPE).unlink()
    (work / sharded.MANIFEST).write_text(manifest.to_json())  # last: now it is a dataset
    atomic.publish(work, job.dst)
    return ConvertResult(job.dst, manifest, time.perf_counter() - start)


def _settle_work_dir(job: Job, work: Path, parts: Parts, workers: int | None) -> int:
    """The records per part; the work folder made afresh, or (``resume``) kept after checking
    that its recipe is this conversion's."""
    recipe_path = work / RECIPE
    resuming = parts.resume and recipe_path.is_file()
    old = json.loads(recipe_path.read_text()) if resuming else None
    size = parts.part_size or _default_part_size(len(job.items), workers)
    if old is not None and parts.part_size is None:
        size = old.get("part_size", size)
    recipe = make_recipe(job, size)
    if old is not None:
        _check_recipe(old, recipe, work)
    else:
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        recipe_path.write_text(json.dumps(recipe))
    return size


def _finished_parts(job: Job, paths: list[Path], resume: bool) -> dict[int, Manifest]:
    """The manifests of parts an interrupted run finished (atomic renames), by number; what is
    left of a part half deleted while joining is removed (ours to redo)."""
    manifests: dict[int, Manifest] = {}
    for n, path in enumerate(paths):
        if resume and path.exists() and job.container.detect(path):
            reader = job.container.READER(path)
            manifests[n] = reader.manifest
            reader.close()
        elif path.exists():
            atomic.remove(path)
    return manifests


def _join_tar(work: Path, paths: list[Path], manifest: Manifest,
              options: dict[str, Any]) -> Manifest:
    """Tar parts moved into one tar dataset: their shards renumbered into one sequence and their
    record indexes joined (shard numbers offset), so the result is an ordinary tar dataset."""
    from packdata.containers import tar
    from packdata.containers.base import map_file
    from packdata.containers.tar.indexes import idx_path, write_wids_index
    from packdata.containers.tar.layout import RECORDS

    pattern = options.get("pattern") or next(o.default for o in tar.WRITER.OPTIONS
                                              if o.name == "pattern")
    shards: list[dict[str, Any]] = []
    # each index column, appended part by part (a killed earlier join's are started afresh)
    spools: dict[str, ColumnSpool] = {}
    for path in paths:
        part = Manifest.from_json((path / tar.MANIFEST).read_text(), str(path))
        index = map_npz(path / tar.INDEX, map_file(path / tar.INDEX))  # mapped, not loaded
        for key, column in index.items():
            if key.startswith(RECORDS):  # the parts' own: the joined ones are written below
                continue
            if key not in spools:  # rows of the column's shape: K variant checksums a record
                spools[key] = ColumnSpool(work / f".{key}.spool", column.dtype, column.shape[1:])
            for block in copy_blocks(column):
                spools[key].extend(block + len(shards) if key.endswith(".shard") else block)
        del index
        for shard in part.extra["shards"]:
            name = pattern % len(shards)
            # hard links, not moves: killed halfway, the parts are still whole for --resume
            atomic.link_file(path / shard["name"], work / name)
            if idx_path(path, shard["name"]).is_file():  # offsets within the shard: still valid
                atomic.link_file(idx_path(path, shard["name"]), idx_path(work, name))
            shards.append({"name": name, **{k: v for k, v in shard.items() if k != "name"}})
    manifest.container = "tar"
    manifest.options = {k: v for k, v in manifest.options.items() if k != "part_container"}
    manifest.extra = {k: v for k, v in manifest.extra.items() if k != "parts"}
    manifest.extra["shards"] = shards
    # after the manifest's last change: the arrays hold its JSON's checksum
    columns = {k: spool.finish() for k, spool in spools.items()}
    records = {f"{RECORDS}.{k}": v for k, v in manifest.record_arrays(
        [columns[k] for k in sorted(columns)]).items()}  # in the order the reader lists them
    save_npz(work / tar.INDEX, {**columns, **records})
    for spool in spools.values():
        spool.remove()
    write_wids_index(work, shards)
    for path in paths:  # manifests first: a part half deleted is no longer taken as finished
        (path / tar.MANIFEST).unlink()
    for path in paths:
        shutil.rmtree(path)
    return manifest


def _default_part_size(count: int, workers: int | None) -> int:
    """About two parts per worker (so a slow one does not hold up the end for long; more cost
    a scheduling round trip each), at most DEFAULT_PART_SIZE records each."""
    return max(1, min(DEFAULT_PART_SIZE, math.ceil(count / (2 * (workers or available_cores())))))


def _merge(source: Source, parts: list[Manifest], paths: list[Path], container: str,
           part_size: int) -> Manifest:
    """The sharded dataset's manifest from its parts' manifests, in order."""
    first = parts[0]
    for manifest, path in zip(parts, paths):
        if manifest.fields != first.fields:
            raise PackdataError(f"{path}: records have fields {manifest.fields}, but those of "
                                f"{paths[0]} have {first.fields}; inputs must match")
    extra: dict[str, Any] = {}
    for manifest in parts:  # per-record facts gathered by sources: lists concatenate, counts add
        for key, value in manifest.extra.items():
            if key == "shards":
                continue
            if isinstance(value, list):
                extra[key] = extra.get(key, []) + value
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                extra[key] = extra.get(key, 0) + value
            else:
                extra.setdefault(key, value)
    extra["parts"] = [{"name": p.name, "count": m.count} for p, m in zip(paths, parts)]
    changed: dict[str, dict[str, Any]] = {}  # each part's counts of changed inputs, added
    for manifest in parts:
        for why, said in manifest.source.get("changed", {}).items():
            had = changed.setdefault(why, {"count": 0, "first": []})
            had["count"] += said["count"]
            had["first"] = (had["first"] + said["first"])[:SHOWN]
    described = {**first.source, **({"changed": changed} if changed else {})}
    options = {**first.options, "part_container": container, "part_size": part_size}
    keys, checksums = _joined_records(paths, containers.get(container))
    return Manifest(
        container=sharded.NAME, kind=first.kind, fields=first.fields,
        count=sum(m.count for m in parts), classes=source.classes,
        source=described, options=options, keys=keys, checksums=checksums,
        skipped=[s for m in parts for s in m.skipped], extra=extra,
    )


def _joined_records(paths: list[Path], container: Any) -> tuple[Keys, np.ndarray]:
    """The parts' keys and checksums, in order, streamed block by block from each part's own
    arrays into files in the work directory (never all in Python lists)."""
    spool = MetaSpool(paths[0].parent / "records")
    for path in paths:
        reader = container.READER(path)
        spool.extend(reader.manifest.keys, reader.manifest.checksums)
        reader.close()
    joined = spool.finish()
    spool.remove()  # mapped: readable until dropped
    return joined
