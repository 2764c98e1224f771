"""What every conversion settles before it writes a record: where it goes (a
:class:`Destination`: the container, the path really written and the writer's options, and the
URL for object storage), then the checked list of inputs (a :class:`Job`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from packdata import containers
from packdata.conversion.costs import Costs
from packdata.conversion.survey import survey
from packdata.errors import DatasetError, OutputExistsError, PackdataError, UnreadableDataset
from packdata.manifest import Manifest
from packdata.recordmeta import key_hashes
from packdata.sources.base import Item, Source, keys_of
from packdata.units import plural
from packdata.urls import is_url

ON_ERROR = ("fail", "skip")


@dataclass(frozen=True)
class Destination:
    """Where a conversion writes, settled once (:func:`destination`): the container's name, the
    path its writer fills and the writer's options; for object storage, ``url``, where the
    output is sent (its ``path`` then names the dataset there until
    :func:`packdata.conversion.upload.staged` points it at a local staging folder)."""

    container: str
    path: Path
    options: dict[str, Any]
    url: str | None = None


def destination(dst: str | Path, container: str | None,
                container_options: dict[str, Any] | None) -> Destination:
    """The :class:`Destination` of ``dst``: the container ``container``, or by ``dst``'s
    suffix; the path and options its ``destination`` makes of ``dst`` (tar's ``out.tar`` is the
    folder ``out`` with shards ``out-000000.tar``…), a URL's alike. Object storage takes tar
    shards only."""
    options = dict(container_options or {})
    if not is_url(dst):
        module = containers.for_destination(dst, container)
        path, options = module.destination(Path(dst), options)
        return Destination(module.NAME, path, options)
    scheme, _, where = str(dst).partition("://")
    module = containers.for_destination(Path(where), container)
    if module.NAME != "tar":
        raise PackdataError(f"{dst}: object storage takes tar shards (asked: {module.NAME}); "
                            "LMDB and HDF5 datasets are read through memory maps of local files, "
                            "so convert those to a local path")
    path, options = module.destination(Path(where), options)
    return Destination(module.NAME, path, options, url=f"{scheme}://{path.as_posix()}")


@dataclass
class Job:
    """One conversion, settled: ``source``'s ``items`` into ``container`` at ``dst``."""

    source: Source
    container_name: str  # a name, not the module: a Job travels to worker processes
    dst: Path
    options: dict[str, Any]  # the writer's
    items: Sequence[Item]  # a list, or a source's compact table (sources.lines.DocTable)
    on_error: str = "fail"
    #: each input's rows of each variable-length field, from the survey of their headers
    #: (:mod:`.survey`); None where the inputs did not tell
    rows: dict[str, np.ndarray] | None = None

    @property
    def container(self) -> ModuleType:
        """The container module (see :mod:`packdata.containers`)."""
        return containers.get(self.container_name)

    def part(self, items: Sequence[Item], start: int, dst: Path) -> Job:
        """The same conversion of ``items``, the inputs from ``start`` on, into another
        destination (a part)."""
        rows = None if self.rows is None else {
            name: counts[start : start + len(items)] for name, counts in self.rows.items()}
        return dataclasses.replace(self, items=items, dst=dst, rows=rows)


@dataclass
class ConvertResult:
    """What a conversion wrote: where, its manifest, and how long it took."""

    path: Path
    manifest: Manifest
    seconds: float
    #: partial outputs of killed earlier conversions to the same destination, removed by this one
    removed_stale: list[str] = dataclasses.field(default_factory=list)
    #: what the conversion spent, phase by phase and process by process (see :mod:`.costs`)
    costs: Costs = dataclasses.field(default_factory=Costs)

    @property
    def skipped(self) -> list[dict[str, str]]:
        return self.manifest.skipped

    def lines(self) -> list[str]:
        """What ``packdata convert`` says of it: stale outputs removed, what was written, each
        input skipped."""
        m = self.manifest
        said = [f"removed stale partial output of a killed conversion: {s}"
                for s in self.removed_stale]
        said.append(f"wrote {self.path}: {m.count} {m.kind} samples ({m.container}) in "
                    f"{self.seconds:.1f} s")
        if m.skipped:
            said += [f"skipped {plural(len(m.skipped), 'input')}:",
                     *(f"  {s['path']}: {s['reason']}" for s in m.skipped)]
        return said


def settle(source: Source, target: Destination, on_error: str, overwrite: bool,
           costs: Costs | None = None, workers: int | None = None) -> Job:
    """The :class:`Job` for converting ``source`` into ``target``: the inputs (at least one, no
    two with one key). A local destination is refused when it is a link, lies inside the
    source (or holds it), or exists (unless ``overwrite`` and it is a dataset); one staged for a
    URL is a fresh folder. The inputs' headers are surveyed by ``workers`` processes
    (:mod:`.survey`). Listing, checking keys and the survey are counted in ``costs``."""
    costs = costs if costs is not None else Costs()
    if on_error not in ON_ERROR:
        raise PackdataError(f"on_error '{on_error}': expected one of {', '.join(ON_ERROR)}")
    if target.url is None:
        _check_destination(target.path, source.root, overwrite)
    with costs.phase("listing"):
        items = source.items()
    if not items:
        raise PackdataError(f"{source.root}: no {source.kind} inputs found")
    if not source.unique_keys:
        with costs.phase("keys"):
            _check_unique_keys(items)
    rows = survey(source, items, workers, costs)
    return Job(source, target.container, target.path, target.options, items, on_error, rows)


#: keys made as strings at a time while hashing them (the rest of the check is 16 bytes a key)
KEY_BLOCK = 1 << 16


def _check_unique_keys(items: Sequence[Item]) -> None:
    """Samples are found by key (the file's path without suffix): two inputs may not share one.

    Keys are hashed a block at a time and the hashes sorted, so the check holds 16 bytes a key,
    not a dict of millions of strings; inputs whose hashes meet are compared by key."""
    n = len(items)
    hashes = np.empty(n, dtype=np.uint64)
    for a in range(0, n, KEY_BLOCK):
        block = [key.encode() for key in keys_of(items[a : a + KEY_BLOCK])]
        hashes[a : a + len(block)] = key_hashes(block)
    ordered = np.sort(hashes)
    met = ordered[1:][ordered[1:] == ordered[:-1]]
    if not len(met):
        return
    seen: dict[str, int] = {}  # only inputs whose hash another shares: duplicates, collisions
    for i in np.flatnonzero(np.isin(hashes, met)).tolist():  # in input order
        key = items[i].key
        other = seen.setdefault(key, i)
        if other != i:
            raise PackdataError(f"{items[other].path} and {items[i].path} would both be sample "
                                f"'{key}' (keys are paths without suffix); rename one")


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
    except UnreadableDataset:
        return  # a packdata dataset, damaged or incomplete: replaced as asked
    except DatasetError:
        raise OutputExistsError(
            f"{dst} exists and is not a packdata dataset; refusing to delete it even with "
            "--overwrite"
        ) from None
