"""Conversion into parts: each task converts a contiguous slice of the sorted inputs into a
complete dataset of its own (a part), and one manifest binds the parts into a sharded dataset.

Parts are built in a hidden ``.NAME.parts`` directory beside the destination, each committed by
its own atomic rename, with the plan (every option that decides the records) in ``plan.json``.
The dataset manifest is written last and the directory renamed into place only when every part
is there. An interrupted conversion leaves the hidden directory (never a dataset); rerunning
with ``resume=True`` keeps its finished parts and redoes the rest, after checking the plan.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packdata import engines
from packdata.containers import sharded
from packdata.errors import PackdataError
from packdata.manifest import Manifest
from packdata.sources.base import Item, Source

PLAN = "plan.json"
#: most records per part when not asked otherwise: parts enough to spread the work, each big
#: enough that a task's fixed cost (scheduling, opening a writer) stays small against its work
DEFAULT_PART_SIZE = 100_000


class SliceSource:
    """A source restricted to some of its items (everything else is the whole source's)."""

    def __init__(self, inner: Source, items: list[Item]) -> None:
        self.inner, self._items = inner, items

    def items(self) -> list[Item]:
        return self._items

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "_items"):  # not yet set (unpickling): never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)


@dataclass
class PartTask:
    """One task: convert ``items`` of ``source`` into the part at ``path``."""

    source: Source
    items: list[Item]
    path: Path
    container: str
    options: dict[str, Any]
    on_error: str


def convert_part(task: PartTask) -> str:
    """Convert one part (in a worker); return its manifest as JSON."""
    from packdata.convert import convert

    # a private copy: sources gather per-record facts in observe(), which must be this part's
    source = copy.deepcopy(task.source)
    result = convert(SliceSource(source, task.items), task.path,  # type: ignore[arg-type]
                     container=task.container, container_options=task.options, workers=1,
                     on_error=task.on_error, overwrite=True)
    return result.manifest.to_json()


def work_dir(dst: Path) -> Path:
    return dst.parent / f".{dst.name}.parts"


def make_plan(source: Source, items: list[Item], container: str, options: dict[str, Any],
              part_size: int, on_error: str) -> dict[str, Any]:
    """Everything that decides which records each part holds, as plain JSON."""
    described = source.describe()
    keys = "\n".join(item.key for item in items).encode()
    plan = {"container": container, "container_options": options, "part_size": part_size,
            "on_error": on_error, "kind": source.kind, "inputs": len(items),
            "inputs_crc32": zlib.crc32(keys), "source": described.get("source", {}),
            "options": described.get("options", {})}
    return json.loads(json.dumps(plan, default=str))


def _check_plan(old: dict[str, Any], new: dict[str, Any], where: Path) -> None:
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


def convert_parts(
    source: Source,
    dst: Path,
    *,
    container: str | None,
    container_options: dict[str, Any] | None,
    workers: int | None,
    on_error: str,
    overwrite: bool,
    progress: Any,
    engine: str,
    client: Any,
    scheduler: str | None,
    part_size: int | None,
    resume: bool,
) -> Any:
    """:func:`packdata.convert` into a sharded dataset (see the module docstring)."""
    from packdata.convert import (
        ConvertResult,
        _plan,
        _remove,
        _TermAsInterrupt,
    )

    start = time.perf_counter()
    module, dst, options, items = _plan(source, dst, container, container_options, overwrite)
    if part_size is not None and part_size < 1:
        raise PackdataError(f"part size {part_size}: expected at least 1 record per part")
    work = work_dir(dst)
    if (client is not None or scheduler) and workers is None:  # the cluster's size, not ours
        workers = engines.cluster_threads(client, scheduler)
    size = part_size or _default_part_size(len(items), workers)
    if resume and part_size is None and (work / PLAN).is_file():
        size = json.loads((work / PLAN).read_text()).get("part_size", size)
    plan = make_plan(source, items, module.NAME, options, size, on_error)
    if resume and (work / PLAN).is_file():
        _check_plan(json.loads((work / PLAN).read_text()), plan, work)
    else:
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        (work / PLAN).write_text(json.dumps(plan))

    slices = [items[a : a + size] for a in range(0, len(items), size)]
    paths = [work / sharded.part_name(module.NAME, n) for n in range(len(slices))]
    manifests: dict[int, Manifest] = {}
    for n, path in enumerate(paths):  # parts finished before an interruption (atomic renames)
        if resume and path.exists() and module.READER.detect(path):
            reader = module.READER(path)
            manifests[n] = reader.manifest
            reader.close()
        elif path.exists():  # what is left of a part half deleted while joining: ours to redo
            _remove(path)
    todo = [n for n in range(len(slices)) if n not in manifests]
    tasks = [PartTask(source, slices[n], paths[n], module.NAME, options, on_error) for n in todo]
    done = sum(len(slices[n]) for n in manifests)
    with _TermAsInterrupt():  # `kill` stops the workers as Ctrl-C does
        for number, text in engines.run(convert_part, tasks, engine=engine, workers=workers,
                                        client=client, scheduler=scheduler):
            n = todo[number]
            manifests[n] = Manifest.from_json(text, str(paths[n]))
            done += len(slices[n])
            if progress:
                progress(done, len(items))
    for path in paths:  # every part must be where this machine can see it before binding them
        if not module.READER.detect(path):
            raise PackdataError(f"{path}: a task reported this part written, but it is not here; "
                                "on a cluster the destination must be on a file system every "
                                "worker shares, at the same path")

    manifest = _merge(source, [manifests[n] for n in range(len(slices))], paths, module.NAME, size)
    if module.NAME == "tar":  # tar parts join into one plain tar dataset (webdataset, DALI, S3)
        manifest = _join_tar(work, paths, manifest, options)
    (work / PLAN).unlink()
    (work / sharded.MANIFEST).write_text(manifest.to_json())  # last: now it is a dataset
    if dst.exists():
        _remove(dst)
    os.replace(work, dst)
    return ConvertResult(dst, manifest, time.perf_counter() - start)


