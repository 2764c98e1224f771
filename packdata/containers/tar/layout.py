"""Where a tar dataset keeps what: the manifest, the record index and the shard list, each read
and checked against the others before any shard is mapped.

A dataset folder holds ``shard-000000.tar`` … (see :mod:`.members` for their members),
``index.npz`` (numpy, no pickle: per field ``<field>.shard`` (int32), ``<field>.offset`` and
``<field>.nbytes`` (int64) locating each record's payload bytes, and ``<field>.values`` (records
× the field's shape) for fixed fields of at most :data:`INDEX_VALUE_BYTES` bytes a record (labels,
a point cloud's centre or variant checksums), so that reading them touches no shard page;
``__records__.<array>``, the record keys and checksums
of format version 2, :mod:`packdata.recordmeta`), stored uncompressed and mapped in place, not
loaded; ``manifest.json`` (``extra.shards`` lists shard names and
record counts) and the indexes other readers use (:mod:`.indexes`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from packdata.containers.joined import map_kept
from packdata.errors import DatasetError
from packdata.manifest import Field, Manifest
from packdata.recordmeta import map_npz

MANIFEST = "manifest.json"
INDEX = "index.npz"
#: fixed fields of at most this many bytes a record are also kept in the index, beside their
#: members: a batch takes them with one gather from the index instead of mapping a shard page
#: per record for a few bytes
INDEX_VALUE_BYTES = 32
RECORDS = "__records__"


def read_manifest(path: str | Path) -> Manifest:
    """The manifest of the tar dataset at ``path`` (checked: packdata JSON, a version this
    packdata reads)."""
    path = Path(path)
    try:
        text = (path / MANIFEST).read_text()
    except OSError as exc:
        raise DatasetError(f"{path}: not a packdata tar dataset (no readable {MANIFEST}: "
                           f"{exc.strerror})") from None
    return Manifest.from_json(text, str(path))


def shard_paths(path: str | Path) -> list[Path]:
    """The shard files of a tar dataset, in order (for webdataset or DALI readers)."""
    return [Path(path) / s["name"] for s in read_manifest(path).extra["shards"]]


def load_index(path: Path, manifest: Manifest) -> dict[str, np.ndarray]:
    """The per-record index of a tar dataset, checked against the manifest: one entry per record
    for every field (the shard, offset and size of its member; or its value, for scalars). Its
    arrays are views of the mapped file; a version-2 manifest gets its keys and checksums."""
    try:
        index = map_npz(path, map_kept(path))  # reopened here: the last open's map
    except DatasetError:
        raise
    except Exception as exc:  # numpy's messages (e.g. "contains pickled data") mislead here
        raise DatasetError(f"{path}: the record index cannot be read ({exc.__class__.__name__}); "
                           "the dataset is damaged") from None
    wanted = [f"{name}.{part}" for name in manifest.fields
              for part in ("shard", "offset", "nbytes")]
    if manifest.version >= 2:
        prefix = f"{RECORDS}."
        # the index's columns, each under its blocks' checksums (format 3), by name
        tables = {k: (v, True) for k, v in sorted(index.items()) if not k.startswith(prefix)}
        manifest.attach_records({k[len(prefix):]: v for k, v in index.items()
                                 if k.startswith(prefix)}, path, tables)
    for key in wanted:
        if key not in index:
            raise DatasetError(f"{path}: the record index has no '{key}'; the dataset is damaged")
        if len(index[key]) != manifest.count:
            raise DatasetError(f"{path}: '{key}' indexes {len(index[key])} records, the manifest "
                               f"{manifest.count}; the dataset is damaged")
    return index


def shard_list(path: Path, manifest: Manifest) -> list[dict[str, Any]]:
    """The manifest's shard list: plain file names inside the dataset, counts adding up."""
    shards = manifest.extra.get("shards")
    ok = isinstance(shards, list) and all(
        isinstance(s, dict) and isinstance(s.get("name"), str) and isinstance(s.get("count"), int)
        and s["count"] >= 0 and s["name"] not in ("", ".", "..") and "/" not in s["name"]
        and "\\" not in s["name"] for s in shards)
    if not ok or sum(s["count"] for s in shards) != manifest.count:
        raise DatasetError(f"{path}: the manifest's shard list is damaged (names must be files "
                           "in the dataset, counts must add up to its records)")
    return shards


def check_index(path: Path, index: dict[str, np.ndarray], manifest: Manifest) -> None:
    """The index's columns are integers and its scalar values the manifest's type: checked at
    open in O(1). Each record's entries (its shard, offset and size) are checked when it is
    read (:func:`checked_entries`), before any view is laid over a shard, so that
    opening reads no per-record entry."""
    for name, field in manifest.fields.items():
        if any(index[f"{name}.{col}"].dtype.kind not in "iu"
               for col in ("shard", "offset", "nbytes")):
            raise DatasetError(f"{path}: the index of '{name}' points outside its shards; the "
                               "dataset is damaged")
        values = index.get(f"{name}.values")
        if values is not None and (values.dtype != field.np_dtype or len(values) != manifest.count
                                   or field.variable or values.shape[1:] != tuple(field.shape)):
            raise DatasetError(f"{path}: the index's values of '{name}' do not match the "
                               "manifest; the dataset is damaged")


def checked_entries(path: Path, index: dict[str, np.ndarray], stored: dict[str, tuple[Field, int]],
                    idx: np.ndarray, shards: np.ndarray) -> dict[str, tuple[np.ndarray, ...]]:
    """The index entries ``(shard, offset, nbytes)`` of records ``idx`` (held in ``shards``) of
    each field ``stored`` in shards (with its record's bytes, or a row's for a variable field),
    checked before any of their bytes is read (per read, so that opening stays flat in the
    record count): each in the shard that holds the record, at a non-negative offset, of the
    size its field needs. ``path`` is the index's, named in errors."""
    entries = {}
    for name, (field, row) in stored.items():
        shard, offset, nbytes = (index[f"{name}.{c}"][idx] for c in ("shard", "offset", "nbytes"))
        if not np.array_equal(shard, shards) or (len(idx) and (
                offset.min() < 0 or nbytes.min() < 0)):
            raise DatasetError(f"{path}: the index of '{name}' points outside its shards; the "
                               "dataset is damaged")
        fixed = not field.variable
        bad = nbytes != row if fixed else (nbytes % row != 0) if row else (nbytes != 0)
        if np.any(bad):
            raise DatasetError(f"{path}: the index of '{name}' gives sizes that do not fit its "
                               f"field ({field.dtype} {list(field.shape)}); the dataset is "
                               "damaged (or the manifest edited)")
        entries[name] = (shard, offset, nbytes)
    return entries
