"""Point-cloud file readers: LAS/LAZ (laspy), PLY, XYZ/TXT and NPY, each into named columns.

Every reader returns ``{column name: 1-D array}`` holding at least the columns asked for that the
file has; :func:`select` then assembles the requested fields, naming the file and field when one
is missing. Failures raise :class:`SampleError` naming the file.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from packdata.errors import MissingExtraError, SampleError, require
from packdata.sources.base import STOPS, reason_of

LAS_SUFFIXES = (".las", ".laz")
TEXT_SUFFIXES = (".xyz", ".txt")
SUFFIXES = (*LAS_SUFFIXES, ".ply", *TEXT_SUFFIXES, ".npy")

#: fields that span several columns; any other field is one column of the same name
MULTI = {"xyz": ("x", "y", "z"), "rgb": ("red", "green", "blue"), "normals": ("nx", "ny", "nz")}
#: other spellings of a column, as PLY exporters (CloudCompare, PDAL) and text headers write them
ALIASES = {
    "red": ("r", "diffuse_red"), "green": ("g", "diffuse_green"), "blue": ("b", "diffuse_blue"),
    "intensity": ("i", "scalar_intensity"),
    "classification": ("class", "label", "scalar_classification"),
}
#: column meaning of headerless text / plain NPY, by column count
UNNAMED = {3: "x y z", 4: "x y z intensity", 6: "x y z red green blue",
           7: "x y z intensity red green blue"}


def columns_of(field: str) -> tuple[str, ...]:
    """The column names a field is made of."""
    return MULTI.get(field, (field,))


def read_columns(path: Path, wanted: list[str]) -> dict[str, np.ndarray]:
    """The columns of ``path`` (at least those of ``wanted`` it has)."""
    suffix = path.suffix.lower()
    try:
        if suffix in LAS_SUFFIXES:
            return _read_las(path, wanted)
        if suffix == ".ply":
            return _read_ply(path)
        if suffix in TEXT_SUFFIXES:
            return _read_text(path)
        if suffix == ".npy":
            return _read_npy(path)
    except (SampleError, MissingExtraError, *STOPS):
        raise
    except BaseException as exc:  # laspy, lazrs (panics too) and numpy raise many types
        raise SampleError(str(path), f"cannot read point cloud ({reason_of(exc)})") from None
    raise SampleError(str(path), f"unsupported point-cloud suffix '{suffix}'")


def select(table: dict[str, np.ndarray], fields: list[str], path: Path) -> np.ndarray:
    """The requested fields' columns side by side, as an n×F float64 array."""
    cols = []
    for field in fields:
        for name in columns_of(field):
            col = lookup(table, name)
            if col is None:
                have = ", ".join(sorted(table)) or "none"
                raise SampleError(str(path), f"field '{field}' not found (column '{name}'; "
                                             f"the file has: {have})")
            cols.append(np.asarray(col, dtype=np.float64))
    return np.stack(cols, axis=1)


def lookup(table: dict, name: str):
    """The column ``name`` (or an alias, in any common capitalisation) of ``table``, or None."""
    for candidate in (name, *ALIASES.get(name, ())):
        for key in (candidate, candidate.lower(), candidate.upper(), candidate.capitalize()):
            if key in table:
                return table[key]
    return None


def laz_backend_available() -> bool:
    laspy = require("laspy", "lidar", "reading LAS/LAZ files")
    return bool(laspy.LazBackend.detect_available())


def _read_las(path: Path, wanted: list[str]) -> dict[str, np.ndarray]:
    laspy = require("laspy", "lidar", "reading LAS/LAZ files")
    if path.suffix.lower() == ".laz" and not laz_backend_available():
        raise MissingExtraError("lazrs", "lidar", f"{path}: reading LAZ files")
    # Single-threaded lazrs: conversion parallelises across processes already, and the parallel
    # backend's thread pool deadlocks forked workers once the parent process has used it.
    backend = laspy.LazBackend.Lazrs if path.suffix.lower() == ".laz" else None
    with laspy.open(path.open("rb"), laz_backend=backend) as reader:
        header = reader.header
        expected = int(header.point_count)
        if not header.are_points_compressed:  # a damaged count must not become a huge allocation
            room = (path.stat().st_size - header.offset_to_point_data) // header.point_format.size
            if expected > room:
                raise SampleError(str(path), f"truncated: the header says {expected} points, "
                                             f"the file holds {max(room, 0)}")
        try:
            las = reader.read()
        except MemoryError:
            raise SampleError(str(path), f"the header says {expected} points, more than fit in "
                                         "memory: is the header damaged?") from None
    found = len(las.points)
    if found != expected:
        raise SampleError(str(path), f"truncated: the header says {expected} points, the file "
                                     f"holds {found}")
    _check_extent(las, path)
    # Only the dimensions asked for are converted; the others are listed (None) for errors.
    out: dict[str, np.ndarray | None] = {}
    for name in las.point_format.dimension_names:
        if name not in ("X", "Y", "Z"):
            asked = any(lookup({name: True}, w) is not None for w in wanted)
            out[name] = np.asarray(las[name]) if asked else None
    for name in ("x", "y", "z"):
        out[name] = np.asarray(getattr(las, name)) if name in wanted else None  # scaled + offset
    return out  # type: ignore[return-value]