def _join_tar(work: Path, paths: list[Path], manifest: Manifest,
              options: dict[str, Any]) -> Manifest:
    """Tar parts moved into one tar dataset: their shards renumbered into one sequence and their
    record indexes joined (shard numbers offset), so the result is an ordinary tar dataset."""
    import numpy as np

    from packdata.containers import tar
    from packdata.reader_index import idx_path, write_wids_index

    pattern = {**tar.TarWriter.OPTIONS, **options}["pattern"]
    shards: list[dict[str, Any]] = []
    columns: dict[str, list[np.ndarray]] = {}
    for path in paths:
        part = Manifest.from_json((path / tar.MANIFEST).read_text(), str(path))
        with np.load(path / tar.INDEX, allow_pickle=False) as index:
            for key in index.files:
                column = index[key] + len(shards) if key.endswith(".shard") else index[key]
                columns.setdefault(key, []).append(column)
        for shard in part.extra["shards"]:
            name = pattern % len(shards)
            _link(path / shard["name"], work / name)
            if idx_path(path, shard["name"]).is_file():  # offsets within the shard: still valid
                _link(idx_path(path, shard["name"]), idx_path(work, name))
            shards.append({"name": name, "count": shard["count"]})
    np.savez(work / tar.INDEX, **{k: np.concatenate(v) for k, v in columns.items()})
    write_wids_index(work, shards)
    for path in paths:  # manifests first: a part half deleted is no longer taken as finished
        (path / tar.MANIFEST).unlink()
    for path in paths:
        shutil.rmtree(path)
    manifest.container = "tar"
    manifest.options = {k: v for k, v in manifest.options.items() if k != "part_container"}
    manifest.extra = {k: v for k, v in manifest.extra.items() if k != "parts"}
    manifest.extra["shards"] = shards
    return manifest


def _link(src: Path, dst: Path) -> None:
    """``src`` also at ``dst``: a hard link, not a move, so that killed halfway the parts are
    still whole for --resume."""
    link = dst.parent / f".{dst.name}.link"
    link.unlink(missing_ok=True)
    os.link(src, link)
    os.replace(link, dst)


def _default_part_size(count: int, workers: int | None) -> int:
    """About two parts per worker (so a slow one does not hold up the end for long; more cost
    a scheduling round trip each), at most DEFAULT_PART_SIZE records each."""
    return max(1, min(DEFAULT_PART_SIZE, math.ceil(count / (2 * (workers or os.cpu_count() or 1)))))


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
    options = {**first.options, "part_container": container, "part_size": part_size}
    return Manifest(
        container=sharded.NAME, kind=first.kind, fields=first.fields,
        count=sum(m.count for m in parts), classes=source.classes,
        source=first.source, options=options,
        keys=[k for m in parts for k in m.keys],
        checksums=[c for m in parts for c in m.checksums],
        skipped=[s for m in parts for s in m.skipped], extra=extra,
    )
