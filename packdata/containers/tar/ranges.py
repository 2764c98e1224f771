"""A tar dataset read by ranges: a batch's records fetched as the byte ranges of their members
(object storage's ``access="ranges"``: map-style access to a few records of a large dataset,
no shard fetched whole), each record checked against its checksum, through the one checksum
every read uses, before the batch is served."""

from __future__ import annotations

from typing import Any

import numpy as np

from packdata.containers.base import Batch, Select, apply_select, selected_entries
from packdata.containers.integrity import bad_checksums
from packdata.errors import DatasetError


def read_ranged(reader: Any, idx: np.ndarray, select: Select | None = None) -> Batch:
    """Records ``idx`` (checked indices) of a :class:`~packdata.containers.tar.reader.TarReader`
    whose shard source reads by ranges; ``select`` as :meth:`Reader.read` takes it."""
    m, index = reader.manifest, reader.index
    reader.check_entries(idx)  # the entries, and the entries selected, before any request
    for name in select or {}:
        selected_entries(select, name, m.fields[name], len(idx))  # type: ignore[arg-type]
    stored = [name for name in m.fields if f"{name}.values" not in index]  # in the shards
    shards, starts, nbytes = (np.concatenate([index[f"{n}.{part}"][idx] for n in stored])
                              for part in ("shard", "offset", "nbytes"))
    got = reader.shards.ranges([reader.shard_names[s] for s in shards.tolist()],
                               starts.tolist(), (starts + nbytes).tolist())
    batch: Batch = {}
    for name, spec in m.fields.items():
        if name not in stored:  # kept in the index (labels)
            batch[name] = index[f"{name}.values"][idx]
            continue
        k = stored.index(name)
        blobs = got[k * len(idx) : (k + 1) * len(idx)]
        if spec.variable:
            batch[name] = [np.frombuffer(b, spec.np_dtype).reshape(-1, *spec.row_shape).copy()
                           for b in blobs]
        else:
            batch[name] = np.frombuffer(b"".join(blobs), spec.np_dtype).reshape(
                len(idx), *spec.shape).copy()
    bad = bad_checksums(reader, idx, batch)
    if bad:
        raise corrupted(reader, bad[0])
    return apply_select(batch, select, m.fields)


def corrupted(reader: Any, index: int) -> DatasetError:
    """The error for record ``index`` of a shard fetched from elsewhere failing its checksum:
    names the shard where it was fetched from, and the record."""
    shard = reader.shard_names[int(reader.shards_of([index])[0])]
    return DatasetError(f"{reader.shards.where(shard)}: shard corrupted (record "
                        f"'{reader.manifest.keys[index]}' does not match its checksum); the "
                        "dataset is damaged")
