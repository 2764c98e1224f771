"""Sources: one module per input kind. This table is the only place that lists them.

A kind module declares, for conversion:

- ``KIND``, ``SUFFIXES`` (input files it recognises), ``OPTIONS`` (its conversion options,
  :class:`packdata.options.Option`) and ``SOURCE`` (a
  :class:`packdata.sources.base.Source` subclass taking ``root, **options``);

and for loading, ``select``: ``select(manifest, indices, epoch)`` → the
:data:`packdata.containers.base.Select` the container reads the batch with (one stored variant
per record), or None where a record is always read whole. The tensors a dataset of the kind
serves are made on the read side (:mod:`packdata.loading.samples`, one line per kind there):
nothing here imports torch, so that a conversion never loads it.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from packdata.errors import PackdataError
from packdata.options import Option
from packdata.remote.files import RemotePath
from packdata.sources.base import Source
from packdata.urls import is_url

KINDS: dict[str, str] = {
    "image": "packdata.sources.images",
    "text": "packdata.sources.text",
    "pointcloud": "packdata.sources.pointclouds",
}


def get(kind: str) -> ModuleType:
    """The module of sample kind ``kind``."""
    try:
        return importlib.import_module(KINDS[kind])
    except KeyError:
        raise PackdataError(f"unknown sample kind '{kind}'; known: {', '.join(KINDS)}") from None


def options() -> dict[str, list[tuple[str, Option]]]:
    """Every kind's options by name, each with the kinds declaring it (an option several share,
    such as ``labels``, is one name: one ``packdata convert`` flag)."""
    by_name: dict[str, list[tuple[str, Option]]] = {}
    for kind in KINDS:
        for option in get(kind).OPTIONS:
            by_name.setdefault(option.name, []).append((kind, option))
    return by_name


def detect_kind(root: Path) -> str:
    """The kind whose file suffixes are most common under ``root``.

    A suffix claimed by several kinds counts for the first in the KINDS table: ``.txt`` is text
    unless ``kind="pointcloud"`` is given (XYZ point files).
    """
    counts = dict.fromkeys(KINDS, 0)
    suffix_kind: dict[str, str] = {}
    for k in KINDS:
        for suffix in get(k).SUFFIXES:
            suffix_kind.setdefault(suffix, k)
    if isinstance(root, RemotePath):  # one listing, not a request per file
        names = list(root.files())
    elif root.is_file():
        names = [root.name]
    else:  # os.walk and strings: no Path object or stat per file
        names = [n for _, _, files in os.walk(root) for n in files]
    for name in names:
        kind = suffix_kind.get(os.path.splitext(name)[1].lower())
        if kind:
            counts[kind] += 1
    best = max(counts, key=counts.__getitem__)
    if counts[best] == 0:
        known = ", ".join(sorted(suffix_kind))
        raise PackdataError(f"{root}: found no input files (looked for {known})")
    return best


def open_source(root: str | Path, kind: str | None = None, **options: Any) -> Source:
    """A Source over ``root``; ``kind`` is detected from file suffixes when not given.
    ``options`` are the kind's (its module's ``OPTIONS``); another is an OptionError.

    A URL ``root`` (``s3://bucket/raw``) is listed and read in place through fsspec, in every
    worker (see :class:`packdata.remote.files.RemotePath`), reached with ``storage_options``."""
    storage_options = options.pop("storage_options", None)
    options.pop("cache_dir", None)  # sources read URLs in place: nothing is cached
    root = RemotePath.of(str(root), storage_options or {}) if is_url(root) else Path(root)
    if not root.exists():
        raise PackdataError(f"{root}: no such file or directory")
    kind = kind or detect_kind(root)
    return get(kind).SOURCE(root, **options)
