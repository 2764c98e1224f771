"""The DALI and wids indexes of a tar dataset made before packdata wrote them at conversion
(``packdata index DATASET``), built from its record index: no shard is scanned (image shards
excepted, whose members' first bytes tell PNG from JPEG)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from packdata import containers
from packdata.containers.tar.indexes import idx_path, write_idx, write_wids_index
from packdata.containers.tar.members import member_key, member_suffix


def write_reader_indexes(dataset: str | Path, out_dir: str | Path | None = None,
                         storage: Any = None) -> list[str]:
    """Write the DALI ``.idx`` files and the wids JSON of a tar dataset made by an older packdata
    (at a path, or a URL reached through ``storage``: made locally, then sent beside its
    shards). Returns where they were written. With ``out_dir``, only the DALI indexes, there
    (a dataset that may not be written to)."""
    reader = containers.open_reader(dataset, storage)  # checks manifest and index
    try:
        if out_dir is not None:
            return [str(p) for p in _dali_indexes(reader, Path(out_dir))]
        with tempfile.TemporaryDirectory(prefix="packdata-index-") as tmp:
            made = _dali_indexes(reader, Path(tmp))
            shards = reader.manifest.extra["shards"]
            made.append(write_wids_index(tmp, shards,
                                         [reader.shards.size(s["name"]) for s in shards]))
            return reader.shards.publish(made)  # placed beside the shards
    finally:
        reader.close()


def _dali_indexes(reader: Any, folder: Path) -> list[Path]:
    """A DALI index per shard of ``reader``'s dataset, in ``folder``."""
    manifest, index = reader.manifest, reader.index
    keys = [member_key(k) for k in manifest.keys]
    columns = []
    for name, field in manifest.fields.items():
        if field.codec == "image":  # png or jpg, per record: sniff the first bytes
            suffixes = [member_suffix(name, field, _head(reader, name, i)) for i in range(len(keys))]
        else:
            suffixes = [member_suffix(name, field, np.zeros(0, field.np_dtype))] * len(keys)
        columns.append((suffixes, index[f"{name}.offset"].tolist(),
                        index[f"{name}.nbytes"].tolist()))
    shard_of = index[f"{next(iter(manifest.fields))}.shard"]
    written = []
    for s, shard in enumerate(manifest.extra["shards"]):
        rows = np.nonzero(shard_of == s)[0]
        lo, hi = (int(rows[0]), int(rows[-1]) + 1) if len(rows) else (0, 0)
        target = idx_path(folder, shard["name"])
        write_idx(target, keys[lo:hi], [(x[lo:hi], o[lo:hi], n[lo:hi]) for x, o, n in columns])
        written.append(target)
    return written


def _head(reader: Any, name: str, i: int) -> np.ndarray:
    """The first bytes of record ``i``'s member of field ``name``."""
    offset = int(reader.index[f"{name}.offset"][i])
    return reader.maps[int(reader.index[f"{name}.shard"][i])][offset : offset + 4]
