"""``packdata verify``: check every record of a dataset against its manifest, and optionally
against a fresh conversion of its source. The checks a read makes on its own (at open, and with
``verify="full"`` on every batch) are in :mod:`packdata.containers.integrity`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packdata import containers
from packdata.checksum import algorithm_of, entry_checksums, record_checksum
from packdata.containers.base import Batch, Reader
from packdata.containers.integrity import read_checked
from packdata.errors import InputWarning, PackdataError
from packdata.manifest import Manifest
from packdata.recordmeta import Keys, key_hashes
from packdata.spooling import FLUSH
from packdata.units import plural


def record_at(batch: Batch, j: int, manifest: Manifest) -> dict[str, np.ndarray]:
    """Record ``j`` of a batch as ``{field: array}``."""
    return {name: np.asarray(batch[name][j]) for name in manifest.fields}


@dataclass
class VerifyReport:
    """What :func:`verify` found: ``problems`` about the dataset as a whole, ``bad`` records."""

    path: str
    container: str | None = None
    version: int | None = None  # the format version of its manifest
    count: int = 0
    checked: int = 0
    compared: int = 0  # records compared with a fresh conversion of the source
    source: str | None = None  # that source, where one was given
    problems: list[str] = field(default_factory=list)
    bad: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.bad

    def add_bad(self, index: int | None, key: str, problem: str) -> None:
        self.bad.append({"index": index, "key": key, "problem": problem})

    def lines(self, shown: int = 50) -> list[str]:
        """The report as ``packdata verify`` prints it: what was checked, every problem, the
        first ``shown`` bad records, then OK or what failed."""
        checked = f"{self.checked} of {self.count} records checked"
        if self.source is not None:
            checked += f", {self.compared} compared with {self.source}"
        version = f" (format version {self.version})" if self.version else ""
        out = [f"{self.path}: {self.container or 'unreadable'}{version}, {checked}"]
        out += [f"  problem: {problem}" for problem in self.problems]
        for bad in self.bad[:shown]:
            at = "" if bad["index"] is None else f" (record {bad['index']})"
            out.append(f"  bad: {bad['key']}{at}: {bad['problem']}")
        if len(self.bad) > shown:
            out.append(f"  ... and {plural(len(self.bad) - shown, 'more bad record')}")
        out.append("OK" if self.ok else f"FAILED: {plural(len(self.bad), 'bad record')}, "
                   f"{plural(len(self.problems), 'problem')}")
        return out


def verify(path: str | Path, source: Any = None, deep: bool = False,
           batch_size: int = 256) -> VerifyReport:
    """Check every record of the dataset at ``path``: its shape against the manifest and its
    checksum. ``deep`` also reads each record alone (another code path than batches) and decodes
    encoded images. ``source`` compares every record with a fresh conversion of its input: a
    :class:`packdata.sources.base.Source`, or the input folder (a Source over it with the
    options the manifest recorded: :func:`source_for`)."""
    report = VerifyReport(str(path))
    try:
        reader = containers.open_reader(path)  # at a URL: tar shards in object storage
        reader.allow_truncated_shards()  # the records before a cut are intact
    except (PackdataError, OSError) as exc:
        report.problems.append(str(exc))
        return report
    m = reader.manifest
    if isinstance(source, (str, Path)):
        report.source = str(source)
        try:
            source = source_for(m, source)
        except BaseException:
            reader.close()
            raise
    elif source is not None:
        report.source = str(source.root)
    report.container, report.count, report.version = m.container, m.count, m.version
    if m.count and not len(m.checksums):
        report.problems.append("the manifest holds no checksums: records checked for shape only")
    where = m.checks.where if m.checks is not None else path
    report.problems += [f"{where}: {found}" for found in (
        m.checks.damaged() if m.checks is not None else [])]
    if m.version >= 2:
        report.problems += key_index_problems(m.keys, where)
    for idx in _chunks(m.count, batch_size):
        for i, record, error, mismatch in _records(reader, idx, path):
            report.checked += 1
            key = _key(m, i)
            if error:
                report.add_bad(i, key, error)
                continue
            problem = _record_problem(record, m, i, deep, mismatch)
            if problem:
                report.add_bad(i, key, problem)
            elif deep and (alone := _read_alone(reader, i, path)) is not None \
                    and not _same(alone, record):
                report.add_bad(i, key, "reads differently alone than in a batch")
    for shard, (there, needed, recorded) in reader.truncated().items():
        if there < needed:
            report.problems.append(f"{shard}: truncated ({there:,} bytes, the index needs "
                                   f"{needed:,}): the records past the cut are lost")
        else:  # reads refuse it too: a shard of another size is not the one written
            report.problems.append(f"{shard}: truncated ({there:,} bytes, the manifest records "
                                   f"{recorded:,}): its records are whole, the end of its tar "
                                   "archive is lost")
    if source is not None:
        _compare_source(reader, source, report, path)
    reader.close()
    return report


def _key(m: Manifest, i: int) -> str:
    """Record ``i``'s key, or what stops it from being read (a damaged key array: a problem
    of its own in the report)."""
    try:
        return m.keys[i]
    except PackdataError:
        return f"(record {i}: its key is damaged)"


def key_index_problems(keys: Keys, where: str | Path) -> list[str]:
    """The key arrays checked whole against each other (format 2 and later): the offsets
    ordered and within the keys, the hashes sorted, each the hash of the key of the record the
    order names, the order a permutation of the records; what fails, in words."""
    n, offsets, data = len(keys), keys.offsets, keys.data
    if len(offsets) != n + 1 or (n and (offsets[0] != 0 or offsets[-1] != len(data)
                                        or np.any(offsets[1:] < offsets[:-1]))):
        return [f"{where}: the key offsets are out of order; the record keys are damaged"]
    if keys.hashes is None or keys.order is None:
        return []
    hashes, order = keys.hashes, keys.order
    if len(order) != n or len(hashes) != n or (n and (order.min() < 0 or order.max() >= n
                                                      or np.any(hashes[1:] < hashes[:-1]))):
        return [f"{where}: the key index is out of order; the record keys are damaged"]
    if n and np.bincount(order, minlength=n).max() > 1:
        return [f"{where}: the key index names a record twice; the record keys are damaged"]
    computed = np.empty(n, dtype=np.uint64)
    for a in range(0, n, FLUSH):  # each key's hash, a block of keys at a time
        ends = offsets[a : min(a + FLUSH, n) + 1].tolist()
        computed[a : a + len(ends) - 1] = key_hashes([data[s:e] for s, e in zip(ends, ends[1:])])
    wrong = np.flatnonzero(computed[order] != hashes)
    if len(wrong):
        return [f"{where}: {len(wrong):,} keys do not match the key index (first: record "
                f"{int(order[wrong[0]])}); the record keys are damaged"]
    return []


def _chunks(n: int, size: int) -> Iterator[np.ndarray]:
    for a in range(0, n, size):
        yield np.arange(a, min(n, a + size), dtype=np.int64)


def _records(reader: Reader, idx: np.ndarray, path: str | Path):
    """``(index, record, error, mismatch)`` for each of ``idx``: a failed batch is retried
    record by record, so one damaged record does not hide the others. ``mismatch`` says what
    the record's checksum does not cover: entries that do not match their entry checksums
    (hashed for the batch at once), or a second copy of a field that differs (tar's members)."""
    try:
        batch = read_checked(reader, idx, path)
        copies = reader.second_copies_match(idx)
    except (PackdataError, IndexError):
        if len(idx) == 1:
            raise
        for i in idx.tolist():
            try:
                yield from _records(reader, np.array([i]), path)
            except (PackdataError, IndexError) as exc:
                yield i, None, str(exc), None
        return
    m = reader.manifest
    checks = m.entry_checks if len(m.checksums) else None
    entries_match = np.ones(len(idx), dtype=bool) if checks is None else \
        (entry_checksums(batch, checks, len(idx)) == batch[checks.field]).all(axis=1)
    for j, i in enumerate(idx.tolist()):
        mismatch = None
        if not entries_match[j]:
            mismatch = f"entries do not match their checksums ('{checks.field}')"  # type: ignore[union-attr]
        for name, matches in copies.items():
            if not matches[j]:
                mismatch = (f"its member copy of '{name}' does not hold the value in the index "
                            "(webdataset and other tar readers read the member)")
        yield i, record_at(batch, j, m), None, mismatch


def _record_problem(record: dict[str, np.ndarray], m: Manifest, i: int, deep: bool,
                    mismatch: str | None) -> str | None:
    for name, f in m.fields.items():
        try:
            f.check(name, record[name])
        except ValueError as exc:
            return str(exc)
    if len(m.checksums) and record_checksum(record, m.fields, algorithm_of(m.version)) != m.checksums[i]:
        return "checksum does not match the manifest"
    if mismatch:
        return mismatch
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
        return record_at(read_checked(reader, np.array([i]), path), 0, reader.manifest)
    except (PackdataError, IndexError):
        return None


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
               and np.array_equal(a[k], b[k]) for k in a)


