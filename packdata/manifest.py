"""The manifest: a dataset's self-description, stored as JSON inside every container.

Version 2: O(1) in the number of records. Keys and checksums live beside it in the container
as arrays (:mod:`packdata.recordmeta`), which readers attach (:meth:`Manifest.attach`); field
dtypes are byte-order pinned (``"<f4"``). Version 1 (keys and CRC-32 checksums as JSON lists)
is still read."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from packdata.blockchecks import TABLE, BlockChecks, block_table
from packdata.checksum import EntryChecks
from packdata.errors import ArgumentError, DatasetError
from packdata.recordmeta import DTYPES, Keys, arrays_of, from_arrays

#: 3: checksums of the per-record arrays' blocks; 2: XXH3-64 record checksums; 1: CRC-32 ones
FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
PER_RECORD = ("keys", "checksums")  # in the container as arrays, not in the JSON (version 2)
#: the record arrays' entry holding the checksum of the manifest JSON (stored apart from it)
HEADER_HASH = "manifest_hash"


def header_hash(text: str | bytes, table: np.ndarray | None = None) -> np.ndarray:
    """The checksum of a manifest's JSON as stored: XXH3-64 of its bytes, then (format 3) of
    the table of the record arrays' block checksums (:mod:`packdata.blockchecks`); one uint64."""
    h = xxhash.xxh3_64(text.encode() if isinstance(text, str) else bytes(text))
    if table is not None:
        h.update(np.ascontiguousarray(table, dtype="<u8").data)
    return np.array([h.intdigest()], dtype="<u8")


@dataclass(frozen=True)
class Field:
    """One per-record field: its dtype and shape.

    A shape whose first entry is ``None`` is variable-length along that axis (token ids, encoded
    image bytes); every other field has the same fixed shape in every record, which is what lets a
    batch be one gather from memory-mapped bytes.
    """

    dtype: str
    shape: tuple[int | None, ...]
    codec: str | None = None  # how to decode the stored bytes, e.g. "image" for PNG/JPEG bytes
    #: this field holds one checksum per entry of these fields' first axis
    #: (:class:`packdata.checksum.EntryChecks`): a read of one entry is checked by hashing it alone
    checks_entries_of: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        # byte order pinned: "<f4", "|u1" (an invalid one is refused by check_manifest)
        with contextlib.suppress(TypeError, ValueError):
            object.__setattr__(self, "dtype", np.dtype(self.dtype).str)
        if any(s is None for s in self.shape[1:]):
            raise ArgumentError(f"only the first axis may be variable, got shape {self.shape}")
        if self.checks_entries_of is not None:
            object.__setattr__(self, "checks_entries_of", tuple(self.checks_entries_of))

    @property
    def variable(self) -> bool:
        return bool(self.shape) and self.shape[0] is None

    @functools.cached_property  # (read per batch; a frozen field's dtype never changes)
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def row_shape(self) -> tuple[int, ...]:
        """Shape of one row along the variable axis (``()`` for a 1-D variable field)."""
        return tuple(self.shape[1:])  # type: ignore[arg-type]

    @functools.cached_property
    def nbytes(self) -> int:
        """Bytes per record of a fixed field."""
        if self.variable:
            raise ArgumentError("a variable-length field has no fixed size")
        return int(np.prod(self.shape, dtype=np.int64)) * self.np_dtype.itemsize

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape)}
        if self.codec:
            d["codec"] = self.codec
        if self.checks_entries_of:
            d["checks_entries_of"] = list(self.checks_entries_of)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Field:
        return cls(dtype=d["dtype"], shape=tuple(d["shape"]), codec=d.get("codec"),
                   checks_entries_of=d.get("checks_entries_of"))

    def check(self, name: str, value: np.ndarray) -> None:
        """Raise ValueError unless ``value`` fits this field."""
        if value.dtype != self.np_dtype:
            raise ArgumentError(f"field '{name}': expected dtype {self.dtype}, got {value.dtype}")
        expected = self.row_shape if self.variable else self.shape
        got = value.shape[1:] if self.variable else value.shape
        if tuple(got) != tuple(expected) or (self.variable and value.ndim != len(self.shape)):
            shape = ["N" if s is None else s for s in self.shape]
            raise ArgumentError(f"field '{name}': expected shape {shape}, got {list(value.shape)}")


