"""Checking a packed dataset against its manifest (and, optionally, against its source).

Three levels, from cheapest:

- structural checks that every Reader makes when it opens (:func:`check_manifest` and the
  containers' own size/offset checks): the manifest is plain numeric fields, its count, keys and
  checksums agree, and nothing points outside a file; always on, they cost no record reads;
- ``packdata.open(path, verify="sample")`` (the default): also the CRC-32 of a few records spread
  over the dataset, checked once at open;
- ``verify="full"``: every record read is checked against its CRC-32 (:class:`ChecksummedReader`);
- :func:`verify` (``packdata verify``): every record's shape and CRC-32, and with a source, every
  record against a fresh conversion of its input.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packdata.containers.base import Batch, Reader, Select, apply_select
from packdata.errors import ArgumentError, DatasetError, PackdataError
from packdata.manifest import Manifest, record_checksum

LEVELS = ("off", "sample", "full")
SAMPLED_RECORDS = 8  # records checksummed at open with verify="sample"
NUMERIC_KINDS = "biufc"  # bool, integers, floats, complex: never objects, strings or voids


def check_manifest(manifest: Manifest, where: str | Path) -> None:
    """Raise DatasetError unless ``manifest`` is self-consistent: numeric fixed-size dtypes,
    non-negative integer shapes, and ``keys``/``checksums`` one per record. Readers call this
    before sizing any view or allocation from the manifest."""
    count = manifest.count
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise DatasetError(f"{where}: manifest count {count!r} is not a record count; "
                           "the dataset is damaged")
    if not manifest.fields:
        raise DatasetError(f"{where}: the manifest lists no fields; the dataset is damaged")
    for name, f in manifest.fields.items():
        try:
            dtype = np.dtype(f.dtype)
        except (TypeError, ValueError):
            dtype = None
        if dtype is None or dtype.kind not in NUMERIC_KINDS or dtype.itemsize == 0 \
                or dtype.hasobject or not isinstance(f.dtype, str):
            raise DatasetError(f"{where}: field '{name}' has dtype {f.dtype!r}; packdata stores "
                               "only numeric fields, the manifest is damaged")
        sizes = f.shape[1:] if f.variable else f.shape
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in sizes):
            raise DatasetError(f"{where}: field '{name}' has shape {list(f.shape)}; the manifest "
                               "is damaged")
    if len(manifest.keys) != count:
        raise DatasetError(f"{where}: the manifest lists {len(manifest.keys)} keys for {count} "
                           "records; the dataset is damaged")
    if manifest.checksums and len(manifest.checksums) != count:
        raise DatasetError(f"{where}: the manifest lists {len(manifest.checksums)} checksums for "
                           f"{count} records; the dataset is damaged")


def record_at(batch: Batch, j: int, manifest: Manifest) -> dict[str, np.ndarray]:
    """Record ``j`` of a batch as ``{field: array}``."""
    return {name: np.asarray(batch[name][j]) for name in manifest.fields}


def batch_checksums(batch: Batch, manifest: Manifest, n: int) -> list[int]:
    """Each record's CRC-32 as :func:`packdata.manifest.record_checksum` computes it, over a
    whole batch: fixed fields as one (records, bytes) table each, so the loop over records
    makes one zlib call per field and nothing else."""
    parts = []
    for name, f in manifest.fields.items():
        value = batch[name]
        if f.variable:
            parts.append([np.ascontiguousarray(v) for v in value])
        else:
            parts.append(np.ascontiguousarray(value).reshape(n, -1).view(np.uint8))
    crcs = []
    for j in range(n):
        crc = 0
        for part in parts:
            crc = zlib.crc32(part[j], crc)
        crcs.append(crc)
    return crcs


def bad_checksums(reader: Reader, idx: np.ndarray, batch: Batch) -> list[int]:
    """The indices among ``idx`` whose record in ``batch`` does not match its CRC-32."""
    m = reader.manifest
    if not m.checksums:
        return []
    expected = m.checksums
    return [i for i, crc in zip(idx.tolist(), batch_checksums(batch, m, len(idx)))
            if crc != expected[i]]


def check_sample(reader: Reader, where: str | Path, records: int = SAMPLED_RECORDS) -> None:
    """The CRC-32 of ``records`` records spread over the dataset (first and last included)."""
    n = reader.manifest.count
    if not n or not reader.manifest.checksums:
        return
    idx = np.unique(np.linspace(0, n - 1, min(records, n)).astype(np.int64))
    batch = _read_checked(reader, idx, where)
    bad = bad_checksums(reader, idx, batch)
    if bad:
        raise DatasetError(f"{where}: record {bad[0]} ('{reader.manifest.keys[bad[0]]}') does not "
                           "match its checksum; the dataset is damaged (run `packdata verify`)")


def _read_checked(reader: Reader, idx: np.ndarray, where: str | Path,
                  select: Select | None = None) -> Batch:
    """``reader.read``, with any failure that is not packdata's turned into a DatasetError
    naming the dataset (a damaged file makes numpy or a backend raise its own errors)."""
    try:
        return reader.read(idx, select)
    except (PackdataError, IndexError):
        raise
    except Exception as exc:
        raise DatasetError(f"{where}: records cannot be read ({type(exc).__name__}: {exc}); "
                           "the dataset is damaged") from None


class ChecksummedReader(Reader):
    """A Reader whose every batch is checked against the manifest's CRC-32s (``verify="full"``).

    A wrapper, so the plain readers' hot paths stay as they are. A ``select`` read fetches whole
    records (the checksum covers all of a record), then selects."""

    def __init__(self, inner: Reader, where: str | Path) -> None:
        self.inner = inner
        self.where = where
        self.manifest = inner.manifest

    @staticmethod
    def detect(path: Path) -> bool:  # never used to find a container
        return False

    def read(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        idx = self.inner.check_indices(indices)
        batch = _read_checked(self.inner, idx, self.where)
        bad = bad_checksums(self.inner, idx, batch)
        if bad:
            raise DatasetError(f"{self.where}: record {bad[0]} ('{self.manifest.keys[bad[0]]}') "
                               "does not match its checksum; the dataset is damaged")
        return apply_select(batch, select)

    def lengths(self, name: str) -> np.ndarray:
        return self.inner.lengths(name)

    def prefetch(self, starts: Sequence[int]) -> None:
        self.inner.prefetch(starts)

    def close(self) -> None:
        self.inner.close()


def at_open(reader: Reader, where: str | Path, level: str) -> Reader:
    """The reader to use for ``level``: checked now (``"sample"``) or wrapped (``"full"``)."""
    if level not in LEVELS:
        raise ArgumentError(f"verify={level!r}: expected one of {', '.join(LEVELS)}")
    if level == "sample":
        check_sample(reader, where)
    return ChecksummedReader(reader, where) if level == "full" else reader


# -- packdata verify -------------------------------------------------------------------------

@dataclass
class VerifyReport:
    """What :func:`verify` found: ``problems`` about the dataset as a whole, ``bad`` records."""

    path: str
    container: str | None = None
    count: int = 0
    checked: int = 0
    compared: int = 0  # records compared with a fresh conversion of the source
    problems: list[str] = field(default_factory=list)
    bad: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.bad

    def add_bad(self, index: int | None, key: str, problem: str) -> None:
        self.bad.append({"index": index, "key": key, "problem": problem})


def verify(path: str | Path, source: Any = None, deep: bool = False,
           batch_size: int = 256) -> VerifyReport:
    """Check every record of the dataset at ``path``: its shape against the manifest and its
    CRC-32. ``deep`` also reads each record alone (another code path than batches) and decodes
    encoded images. ``source`` (a :class:`packdata.sources.base.Source`) compares every record
    with a fresh conversion of its input."""
    from packdata import containers

    report = VerifyReport(str(path))
    try:
        module = containers.for_existing(path)
        reader = module.READER(Path(path))
    except (PackdataError, OSError) as exc:
        report.problems.append(str(exc))
        return report
    m = reader.manifest
    report.container, report.count = m.container, m.count
    if m.count and not m.checksums:
        report.problems.append("the manifest holds no checksums: records checked for shape only")
    for idx in _chunks(m.count, batch_size):
        for i, record, error in _records(reader, idx, path):
            report.checked += 1
            key = m.keys[i]
            if error:
                report.add_bad(i, key, error)
                continue
            problem = _record_problem(record, m, i, deep)
            if problem:
                report.add_bad(i, key, problem)
            elif deep and (alone := _read_alone(reader, i, path)) is not None \
                    and not _same(alone, record):
                report.add_bad(i, key, "reads differently alone than in a batch")
    if source is not None:
        _compare_source(reader, source, report, path)
    reader.close()
    return report


def _chunks(n: int, size: int) -> Iterator[np.ndarray]:
    for a in range(0, n, size):
        yield np.arange(a, min(n, a + size), dtype=np.int64)


def _records(reader: Reader, idx: np.ndarray, path: str | Path):
    """``(index, record, error)`` for each of ``idx``: a failed batch is retried record by
    record, so one damaged record does not hide the others."""
    try:
        batch = _read_checked(reader, idx, path)
    except (PackdataError, IndexError):
        if len(idx) == 1:
            raise
        for i in idx.tolist():
            try:
                yield from _records(reader, np.array([i]), path)
            except (PackdataError, IndexError) as exc:
                yield i, None, str(exc)
        return
    for j, i in enumerate(idx.tolist()):
        yield i, record_at(batch, j, reader.manifest), None


def _record_problem(record: dict[str, np.ndarray], m: Manifest, i: int, deep: bool) -> str | None:
    for name, f in m.fields.items():
        try:
            f.check(name, record[name])
        except ValueError as exc:
            return str(exc)
    if m.checksums and record_checksum(record, m.fields) != m.checksums[i]:
        return "CRC-32 does not match the manifest"
    if deep:
        for name, f in m.fields.items():
            if f.codec == "image":
                from packdata.sources.images import decode_image

                try:
                    decode_image(record[name])
                except Exception as exc:
                    return f"field '{name}': stored image does not decode ({exc})"
    return None


def _read_alone(reader: Reader, i: int, path: str | Path) -> dict[str, np.ndarray] | None:
    try:
        return record_at(_read_checked(reader, np.array([i]), path), 0, reader.manifest)
    except (PackdataError, IndexError):
        return None


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
               and np.array_equal(a[k], b[k]) for k in a)


def _compare_source(reader: Reader, source: Any, report: VerifyReport, path: str | Path) -> None:
    """Every input of ``source`` converted afresh and compared with the stored record."""
    from packdata.sources.base import safe_load

    m = reader.manifest
    position = {k: i for i, k in enumerate(m.keys)}
    skipped = {s["path"] for s in m.skipped}
    seen: set[str] = set()
    for item in source.items():
        loaded = safe_load(source, item)
        if isinstance(loaded, PackdataError):
            if str(item.path) not in skipped:
                report.add_bad(None, item.key, f"input fails to convert now: {loaded}")
            continue
        pairs = loaded if isinstance(loaded, list) else [(item.key, loaded)]
        for key, fresh in pairs:
            seen.add(key)
            i = position.get(key)
            if i is None:
                report.add_bad(None, key, f"input {item.path} is not in the dataset")
                continue
            stored = _read_alone(reader, i, path)
            if stored is None:
                continue  # already listed as a bad record
            report.compared += 1
            fresh = {n: np.asarray(fresh[n]) for n in m.fields}
            if not _same(fresh, stored):
                report.add_bad(i, key, f"differs from a fresh conversion of {item.path}")
    for key in set(m.keys) - seen:
        report.add_bad(position[key], key, "no input in the source makes this record")


def source_for(manifest: Manifest, root: str | Path) -> Any:
    """A Source over ``root`` with the conversion options the manifest recorded."""
    import inspect

    from packdata import sources

    params = inspect.signature(sources.get(manifest.kind).SOURCE.__init__).parameters
    options: dict[str, Any] = {}
    for name, value in manifest.options.items():
        if name not in params or value is None:
            continue
        if isinstance(value, dict):  # a tokenizer: reloaded from the file the manifest names
            value = value.get("path") or value.get("kind")
        options[name] = tuple(value) if isinstance(value, list) and name == "resize" else value
    labels = manifest.source.get("labels")
    if "labels" in params and labels and Path(labels).is_file():
        options["labels"] = labels
    return sources.open_source(root, manifest.kind, **options)