def _compare_source(reader: Reader, source: Any, report: VerifyReport, path: str | Path) -> None:
    """Every input of ``source`` converted afresh and compared with the stored record."""
    m = reader.manifest
    skipped = {s["path"] for s in m.skipped}
    seen = np.zeros(m.count, dtype=bool)  # records some input made (keys looked up, not listed)
    for item, loaded in _loaded(source):
        if isinstance(loaded, PackdataError):
            if loaded.path not in skipped:
                report.add_bad(None, item.key, f"input fails to convert now: {loaded}")
            continue
        pairs = loaded if isinstance(loaded, list) else [(item.key, loaded)]
        for key, fresh in pairs:
            try:
                i = m.keys.index_of(key)
            except KeyError:
                report.add_bad(None, key, f"input {item.path} is not in the dataset")
                continue
            except PackdataError as exc:  # damaged key arrays: reported once, above
                report.add_bad(None, key, f"cannot be looked up ({exc})")
                continue
            seen[i] = True
            stored = _read_alone(reader, i, path)
            if stored is None:
                continue  # already listed as a bad record
            report.compared += 1
            if set(fresh) != set(m.fields):  # e.g. labels now, none stored (or the reverse)
                report.add_bad(i, key, f"a fresh conversion of {item.path} has fields "
                               f"{sorted(fresh)}, the dataset {sorted(m.fields)}")
                continue
            fresh = {n: np.asarray(fresh[n]) for n in m.fields}
            if not _same(fresh, stored):
                report.add_bad(i, key, f"differs from a fresh conversion of {item.path}")
    for i in np.flatnonzero(~seen).tolist():
        report.add_bad(i, _key(m, i), "no input in the source makes this record")


