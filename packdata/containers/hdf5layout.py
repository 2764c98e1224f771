"""What an HDF5 dataset file says of itself (where each dataset lies, its shape and dtype, the
manifest), read with h5py once per file and process, and the checks a reader makes of it.

Opening a file through h5py opens each object it reads with several library calls, and
``packdata.open`` paid that twice (detection, then the open). The layout is kept in the process,
found again by the file's identity (:mod:`packdata.kept`), so an unchanged file reopened here (a
script that opens per epoch) is opened without h5py; a file replaced or rewritten is read anew.
The manifest's bytes are read from the file at each open (where they lie in one piece), never
kept: what the header check sees is what the file holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packdata.containers.base import unreadable
from packdata.containers.joined import map_kept
from packdata.errors import DatasetError
from packdata.kept import KeptByFiles
from packdata.manifest import Field

MANIFEST = "manifest"
RECORDS = "__records__"


@dataclass(frozen=True)
class Stored:
    """One HDF5 dataset: where its bytes start in the file (None: nothing allocated, or not
    stored in one piece), its shape and dtype."""

    offset: int | None
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class Layout:
    """The datasets of a file's root and of its records group (by path), and its manifest."""

    datasets: dict[str, Stored]
    #: the manifest's value where it is not stored in one piece (else read at each open)
    manifest_value: Any = None

    def manifest(self, whole: np.ndarray) -> Any:
        """The manifest as h5py would read it (bytes, trailing NULs dropped), from ``whole``
        (the file's map) where it lies in one piece; None where the file has none."""
        stored = self.datasets.get(MANIFEST)
        if stored is None or stored.shape != ():
            return None
        if not _in_one_piece(stored):
            return self.manifest_value
        end = stored.offset + stored.dtype.itemsize
        return bytes(whole[stored.offset : end]).rstrip(b"\0") if end <= len(whole) else b""


def _in_one_piece(stored: Stored) -> bool:
    """Whether a scalar string's bytes lie in the file in one piece (read there at each open)."""
    return stored.offset is not None and stored.dtype.kind == "S"


def layout_of(path: Path) -> Layout | None:
    """The layout of the HDF5 file at ``path`` (kept: see the module's docstring); None where
    the file is not HDF5. h5py's errors on a damaged file propagate (callers name the file)."""
    return KEPT.get([path], lambda _: _read(path))


def _read(path: Path) -> Layout | None:
    import h5py

    if not h5py.is_hdf5(path):
        return None
    datasets: dict[str, Stored] = {}
    manifest_value = None
    with h5py.File(path, "r") as f:
        for prefix, group in (("", f), (f"{RECORDS}/", f.get(RECORDS))):
            if not isinstance(group, h5py.Group):
                continue
            for name, item in group.items():
                if isinstance(item, h5py.Dataset):
                    datasets[prefix + name] = Stored(item.id.get_offset(), tuple(item.shape),
                                                     item.dtype)
        stored = datasets.get(MANIFEST)
        if stored is not None and stored.shape == () and not _in_one_piece(stored):
            manifest_value = f[MANIFEST][()]
    return Layout(datasets, manifest_value)


#: layouts kept in the process (a few datasets opened in turn)
KEPT: KeptByFiles[Layout] = KeptByFiles(keep=8)


def mapped(layout: Layout, whole: np.ndarray, path: Path, name: str) -> np.ndarray | None:
    """The 1-D dataset ``name`` as a view of the mapped file (None if absent)."""
    stored = layout.datasets.get(name)
    if stored is None or len(stored.shape) != 1:
        return None
    return view_of(stored, whole, path, name)


def view_of(stored: Stored, whole: np.ndarray, path: Path, name: str) -> np.ndarray:
    """Dataset ``name``'s values, shaped as stored, as a view of ``whole`` (the mapped file);
    zeros where nothing is allocated (an empty dataset). A DatasetError where the file ends
    before it does."""
    if stored.offset is None:
        return np.zeros(stored.shape, dtype=stored.dtype)
    size = int(np.prod(stored.shape, dtype=np.int64)) * stored.dtype.itemsize
    if stored.offset + size > len(whole):
        raise DatasetError(f"{path}: truncated ('{name}' ends at {stored.offset + size}, the file "
                           f"holds {len(whole)} bytes); the dataset is damaged")
    return whole[stored.offset : stored.offset + size].view(stored.dtype).reshape(stored.shape)


def check_rows(layout: Layout, path: Path, name: str, rows: int | None) -> Stored:
    """Dataset ``name``, of ``rows`` rows where given: a damaged file raises DatasetError here,
    before a KeyError or a wrong sample."""
    stored = layout.datasets.get(name)
    if stored is None:
        raise DatasetError(f"{path}: no dataset '{name}'; the dataset is damaged")
    if rows is not None and (not stored.shape or stored.shape[0] != rows):
        raise DatasetError(f"{path}: '{name}' has shape {stored.shape}, expected {rows} rows; "
                           "the dataset is damaged")
    return stored


def check_field(stored: Stored, path: Path, name: str, field: Field) -> None:
    """The stored dataset holds what the manifest says: same dtype, same per-record shape."""
    expected = field.row_shape if field.variable else field.shape
    if stored.dtype != field.np_dtype or tuple(stored.shape[1:]) != tuple(expected):
        raise DatasetError(f"{path}: '{name}' is stored as {stored.dtype} {list(stored.shape)}, "
                           f"the manifest says {field.dtype} {list(field.shape)}; the dataset "
                           "is damaged")


def offsets_name(name: str) -> str:
    """The dataset holding the record offsets of variable field ``name``."""
    return f"{name}_offsets"


def record_offsets(layout: Layout, whole: np.ndarray, path: Path, name: str, rows: int
                   ) -> np.ndarray:
    """A variable field's record offsets, mapped (not read: opening stays flat in the record
    count). Its ends are checked here; a damaged offset inside gives a record of wrong bytes
    (its checksum fails) or none, never a read outside the field."""
    offsets = mapped(layout, whole, path, offsets_name(name))
    if offsets is None or offsets.dtype.kind not in "iu" or (len(offsets) and (
            offsets[0] != 0 or offsets[-1] != rows)):
        raise DatasetError(f"{path}: '{offsets_name(name)}' does not mark records within the "
                           f"{rows} rows of '{name}'; the dataset is damaged")
    return offsets.astype(np.int64, copy=False)


def damaged(path: Path) -> str | None:
    """Why the HDF5 file at ``path``, a packdata dataset by its contents (the record arrays),
    cannot be read; None where nothing says it is one."""
    if not path.is_file():
        return None
    try:
        layout = layout_of(path)
    except Exception:  # h5py cannot read it: nothing says it is packdata's
        return None
    if layout is None or not {f"{RECORDS}/keys", f"{RECORDS}/checksums"} <= set(layout.datasets):
        return None
    return unreadable(layout.manifest(map_kept(path)), path)
