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
from pathlib import Path
from typing import Any

import numpy as np

IDX_VERSION = "v1.2"
WIDS_INDEX = "wids-index.json"


def idx_path(dataset: str | Path, shard_name: str) -> Path:
    """Where the DALI index of a shard lives: beside it, ``.tar`` replaced by ``.idx``."""
    return Path(dataset) / (Path(shard_name).stem + ".idx")


def member_entry(suffix: str, data_start: int, size: int, member_key: str) -> str:
    """One member of a sample's ``.idx`` line (fields are space-separated: none in the name)."""
    return f"{suffix} {data_start} {size} {member_key.replace(' ', '_')}.{suffix}"


def write_idx(target: Path, lines: list[str]) -> None:
    target.write_text(f"{IDX_VERSION} {len(lines)}\n" + "".join(line + "\n" for line in lines))


def write_wids_index(dataset: str | Path, shards: list[dict[str, Any]]) -> Path:
    """The wids shard list of ``shards`` (name and record count each), as JSON in ``dataset``."""
    dataset = Path(dataset)
    spec = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": dataset.name,
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
            offsets = index[f"{name}.offset"]
            start = offsets - offsets % 512  # members start on 512-byte blocks: skip .npy headers
            sizes = index[f"{name}.nbytes"] + offsets % 512
            if field.codec == "image":  # png or jpg, per record: sniff the first bytes
                suffixes = [member_suffix(name, field, _head(reader, index, name, i))
                            for i in range(len(keys))]
            else:
                suffixes = [member_suffix(name, field, np.zeros(0, field.np_dtype))] * len(keys)
            columns.append((suffixes, start.tolist(), sizes.tolist()))
        first_field = next(iter(manifest.fields))
        shard_of = index[f"{first_field}.shard"]
    finally:
        reader.close()
    written = []
    for s, shard in enumerate(shards):
        rows = np.nonzero(shard_of == s)[0].tolist()
        lines = [" ".join(member_entry(c[0][i], c[1][i], c[2][i], keys[i]) for c in columns)
                 for i in rows]
        target = idx_path(dataset, shard["name"])
        write_idx(target, lines)
        written.append(target)
    written.append(write_wids_index(dataset, shards))
    return written


def _head(reader: Any, index: dict[str, np.ndarray], name: str, i: int) -> np.ndarray:
    """The first bytes of record ``i``'s member of field ``name``."""
    offset = int(index[f"{name}.offset"][i])
    return reader._map(int(index[f"{name}.shard"][i]))[offset : offset + 4]