def _check_extent(las, path: Path) -> None:
    """Refuse points that lie outside the header's bounding box: damaged point data (garbage in
    a LAZ file's compressed points may decode without an error, into wild coordinates). Compared
    as the stored integers, with one step of slack for a header's rounding."""
    if not len(las.points):
        return
    header = las.header
    raw = [np.asarray(las[d]) for d in ("X", "Y", "Z")]
    lo = np.array([r.min() for r in raw], np.float64)
    hi = np.array([r.max() for r in raw], np.float64)
    scales, offsets = np.asarray(header.scales, np.float64), np.asarray(header.offsets, np.float64)
    mins, maxs = np.asarray(header.mins, np.float64), np.asarray(header.maxs, np.float64)
    slack = 1 + 1e-9 * np.maximum(abs(lo), abs(hi))
    with np.errstate(all="ignore"):  # a zero scale in a damaged header: no box to compare with
        outside = (lo < (mins - offsets) / scales - slack) | (hi > (maxs - offsets) / scales + slack)
    if not outside.any():
        return
    if np.all(abs(mins - lo) <= 1) and np.all(abs(maxs - hi) <= 1):
        return  # a writer's known slip: the box given as the stored integers, matching them
    axis = int(np.argmax(outside))
    a, b = lo[axis] * scales[axis] + offsets[axis], hi[axis] * scales[axis] + offsets[axis]
    raise SampleError(str(path), f"damaged point data: {'xyz'[axis]} decodes to {a:.10g} … "
                                 f"{b:.10g}, outside the header's bounding box {mins[axis]:.10g} "
                                 f"… {maxs[axis]:.10g}")


def las_extent(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A LAS/LAZ file's coordinate bounds and scale (the step its integers stand for), as xyz
    arrays, from its header alone."""
    laspy = require("laspy", "lidar", "reading LAS/LAZ files")
    with path.open("rb") as f:
        header = laspy.LasHeader.read_from(f)
    return (np.asarray(header.mins, np.float64), np.asarray(header.maxs, np.float64),
            np.asarray(header.scales, np.float64))


_PLY_TYPES = {
    "char": "i1", "uchar": "u1", "short": "i2", "ushort": "u2", "int": "i4", "uint": "u4",
    "float": "f4", "double": "f8", "int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2",
    "int32": "i4", "uint32": "u4", "float32": "f4", "float64": "f8",
}


def _read_ply(path: Path) -> dict[str, np.ndarray]:
    data = path.read_bytes()
    end = data.find(b"end_header")
    if not data.startswith(b"ply") or end < 0:
        raise SampleError(str(path), "not a PLY file (no 'ply' magic or no end_header)")
    body = data.index(b"\n", end) + 1
    fmt, elements = None, []  # [(name, count, [(prop, type)])]
    for line in data[:end].decode("ascii", "replace").splitlines()[1:]:
        words = line.split()
        if not words or words[0] in ("comment", "obj_info"):
            continue
        if words[0] == "format":
            fmt = words[1]
        elif words[0] == "element":
            elements.append((words[1], int(words[2]), []))
        elif words[0] == "property":
            if words[1] == "list":
                elements[-1][2].append((words[-1], "list"))
            else:
                elements[-1][2].append((words[2], words[1]))
    if fmt not in ("ascii", "binary_little_endian", "binary_big_endian"):
        raise SampleError(str(path), f"unsupported PLY format '{fmt}'")
    if not elements or elements[0][0] != "vertex":
        raise SampleError(str(path), "PLY: the first element must be 'vertex'")
    _, count, props = elements[0]
    if any(t == "list" or t not in _PLY_TYPES for _, t in props):
        raise SampleError(str(path), "PLY: vertex properties must be scalars of a known type")
    if fmt == "ascii":
        table = np.loadtxt(io.BytesIO(data[body:]), ndmin=2, max_rows=count, dtype=np.float64)
        if table.shape != (count, len(props)):
            raise SampleError(str(path), f"truncated: {count} vertices declared, read {len(table)}")
        return {name: table[:, j] for j, (name, _) in enumerate(props)}
    order = "<" if fmt == "binary_little_endian" else ">"
    dtype = np.dtype([(name, order + _PLY_TYPES[t]) for name, t in props])
    if len(data) - body < count * dtype.itemsize:
        raise SampleError(str(path), f"truncated: {count} vertices declared, the file holds "
                                     f"{(len(data) - body) // dtype.itemsize}")
    rec = np.frombuffer(data, dtype=dtype, count=count, offset=body)
    return {name: rec[name] for name in dtype.names}


def _read_text(path: Path) -> dict[str, np.ndarray]:
    with path.open("rb") as f:
        first = f.readline().decode("utf-8", "replace").strip()
    names = first.lstrip("/#").replace(",", " ").split()
    header = bool(names) and not _numeric(names[0])
    with path.open() as f:
        table = np.loadtxt(f, ndmin=2, dtype=np.float64, skiprows=int(header), comments="#",
                           delimiter="," if "," in first else None)
    return _named(table, [n.lower() for n in names] if header else None)


def _numeric(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _read_npy(path: Path) -> dict[str, np.ndarray]:
    with path.open("rb") as f:
        array = np.load(f, allow_pickle=False)
    if array.dtype.names:
        return {name: array[name] for name in array.dtype.names}
    if array.ndim != 2:
        raise SampleError(str(path), f"expected an n×C array (C ≥ 3), got shape {array.shape}")
    return _named(array, None)


def _named(table: np.ndarray, names: list[str] | None) -> dict[str, np.ndarray]:
    if names is None:
        names = UNNAMED.get(table.shape[1], "x y z").split()
        names += [f"col{j}" for j in range(len(names), table.shape[1])]
    if table.shape[1] < 3 or len(names) != table.shape[1]:
        raise ValueError(f"{table.shape[1]} columns; expected x y z first"
                         + (f" and one per header name ({len(names)})" if names else ""))
    return {name: table[:, j] for j, name in enumerate(names)}