@dataclass
class Manifest:
    """Everything a reader needs to interpret a container, and what made it."""

    container: str
    kind: str
    fields: dict[str, Field]
    count: int = 0
    classes: list[str] | None = None
    source: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    keys: Keys = field(default_factory=lambda: Keys.from_list([]))
    checksums: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype="<u8"))
    skipped: list[dict[str, str]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # kind-specific facts (e.g. per-cloud counts)
    version: int = FORMAT_VERSION
    #: the JSON this manifest was read from, as stored (None for one made in memory); not a
    #: dataclass field (unannotated), so never part of the JSON or of comparisons
    stored = None
    #: the checks of its record arrays' blocks (format 3, once attached), likewise
    checks = None

    def __post_init__(self) -> None:
        if not isinstance(self.keys, Keys):  # given as a list: held as arrays all the same
            self.keys = Keys.from_list(self.keys)
        if not isinstance(self.checksums, np.ndarray):
            self.checksums = np.array(self.checksums, dtype="<u8")

    def to_json(self) -> str:
        """The JSON header: per-record keys and checksums are not in it (the container stores
        them as arrays beside it)."""
        d = {f.name: getattr(self, f.name) for f in dataclass_fields(self) if f.name not in PER_RECORD}
        d["fields"] = {k: f.to_dict() for k, f in self.fields.items()}
        return json.dumps({"packdata": d}, separators=(",", ":"), allow_nan=False)  # strict JSON

    def record_arrays(self, tables: Sequence[np.ndarray] = ()) -> dict[str, np.ndarray]:
        """The arrays a container stores beside this manifest's JSON: the record keys and
        checksums, the checksums of their blocks and of the container's own per-record
        ``tables`` (in the order its reader lists them: :meth:`attach_records`), and the
        checksum of the JSON and of those (:meth:`check_header`)."""
        arrays = arrays_of(self.keys, self.checksums)
        if self.version < 3:
            return {**arrays, HEADER_HASH: header_hash(self.to_json())}
        table = block_table([*arrays.values(), *tables])
        return {**arrays, TABLE: table, HEADER_HASH: header_hash(self.to_json(), table)}

    def check_header(self, stored_hash: np.ndarray | None, where: str | Path,
                     table: np.ndarray | None = None) -> None:
        """Refuse a manifest that is not the JSON written at conversion: its checksum, stored
        apart from it with the record arrays, must match (from format 3 it covers the table of
        the record arrays' block checksums too, ``table``). A manifest edited by hand could
        otherwise make the records read as other dtypes, shapes or fields without any error,
        and record arrays rewritten with their checksums could serve other keys. Only
        version-1 datasets were written without it."""
        if self.stored is None:  # made in memory, not read
            return
        if stored_hash is None and self.version >= 2:
            raise DatasetError(f"{where}: the manifest's checksum is missing (format "
                               f"{self.version} stores it with the record arrays); the dataset "
                               "is damaged: restore it or convert the dataset again")
        if stored_hash is None:
            return
        if self.version >= 3 and (table is None or table.ndim != 1
                                  or table.dtype != np.dtype("<u8")):
            raise DatasetError(f"{where}: the checksums of the record arrays ('{TABLE}') are "
                               "missing or damaged; the dataset is damaged (run `packdata "
                               "verify`)")
        if stored_hash.shape != (1,) or stored_hash.dtype != np.dtype("<u8") or \
                int(stored_hash[0]) != int(header_hash(
                    self.stored, table if self.version >= 3 else None)[0]):
            covered = "" if self.version < 3 else \
                ", which covers the checksums of the record arrays too"
            raise DatasetError(
                f"{where}: the manifest does not match its checksum{covered} (one was edited, "
                "or the dataset is damaged); packdata reads a manifest only as conversion wrote "
                "it: restore the original manifest or convert the dataset again")

    def attach(self, keys: Keys, checksums: np.ndarray) -> None:
        """The per-record arrays a container stores beside a version-2 manifest."""
        self.keys, self.checksums = keys, checksums

    def attach_records(self, arrays: dict[str, np.ndarray], where: str | Path,
                       tables: dict[str, tuple[np.ndarray, bool]] | None = None) -> None:
        """Attach the record arrays stored beside this (version 2 or later) manifest, once
        its checksum matched: ``arrays`` are the keys', checksums', the table of block
        checksums and the manifest's checksum, by name; ``tables`` the container's own
        per-record arrays (name → (array, whether row ``i`` is record ``i``'s)), in the order
        its writer passed them to :meth:`record_arrays`."""
        table = arrays.get(TABLE)
        self.check_header(arrays.get(HEADER_HASH), where, table)
        keys, checksums = from_arrays(arrays, self.count, where)
        if self.version >= 3:
            sections = {name: (arrays[name], name == "checksums") for name in DTYPES}
            keys.checks = self.checks = BlockChecks(table, {**sections, **(tables or {})},
                                                    self.count, where)
        self.attach(keys, checksums)

    @staticmethod
    def is_packdata(text: str | bytes) -> bool:
        """Whether ``text`` is a packdata manifest (of any version): what makes a file or folder
        a packdata dataset, e.g. one ``--overwrite`` may replace."""
        try:
            return isinstance(json.loads(text).get("packdata"), dict)
        except (ValueError, AttributeError, TypeError):
            return False

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Manifest:
        try:
            d = json.loads(text)["packdata"]
        except (ValueError, KeyError, TypeError) as exc:
            raise DatasetError(f"{where}: the manifest is not packdata JSON ({exc})") from exc
        if not isinstance(d, dict):
            raise DatasetError(f"{where}: the manifest is not packdata JSON (no object)")
        if d.get("version") not in READABLE_VERSIONS:
            raise DatasetError(
                f"{where}: manifest version {d.get('version')!r}; this packdata reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}"
            )
        if d["version"] != 1 and set(d) & set(PER_RECORD):
            raise DatasetError(f"{where}: the manifest is damaged (a version-2 manifest holds no "
                               "per-record lists)")
        try:
            d["fields"] = {k: Field.from_dict(v) for k, v in d["fields"].items()}
            if d["version"] == 1:  # the lists themselves; version 2 attaches arrays
                d["keys"] = Keys.from_list(d.get("keys", []))
                d["checksums"] = np.array(d.get("checksums", []), dtype="<u8")
            made = cls(**d)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # an edited manifest
            raise DatasetError(f"{where}: the manifest is damaged ({type(exc).__name__}: {exc})"
                               ) from None
        made.stored = text.encode() if isinstance(text, str) else bytes(text)
        return made

    @property
    def entry_checks(self) -> EntryChecks | None:
        """The per-entry checksums its fields declare, if any (format 2)."""
        return EntryChecks.declared(self.fields) if self.version >= 2 else None

    @property
    def fixed_fields(self) -> dict[str, Field]:
        return {k: f for k, f in self.fields.items() if not f.variable}

    @property
    def variable_fields(self) -> dict[str, Field]:
        return {k: f for k, f in self.fields.items() if f.variable}


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
    _check_entry_checks(manifest, where)
    if len(manifest.keys) != count:
        raise DatasetError(f"{where}: the manifest lists {len(manifest.keys)} keys for {count} "
                           "records; the dataset is damaged")
    if len(manifest.checksums) and len(manifest.checksums) != count:
        raise DatasetError(f"{where}: the manifest lists {len(manifest.checksums)} checksums for "
                           f"{count} records; the dataset is damaged")


def _check_entry_checks(manifest: Manifest, where: str | Path) -> None:
    """A declaration of entry checksums names fields that hold K entries each, beside fixed
    fields only, in one uint64 field of K values."""
    declaring = [n for n, f in manifest.fields.items() if f.checks_entries_of is not None]
    if not declaring:
        return
    name = declaring[0]
    f = manifest.fields[name]
    entries_of = f.checks_entries_of or ()
    problem = None
    if len(declaring) > 1:
        problem = f"fields {declaring} each declare entry checksums (one may)"
    elif manifest.version < 2 or f.dtype != "<u8" or len(f.shape) != 1:
        problem = f"'{name}' declares entry checksums but is {f.dtype} {list(f.shape)}"
    elif not entries_of or not all(isinstance(e, str) and e in manifest.fields and e != name
                                   for e in entries_of):
        problem = f"'{name}' checks entries of {list(entries_of)}, not fields of the dataset"
    elif manifest.variable_fields:
        problem = f"entry checksums beside variable fields {list(manifest.variable_fields)}"
    elif any(manifest.fields[e].shape[:1] != f.shape for e in entries_of):
        problem = f"'{name}' holds {f.shape[0]} checksums, not one per entry of {list(entries_of)}"
    if problem:
        raise DatasetError(f"{where}: {problem}; the manifest is damaged")
