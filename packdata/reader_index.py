"""Indexes of a tar dataset for other readers: a DALI ``.idx`` per shard and a wids index JSON.

- ``<shard stem>.idx`` beside each shard, in the layout DALI's ``wds2idx`` writes (version
  v1.2): a line ``v1.2 <samples>``, then one line per sample listing each member as
  ``<ext> <offset of its data> <size> <member name>``. With these ``fn.readers.webdataset``
  starts without scanning the shards.
- ``wids-index.json``: the shard list ``wids.ShardListDataset`` opens (``__kind__``
  ``wids-shard-index-v1``; shard URLs relative to the JSON file).

:class:`~packdata.containers.tar.TarWriter` writes both during conversion;
:func:`write_reader_indexes` (``packdata index DATASET``) writes them for a dataset made before.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

IDX_VERSION = "v1.2"
WIDS_INDEX = "wids-index.json"


def idx_path(dataset: str | Path, shard_name: str) -> Path:
    """Where the DALI index of a shard lives: beside it, ``.tar`` replaced by ``.idx``."""
    return Path(dataset) / (Path(shard_name).stem + ".idx")


Column = tuple[Sequence[str], Sequence[int], Sequence[int]]  # per record: suffix, offset, size


def write_idx(target: Path, member_keys: Sequence[str], columns: Sequence[Column]) -> None:
    """The DALI index of one shard: for each record (``member_keys``) and field (``columns``:
    each member's suffix, payload offset and payload size, as the tar index stores them)."""
    names = [k.replace(" ", "_") for k in member_keys]  # the line's fields are space-separated
    parts = []
    for suffixes, offsets, sizes in columns:
        # a member's data starts on a 512-byte block: the rest of the offset is its .npy header
        offset = np.asarray(offsets, dtype=np.int64)
        header = offset % 512
        starts, lengths = (offset - header).tolist(), (np.asarray(sizes) + header).tolist()
        parts.append([f"{x} {a} {n} {k}.{x}"
                      for x, a, n, k in zip(suffixes, starts, lengths, names)])
    body = "\n".join(map(" ".join, zip(*parts)))
    target.write_text(f"{IDX_VERSION} {len(names)}\n" + body + ("\n" if names else ""))


def write_wids_index(dataset: str | Path, shards: list[dict[str, Any]]) -> Path:
    """The wids shard list of ``shards`` (name and record count each), as JSON in ``dataset``.
    It has no ``name``: the folder is written under a temporary name and may be renamed later,
    so wids names the dataset from its shard list."""
    dataset = Path(dataset)
    spec = {"__kind__": "wids-shard-index-v1", "wids_version": 1,
            "shardlist": [{"url": s["name"], "nsamples": s["count"],
                           "filesize": (dataset / s["name"]).stat().st_size} for s in shards]}
    target = dataset / WIDS_INDEX
    target.write_text(json.dumps(spec, indent=1) + "\n")
    return target


def dali_index_paths(dataset: str | Path) -> list[str] | None:
    """The DALI index of every shard of ``dataset``, or None if any is missing (or ``dataset``
    is no tar dataset)."""
    from packdata.containers.tar import MANIFEST, shard_paths

    if not (Path(dataset) / MANIFEST).is_file():
        return None
    paths = [idx_path(dataset, p.name) for p in shard_paths(Path(dataset))]
    return [str(p) for p in paths] if all(p.is_file() for p in paths) else None


def write_reader_indexes(dataset: str | Path) -> list[Path]:
    """Write the DALI ``.idx`` files and the wids JSON of a tar dataset made by an older packdata
    (from its ``index.npz``: no shard is scanned). Returns the files written."""
    from packdata.containers.tar import TarReader, member_suffix

    dataset = Path(dataset)
    reader = TarReader(dataset)  # checks manifest and index (a DatasetError names the problem)
    try:
        manifest, index = reader.manifest, reader.index
        shards = manifest.extra["shards"]
        keys = [k.replace(".", "_") for k in manifest.keys]
        columns = []
        for name, field in manifest.fields.items():
            if field.codec == "image":  # png or jpg, per record: sniff the first bytes
                suffixes = [member_suffix(name, field, _head(reader, index, name, i))
                            for i in range(len(keys))]
            else:
                suffixes = [member_suffix(name, field, np.zeros(0, field.np_dtype))] * len(keys)
            columns.append((suffixes, index[f"{name}.offset"].tolist(),
                            index[f"{name}.nbytes"].tolist()))
        shard_of = index[f"{next(iter(manifest.fields))}.shard"]
    finally:
        reader.close()
    written = []
    for s, shard in enumerate(shards):
        rows = np.nonzero(shard_of == s)[0]
        lo, hi = (int(rows[0]), int(rows[-1]) + 1) if len(rows) else (0, 0)
        target = idx_path(dataset, shard["name"])
        write_idx(target, keys[lo:hi], [(x[lo:hi], o[lo:hi], n[lo:hi]) for x, o, n in columns])
        written.append(target)
    written.append(write_wids_index(dataset, shards))
    return written


def _head(reader: Any, index: dict[str, np.ndarray], name: str, i: int) -> np.ndarray:
    """The first bytes of record ``i``'s member of field ``name``."""
    offset = int(index[f"{name}.offset"][i])
    return reader._map(int(index[f"{name}.shard"][i]))[offset : offset + 4]
