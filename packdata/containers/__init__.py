"""Containers: the on-disk formats. One module each; this table is the only place that lists them.

A container module declares ``NAME``, ``SUFFIXES`` (recognised in a destination), ``NEW_SUFFIX``
(what a new dataset's name ends in: ``""`` for a folder of shards), ``WRITER`` and ``READER`` (see
:mod:`packdata.containers.base`), ``detect(path)`` (whether a complete dataset of it is there),
``damaged(path)`` (why a dataset of it, by its files, cannot be read: its manifest damaged or
missing; None if there is none) and ``destination(dst, options)`` (the path really written and
the writer options it implies, e.g. tar's ``out/cifar-%04d.tar``). Modules are imported only
when used, so a missing backend costs nothing until it is asked for.

Datasets are opened here too (:func:`open_reader`), at a path (the container whose ``detect``
finds it) or a URL (object storage holds one container's datasets, :data:`AT_URL`, whose module
declares ``open_url(url, storage)``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from packdata.errors import DatasetError, UnreadableDataset
from packdata.options import Option
from packdata.units import plural
from packdata.urls import is_url

if TYPE_CHECKING:
    from packdata.containers.base import Reader

CONTAINERS: dict[str, str] = {
    "lmdb": "packdata.containers.lmdb",
    "hdf5": "packdata.containers.hdf5",
    "tar": "packdata.containers.tar",
}
#: containers made of other containers' datasets: read, never chosen as a conversion target
COMPOSITE: dict[str, str] = {"sharded": "packdata.containers.sharded"}
#: the container of datasets at a URL: tar shards, read through a local cache of them or by
#: ranged requests (:mod:`packdata.remote.shards`)
AT_URL = "tar"


def get(name: str) -> ModuleType:
    """The container module registered as ``name``."""
    try:
        return importlib.import_module({**CONTAINERS, **COMPOSITE}[name])
    except KeyError:
        raise DatasetError(
            f"unknown container '{name}'; registered: {', '.join(CONTAINERS)}"
        ) from None


def writer_options() -> dict[str, list[tuple[str, Option]]]:
    """The writers' options that have a ``packdata convert`` flag, by name, each with the
    containers declaring it."""
    by_name: dict[str, list[tuple[str, Option]]] = {}
    for name in CONTAINERS:
        for option in get(name).WRITER.OPTIONS:
            if option.on_command_line:
                by_name.setdefault(option.name, []).append((name, option))
    return by_name


def for_destination(dst: str | Path, name: str | None = None) -> ModuleType:
    """The container to write ``dst`` with: ``name`` if given, else chosen by ``dst``'s suffix."""
    if name:
        return get(name)
    suffix = Path(dst).suffix.lower()
    for key in CONTAINERS:
        module = get(key)
        if suffix in module.SUFFIXES:
            return module
    if suffix == "":
        return get("tar")  # a plain directory holds tar shards
    known = sorted(s for key in CONTAINERS for s in get(key).SUFFIXES)
    raise DatasetError(
        f"{dst}: cannot tell the container from the suffix '{suffix}'; use one of "
        f"{', '.join(known)}, a directory (tar shards), or --format {'|'.join(CONTAINERS)}"
    )


def _missing_part(p: Path) -> str | None:
    """What a folder that is most of a tar dataset lacks (its manifest or record index), in a
    sentence; None when it is not one."""
    from packdata.containers.tar.layout import INDEX, MANIFEST
    from packdata.manifest import Manifest

    if not p.is_dir():
        return None
    shards = sum(1 for x in p.glob("*.tar"))
    manifest, index = p / MANIFEST, p / INDEX
    if manifest.is_file() and not index.is_file():
        try:
            made = Manifest.from_json(manifest.read_bytes(), str(p))
        except DatasetError:
            return None  # not packdata's manifest: not a packdata dataset
        if made.container != "tar":
            return None
        return (f"{p}: a packdata tar dataset without its record index {INDEX} (the manifest and "
                f"{plural(shards, 'shard')} are there); the dataset is incomplete: convert it "
                "again")
    if index.is_file() and not manifest.is_file():
        return (f"{p}: a packdata tar dataset without its {MANIFEST} ({INDEX} and "
                f"{plural(shards, 'shard')} are there; the manifest is written last, so the "
                "conversion or copy did not finish); the dataset is incomplete: convert or copy "
                "it again")
    return None


def open_reader(location: str | Path, storage: Any = None, container: str | None = None
                ) -> Reader:
    """A reader of the dataset at ``location``: a path, or a URL reached through ``storage``
    (a :class:`packdata.remote.storage.Storage`; by default the environment's credentials).
    ``container``: its container's name, where :func:`for_existing` found it already."""
    module = get(container) if container else for_existing(location)
    if is_url(location):
        return module.open_url(str(location).rstrip("/"), storage)
    return module.READER(Path(location))


def for_existing(path: str | Path) -> ModuleType:
    """The container that holds the dataset at ``path`` (a URL: :data:`AT_URL`'s)."""
    if is_url(path):
        return get(AT_URL)
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"{p}: no such file or directory")
    for key in (*CONTAINERS, *COMPOSITE):
        module = get(key)
        if module.detect(p):
            return module
    for key in CONTAINERS:  # packdata's files, which cannot be read
        why = get(key).damaged(p)
        if why:
            raise UnreadableDataset(why)
    missing = _missing_part(p)
    if missing:
        raise UnreadableDataset(missing)
    inside = next((d for d in p.parents[:2] if any(get(k).detect(d) for k in CONTAINERS)), None)
    if inside is not None:  # e.g. cifar.lmdb/data.mdb: the dataset is the folder
        raise DatasetError(f"{p}: a file inside the packdata dataset {inside}; open {inside}")
    found = "a directory holding " + ", ".join(sorted(x.name for x in p.iterdir())[:5]) \
        if p.is_dir() else f"a file of {p.stat().st_size} bytes"
    raise DatasetError(
        f"{p}: not a packdata dataset (found {found}); create one with `packdata convert`"
    )