def _loaded(source: Any) -> Iterator[tuple[Any, Any]]:
    """``(item, loaded)`` for every input, loaded as conversion loads them (block by block: one
    input may make several records, e.g. a text split into chunks; in a worker process where the
    source declares it, so a decoder that aborts is a reported problem, not the end of verify)."""
    from packdata.conversion.local import load_blocks
    from packdata.conversion.survey import survey

    with warnings.catch_warnings():  # advice for converting (no labels, precision): not news
        warnings.simplefilter("ignore", InputWarning)
        items = source.items()
    survey(source, items, workers=1)  # what the headers decide, as conversion settles it
    for block, loaded in load_blocks(source, source.blocks(items), workers=1, packed=False):
        yield from zip(block, loaded)


def source_for(manifest: Manifest, root: str | Path) -> Any:
    """A Source over ``root`` with the conversion options the manifest recorded: those named in
    its kind's ``OPTIONS``, as the source declared them (:meth:`Source.options`)."""
    from packdata import sources

    table = sources.get(manifest.kind).OPTIONS
    names = {o.name for o in table}
    options = {k: v for k, v in manifest.options.items() if k in names}
    # an option the manifest does not record (written before it existed) means what it meant then
    options.update({o.name: o.legacy for o in table
                    if o.name not in options and o.legacy is not None})
    labels = manifest.source.get("labels")
    if "labels" in names and "labels" not in options and labels and Path(labels).is_file():
        options["labels"] = labels  # recorded by earlier versions only in the source's facts
    return sources.open_source(root, manifest.kind, **options)
