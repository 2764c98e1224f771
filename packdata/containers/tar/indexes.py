"""Indexes of a tar dataset for other readers: a DALI ``.idx`` per shard and a wids index JSON.

- ``<shard stem>.idx`` beside each shard, in the layout DALI's ``wds2idx`` writes (version
  v1.2): a line ``v1.2 <samples>``, then one line per sample listing each member as
  ``<ext> <offset of its data> <size> <member name>``. With these ``fn.readers.webdataset``
  starts without scanning the shards.
- ``wids-index.json``: the shard list ``wids.ShardListDataset`` opens (``__kind__``
  ``wids-shard-index-v1``; shard URLs relative to the JSON file).

The tar writer writes both during conversion; :mod:`.reindex` writes them for a dataset made
before (``packdata index DATASET``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packdata.containers.tar.layout import MANIFEST, shard_paths

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


def write_wids_index(dataset: str | Path, shards: list[dict[str, Any]],
                     sizes: Sequence[int] | None = None) -> Path:
    """The wids shard list of ``shards`` (name and record count each), as JSON in ``dataset``.
    It has no ``name``: the folder is written under a temporary name and may be renamed later,
    so wids names the dataset from its shard list. ``sizes``: the shards' sizes in bytes, when
    they are not files in ``dataset`` (a dataset in object storage)."""
    dataset = Path(dataset)
    if sizes is None:
        sizes = [(dataset / s["name"]).stat().st_size for s in shards]
    spec = {"__kind__": "wids-shard-index-v1", "wids_version": 1,
            "shardlist": [{"url": s["name"], "nsamples": s["count"], "filesize": size}
                          for s, size in zip(shards, sizes, strict=True)]}
    target = dataset / WIDS_INDEX
    target.write_text(json.dumps(spec, indent=1) + "\n")
    return target


def dali_index_paths(dataset: str | Path) -> list[str] | None:
    """The DALI index of every shard of ``dataset``, or None if any is missing (or ``dataset``
    is no tar dataset)."""
    if not (Path(dataset) / MANIFEST).is_file():
        return None
    paths = [idx_path(dataset, p.name) for p in shard_paths(Path(dataset))]
    return [str(p) for p in paths] if all(p.is_file() for p in paths) else None
