"""The DALI and wids indexes of a tar dataset made before packdata wrote them at conversion
(``packdata index DATASET``), built from its record index: no shard is scanned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from packdata.containers.tar.indexes import idx_path, write_idx, write_wids_index
from packdata.containers.tar.members import member_key, member_suffix
from packdata.containers.tar.reader import TarReader


def write_reader_indexes(dataset: str | Path, out_dir: str | Path | None = None,
                         reader: TarReader | None = None) -> list[Path]:
    """Write the DALI ``.idx`` files and the wids JSON of a tar dataset made by an older packdata
    (from its ``index.npz``: no shard is scanned). Returns the files written. With ``out_dir``,
    only the DALI indexes, there (a dataset that may not be written to). ``reader``: the
    dataset's, already open (one at a URL: then ``out_dir`` is where the files are made)."""
    dataset = Path(dataset)
    opened = reader is None
    if reader is None:  # checks manifest and index (a DatasetError names the problem)
        reader = TarReader(dataset)
    try:
        manifest, index = reader.manifest, reader.index
        shards = manifest.extra["shards"]
        keys = [member_key(k) for k in manifest.keys]
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
        if opened:
            reader.close()
    written = []
    for s, shard in enumerate(shards):
        rows = np.nonzero(shard_of == s)[0]
        lo, hi = (int(rows[0]), int(rows[-1]) + 1) if len(rows) else (0, 0)
        target = idx_path(out_dir if out_dir is not None else dataset, shard["name"])
        write_idx(target, keys[lo:hi], [(x[lo:hi], o[lo:hi], n[lo:hi]) for x, o, n in columns])
        written.append(target)
    if out_dir is None:
        written.append(write_wids_index(dataset, shards))
    return written


def _head(reader: Any, index: dict[str, np.ndarray], name: str, i: int) -> np.ndarray:
    """The first bytes of record ``i``'s member of field ``name``."""
    offset = int(index[f"{name}.offset"][i])
    return reader._map(int(index[f"{name}.shard"][i]))[offset : offset + 4]
