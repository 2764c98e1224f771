"""Sharded datasets: many complete datasets of one container (parts) bound by one manifest.

Layout of a sharded dataset directory:

- ``part-000000.lmdb``, ``part-000001.lmdb`` … (or ``.h5`` files, or tar-shard directories): each
  a complete packdata dataset of its own, holding a contiguous run of the records;
- ``records.npz``: the record keys and checksums of all parts, in order (uncompressed, mapped
  in place: :mod:`packdata.recordmeta`);
- ``manifest.json``: the dataset's manifest (``container`` is ``"sharded"``), with
  ``options.part_container`` naming the parts' container and ``extra.parts`` listing each part's
  name and record count, in order. It is written last: without it the directory is no dataset.

One part per task is what lets a conversion run as independent tasks (on Dask, say) and resume
after an interruption. Reading composes the parts' own readers: a batch that spans parts is one
batched read per part touched, placed into the output with one mask each.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from packdata import containers
from packdata.containers.base import Batch, Reader, Select, attach_record_file
from packdata.errors import DatasetError
from packdata.manifest import Manifest

NAME = "sharded"
SUFFIXES: tuple[str, ...] = ()  # never chosen by suffix: a conversion into parts asks for it
MANIFEST = "manifest.json"
RECORDS = "records.npz"  # the record keys and checksums of all parts (format version 2)


def part_name(container: str, number: int) -> str:
    """The file or directory name of part ``number`` of a dataset whose parts are ``container``."""
    return f"part-{number:06d}{containers.get(container).NEW_SUFFIX}"


class ShardedReader(Reader):
    """Batched reads over the parts of a sharded dataset, each part read by its own reader."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not (self.path / MANIFEST).is_file():
            raise DatasetError(f"{self.path}: no {MANIFEST}; not a packdata sharded dataset")
        self.manifest = Manifest.from_json((self.path / MANIFEST).read_text(), str(self.path))
        if self.manifest.version >= 2:
            attach_record_file(self.manifest, self.path / RECORDS)
        parts = self.manifest.extra.get("parts")
        if self.manifest.container != NAME or not isinstance(parts, list):
            raise DatasetError(f"{self.path}/{MANIFEST}: not the manifest of a sharded dataset")
        self.part_container = containers.get(self.manifest.options["part_container"])
        self.part_names = [p["name"] for p in parts]
        #: global index of each part's first record, and one past the last
        self.starts = np.concatenate([[0], np.cumsum([p["count"] for p in parts])]).astype(np.int64)
        if self.starts[-1] != self.manifest.count:
            raise DatasetError(f"{self.path}: the parts hold {self.starts[-1]} records, the "
                               f"manifest {self.manifest.count}; the dataset is damaged")
        self._readers: dict[int, Reader] = {}

    @staticmethod
    def detect(path: Path) -> bool:
        """Whether ``path`` is a complete sharded dataset (its manifest written last)."""
        if not (path.is_dir() and (path / MANIFEST).is_file()):
            return False
        try:
            manifest = Manifest.from_json((path / MANIFEST).read_bytes(), str(path))
        except DatasetError:
            return False
        return manifest.container == NAME

    def part(self, number: int) -> Reader:
        """The reader of part ``number``, opened on first use and checked against the manifest."""
        reader = self._readers.get(number)
        if reader is None:
            where = self.path / self.part_names[number]
            if not where.exists():
                raise DatasetError(f"{where}: part missing; the dataset is incomplete")
            reader = self.part_container.READER(where)
            want = int(self.starts[number + 1] - self.starts[number])
            if reader.manifest.count != want or reader.manifest.fields != self.manifest.fields:
                raise DatasetError(f"{where}: the part holds {reader.manifest.count} records "
                                   f"(the dataset's manifest says {want}) or other fields; the "
                                   "dataset is damaged")
            self._readers[number] = reader
        return reader

    def read_records(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        idx = self.check_indices(indices)
        parts = np.searchsorted(self.starts, idx, side="right") - 1
        first = int(parts[0]) if len(parts) else 0
        if len(parts) and (parts == first).all():  # the usual case: the batch lies in one part
            return self.part(first).read(idx - self.starts[first], select)
        batch: Batch = {}
        for name, field in self.manifest.fields.items():
            if field.variable:
                batch[name] = [None] * len(idx)  # type: ignore[list-item]
            else:
                shape = field.shape[1:] if select and name in select else field.shape
                batch[name] = np.empty((len(idx), *shape), dtype=field.np_dtype)
        for number in np.unique(parts).tolist():
            mask = parts == number
            local_select = {k: v[mask] for k, v in select.items()} if select else None
            got = self.part(number).read(idx[mask] - self.starts[number], local_select)
            positions = np.flatnonzero(mask).tolist()
            for name, value in got.items():
                if isinstance(value, list):
                    out = batch[name]
                    for j, row in zip(positions, value):
                        out[j] = row  # type: ignore[index]
                else:
                    batch[name][mask] = value  # type: ignore[index]
        return batch

    def lengths(self, name: str) -> np.ndarray:
        self.check_variable(name)
        return np.concatenate([self.part(i).lengths(name) for i in range(len(self.part_names))])

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()


READER = ShardedReader
detect = ShardedReader.detect
