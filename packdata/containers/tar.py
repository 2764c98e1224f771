"""Tar-shard container: uncompressed POSIX tar files in webdataset's naming, plus an offset index.

Layout of a dataset directory:

- ``shard-000000.tar`` …: each sample's fields as consecutive members named ``KEY.EXT`` (dots in
  keys become ``_``): an integer scalar ``label`` as ``KEY.cls`` (decimal text), encoded image
  bytes as ``KEY.png``/``KEY.jpg``, every other field as ``KEY.<field>.npy``. The ``webdataset``
  library and DALI's webdataset reader read these shards unchanged;
- ``index.npz`` (numpy, no pickle): per field ``<field>.shard`` (int32), ``<field>.offset`` and
  ``<field>.nbytes`` (int64) locating each record's payload bytes, and ``<field>.values`` for
  scalar fields, so labels need no member reads;
- ``manifest.json``: the manifest; ``extra.shards`` lists shard names and record counts;
- ``shard-000000.idx`` … and ``wids-index.json``: indexes for DALI's and wids' readers (see
  :mod:`packdata.reader_index`).

Reads memory-map the shards; where a shard's records sit at a constant stride (the usual case for
fixed-shape fields) a batch is one numpy gather through a strided view.
"""

from __future__ import annotations

import functools
import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from packdata.containers.base import Batch, Reader, Select, Writer, map_file
from packdata.containers.joined import byte_window, map_joined
from packdata.errors import ArgumentError, DatasetError, PackdataError
from packdata.manifest import Field, Manifest
from packdata.reader_index import idx_path, write_idx, write_wids_index
from packdata.verify import check_manifest

NAME = "tar"
SUFFIXES = (".tar",)
MANIFEST = "manifest.json"
INDEX = "index.npz"


def image_suffix(head: bytes) -> str:
    """The extension encoded image bytes get, from their first 4 bytes: png, jpg, else img."""
    return "png" if head.startswith(b"\x89PNG") else "jpg" if head[:2] == b"\xff\xd8" else "img"


def member_suffix(name: str, field: Field, value: np.ndarray) -> str:
    """The webdataset extension a field's member gets."""
    if field.codec == "image":
        return image_suffix(value[:4].tobytes())
    if name == "label" and field.shape == () and field.np_dtype.kind in "iu":
        return "cls"
    return f"{name}.npy"


@functools.lru_cache(maxsize=256)
def npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The .npy header for a C-order array (cached: fixed fields share one)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": dtype, "fortran_order": False, "shape": shape}
    )
    return buf.getvalue()


# The constant parts of a POSIX ustar header for a regular file (mode 0644, owner 0, time 0)
_MODE_OWNER = b"0000644\x000000000\x000000000\x00"  # mode, uid, gid
_MTIME = b"00000000000\x00"
_TAIL = b"0" + bytes(100) + b"ustar\x0000" + bytes(247)  # type, link name, magic, the rest
_CONSTANT_SUM = sum(_MODE_OWNER) + sum(_MTIME) + sum(b" " * 8) + sum(_TAIL)


def ustar_header(name: str, size: int) -> bytes:
    """A POSIX ustar header for a regular file (mode 0644, owner 0, time 0): assembled from
    constant parts, since building a TarInfo per member costs more than the rest of a
    conversion's main loop."""
    encoded = name.encode()
    if len(encoded) > 100 or size >= 8**11:
        info = tarfile.TarInfo(name)
        info.size = size
        return info.tobuf(tarfile.PAX_FORMAT)
    size_field = b"%011o\x00" % size
    checksum = _CONSTANT_SUM + sum(encoded) + sum(size_field)  # the checksum field counts as spaces
    return b"".join((encoded, bytes(100 - len(encoded)), _MODE_OWNER, size_field, _MTIME,
                     b"%06o\x00 " % checksum, _TAIL))


def parse_shard_size(text: str | int) -> tuple[int | None, int | None]:
    """``"10000"`` → at most 10,000 samples per shard; ``"512MB"`` → at most 512 MB per shard."""
    s = str(text).strip().upper()
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if s.endswith(unit):
            return None, int(float(s[: -len(unit)]) * scale)
    try:
        return int(s), None
    except ValueError:
        raise ArgumentError(f"shard size '{text}': expected a sample count or a size like 512MB") \
            from None


def destination(dst: Path, options: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Where a tar dataset goes: ``out/`` as given; ``out/cifar-%04d.tar`` is the directory ``out``
    with shards named by the pattern; ``out.tar`` is the directory ``out`` with ``out-000000.tar``…"""
    if dst.suffix.lower() != ".tar":
        return dst, options
    if "%" not in dst.name:
        return dst.with_suffix(""), {**options, "pattern": f"{dst.stem}-%06d.tar"}
    if dst.parent in (Path(""), Path(".")):
        raise DatasetError(f"{dst}: put the shard pattern inside a directory, e.g. out/{dst.name}")
    try:
        dst.name % 0
    except (TypeError, ValueError):
        raise DatasetError(f"{dst}: the shard pattern needs one integer field like %06d") from None
    return dst.parent, {**options, "pattern": dst.name}


class TarWriter(Writer):
    OPTIONS = {"shard_size": "10000", "pattern": "shard-%06d.tar"}

    def __init__(
        self, path: Path, fields: dict[str, Field], options: dict[str, Any]
    ) -> None:
        super().__init__(path, fields, options)
        self.max_count, self.max_bytes = parse_shard_size(self.options["shard_size"])
        path.mkdir(parents=True)
        self.shards: list[dict[str, Any]] = []
        self.file: Any = None  # the open shard
        self.offset = 0  # bytes written to the open shard
        self.index: dict[str, list] = {
            f"{n}.{col}": [] for n in fields for col in ("shard", "offset", "nbytes")
        }
        self.values = {n: [] for n, f in fields.items() if f.shape == ()}
        self.columns = {n: tuple(self.index[f"{n}.{col}"] for col in ("shard", "offset", "nbytes"))
                        for n in fields}  # the index lists each record appends to
        self.member_keys: dict[str, str] = {}  # member name stem → record key
        self.shard_first = 0  # the open shard's first record
        self.shard_keys: list[str] = []  # its records' member keys, for its DALI index
        self.suffixes = {n: [] for n, f in fields.items() if f.codec}  # png/jpg vary per record

    def _shard(self) -> Any:
        full = self.file is not None and (
            (self.max_count and self.shards[-1]["count"] >= self.max_count)
            or (self.max_bytes and self.offset >= self.max_bytes)
        )
        if self.file is None or full:
            self._close_shard()
            name = self.options["pattern"] % len(self.shards)
            self.shards.append({"name": name, "count": 0})
            self.file = open(self.path / name, "wb", buffering=1 << 20)  # noqa: SIM115
            self.offset = 0
        return self.file

    def _close_shard(self) -> None:
        if self.file is not None:
            end = self.offset + 1024  # two zero blocks end the archive
            self.file.write(bytes(1024 + (-end) % tarfile.RECORDSIZE))
            self.file.close()
            self.file = None
            lo, hi = self.shard_first, self.count
            columns = [(self.suffixes[n][lo:hi] if n in self.suffixes else
                        [member_suffix(n, f, np.zeros(0, f.np_dtype))] * (hi - lo),
                        self.columns[n][1][lo:hi], self.columns[n][2][lo:hi])
                       for n, f in self.fields.items()]
            write_idx(idx_path(self.path, self.shards[-1]["name"]), self.shard_keys, columns)
            self.shard_first, self.shard_keys = hi, []

    def append(self, key: str, record: dict[str, np.ndarray]) -> None:
        member_key = key.replace(".", "_")  # webdataset splits member names at the first dot
        other = self.member_keys.setdefault(member_key, key)
        if other != key:
            raise PackdataError(f"keys '{other}' and '{key}' both make tar members named "
                                f"'{member_key}.*'; rename one of the inputs")
        out = self._shard()
        for name, field in self.fields.items():
            value = record[name]
            suffix = member_suffix(name, field, value)
            if suffix == "cls":
                payload, skip = str(int(value)).encode(), 0
            elif suffix.endswith(".npy"):
                header = npy_header(value.dtype.str, value.shape)
                payload, skip = header + np.ascontiguousarray(value).tobytes(), len(header)
            else:
                payload, skip = value.tobytes(), 0
            header = ustar_header(f"{member_key}.{suffix}", len(payload))
            out.write(header + payload + bytes(-len(payload) % 512))
            data_start = self.offset + len(header)
            self.offset = data_start + len(payload) + (-len(payload) % 512)
            if name in self.suffixes:
                self.suffixes[name].append(suffix)
            shards, offsets, sizes = self.columns[name]
            shards.append(len(self.shards) - 1)
            offsets.append(data_start + skip)
            sizes.append(len(payload) - skip)
            if name in self.values:
                self.values[name].append(value)
        self.shard_keys.append(member_key)
        self.shards[-1]["count"] += 1
        self.count += 1

    def finish(self, manifest: Manifest) -> None:
        self._close_shard()
        arrays = {
            k: np.asarray(v, dtype=np.int32 if k.endswith(".shard") else np.int64)
            for k, v in self.index.items()
        }
        for name, vals in self.values.items():
            arrays[f"{name}.values"] = np.asarray(vals, dtype=self.fields[name].np_dtype)
        np.savez(self.path / INDEX, **arrays)
        manifest.extra["shards"] = self.shards
        write_wids_index(self.path, self.shards)
        (self.path / MANIFEST).write_text(manifest.to_json())  # last: what makes it a dataset

    def abort(self) -> None:
        if self.file is not None:
            self.file.close()


class TarReader(Reader):
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not (self.path / MANIFEST).is_file():
            raise DatasetError(f"{self.path}: no {MANIFEST}; not a packdata tar dataset")
        try:
            self._open()
        except PackdataError:
            raise
        except Exception as exc:  # numpy or the OS on a damaged index or shard list
            raise DatasetError(f"{self.path}: the dataset cannot be read ({type(exc).__name__}: "
                               f"{exc}); the dataset is damaged") from None

    def _open(self) -> None:
        self.manifest = read_manifest(self.path)
        check_manifest(self.manifest, self.path)
        self.index = _load_index(self.path / INDEX, self.manifest)
        shards = _shards(self.path, self.manifest)
        self.shard_names = [s["name"] for s in shards]
        self.shard_start = np.concatenate([[0], np.cumsum([s["count"] for s in shards])]).astype(
            np.int64)
        _check_index(self.path / INDEX, self.index, self.manifest, self.shard_start)
        self._maps: dict[int, np.ndarray] = {}
        # bytes each shard must hold: checked before any strided view is laid over it
        self._shard_end = np.zeros(len(shards), dtype=np.int64)
        for name in self.manifest.fields:
            ends = self.index[f"{name}.offset"] + self.index[f"{name}.nbytes"]
            np.maximum.at(self._shard_end, self.index[f"{name}.shard"], ends)
        self._views: dict[tuple[str, int], np.ndarray | None] = {}
        self._joined: tuple[np.ndarray, np.ndarray] | None | bool = False  # False: not tried
        self._windows: dict[Any, np.ndarray] = {}

    @staticmethod
    def detect(path: Path) -> bool:
        return (path.is_dir() and (path / MANIFEST).is_file() and (path / INDEX).is_file()
                and Manifest.is_packdata((path / MANIFEST).read_bytes()))

    def _map(self, shard: int) -> np.ndarray:
        if shard not in self._maps:
            path = self.path / self.shard_names[shard]
            if not path.is_file():
                raise DatasetError(f"{path}: shard missing; the dataset is incomplete")
            mapped = map_file(path)
            if len(mapped) < self._shard_end[shard]:
                raise DatasetError(
                    f"{path}: shard truncated ({len(mapped)} bytes, the index needs "
                    f"{self._shard_end[shard]}); the dataset is damaged"
                )
            self._maps[shard] = mapped
        return self._maps[shard]

    def _strided(self, name: str, shard: int) -> np.ndarray | None:
        """A (records, nbytes) view of one field in one shard, if its records sit at a fixed stride."""
        if (name, shard) not in self._views:
            a, b = self.shard_start[shard], self.shard_start[shard + 1]
            offsets = self.index[f"{name}.offset"][a:b]
            nbytes = int(self.manifest.fields[name].nbytes)
            view = None
            steps = np.diff(offsets)
            if len(offsets) and (len(steps) == 0 or (steps == steps[0]).all()):
                stride = int(steps[0]) if len(steps) else nbytes
                mm = self._map(shard)
                view = np.lib.stride_tricks.as_strided(
                    mm[offsets[0] :], shape=(len(offsets), nbytes), strides=(stride, 1),
                    writeable=False,
                )
            self._views[name, shard] = view
        return self._views[name, shard]

    def _joined_map(self) -> tuple[np.ndarray, np.ndarray] | None:
        """All shards mapped back to back (see :mod:`packdata.containers.joined`), once each
        was checked as :meth:`_map` checks it; None where that is not available, where a shard
        is damaged (the others still read, one by one), or for readers that fetch shards on
        demand (they override ``_map``)."""
        if self._joined is False:
            self._joined = None
            if type(self)._map is TarReader._map:
                try:
                    for shard in range(len(self.shard_names)):
                        self._map(shard)
                except DatasetError:
                    return None
                self._joined = map_joined([self.path / n for n in self.shard_names])
        return self._joined  # type: ignore[return-value]

    def _window(self, name: str, nbytes: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(byte address of each record of field ``name`` in the joined map, a window of
        ``nbytes`` rows over it), or None."""
        joined = self._joined_map()
        if joined is None:
            return None
        if name not in self._windows:
            whole, starts = joined
            self._windows[name] = starts[self.index[f"{name}.shard"]] + self.index[f"{name}.offset"]
        if nbytes not in self._windows:
            self._windows[nbytes] = byte_window(joined[0], nbytes)
        return self._windows[name], self._windows[nbytes]

    def _payloads(self, name: str, idx: np.ndarray) -> list[np.ndarray]:
        shard = self.index[f"{name}.shard"][idx]
        offset = self.index[f"{name}.offset"][idx]
        nbytes = self.index[f"{name}.nbytes"][idx]
        return [
            np.array(self._map(s)[o : o + n])
            for s, o, n in zip(shard.tolist(), offset.tolist(), nbytes.tolist())
        ]

    def _gather_fixed(
        self, name: str, field: Field, idx: np.ndarray, rows: np.ndarray | None = None
    ) -> np.ndarray:
        """Field ``name`` of records ``idx``; with ``rows``, only entry ``rows[j]`` of the first
        axis of record ``idx[j]`` (the other entries' bytes are not touched)."""
        shape = field.shape if rows is None else field.shape[1:]
        parts = 1 if rows is None else field.shape[0]
        nbytes = field.nbytes // parts

        def gather(view: np.ndarray, local: np.ndarray, sel: np.ndarray | None) -> np.ndarray:
            if sel is None:
                return view[local]
            return view.reshape(len(view), parts, nbytes)[local, sel]

        joined = self._window(name, nbytes) if len(idx) else None
        if joined is not None:  # records of any shards at any offsets: one gather
            addresses, window = joined
            at = addresses[idx] if rows is None else addresses[idx] + rows * nbytes
            return window[at].view(field.np_dtype).reshape(len(idx), *shape)
        shards = self.index[f"{name}.shard"][idx]
        first = int(shards[0]) if len(shards) else 0
        view = self._strided(name, first)
        if view is not None and (shards == first).all():  # one shard: one gather, no masks
            out = gather(view, idx - self.shard_start[first], rows)
        else:
            out = np.empty((len(idx), nbytes), dtype=np.uint8)
            for s in np.unique(shards).tolist():
                mask = shards == s
                view = self._strided(name, s)
                if view is None:
                    view = np.stack(self._payloads(name, idx[mask]))
                    local = np.arange(len(view))
                else:
                    local = idx[mask] - self.shard_start[s]
                out[mask] = gather(view, local, None if rows is None else rows[mask])
        return out.view(field.np_dtype).reshape(len(idx), *shape)

    def read(self, indices: np.ndarray, select: Select | None = None) -> Batch:
        idx = self.check_indices(indices)
        select = select or {}
        batch: Batch = {}
        for name, field in self.manifest.fields.items():
            if f"{name}.values" in self.index:
                batch[name] = self.index[f"{name}.values"][idx]
            elif field.variable:
                batch[name] = [
                    p.view(field.np_dtype).reshape(-1, *field.row_shape)
                    for p in self._payloads(name, idx)
                ]
            else:
                batch[name] = self._gather_fixed(name, field, idx, select.get(name))
        return batch

    def lengths(self, name: str) -> np.ndarray:
        field = self.check_variable(name)
        row_bytes = int(np.prod(field.row_shape, dtype=np.int64)) * field.np_dtype.itemsize
        return self.index[f"{name}.nbytes"] // row_bytes

    def close(self) -> None:
        self._views.clear()
        self._maps.clear()
        self._windows.clear()
        self._joined = False


def read_manifest(path: str | Path) -> Manifest:
    """The manifest of the tar dataset at ``path`` (checked: packdata JSON, a version this
    packdata reads)."""
    path = Path(path)
    try:
        text = (path / MANIFEST).read_text()
    except OSError as exc:
        raise DatasetError(f"{path}: not a packdata tar dataset (no readable {MANIFEST}: "
                           f"{exc.strerror})") from None
    return Manifest.from_json(text, str(path))


def shard_paths(path: str | Path) -> list[Path]:
    """The shard files of a tar dataset, in order (for webdataset or DALI readers)."""
    return [Path(path) / s["name"] for s in read_manifest(path).extra["shards"]]


WRITER = TarWriter
READER = TarReader


def _load_index(path: Path, manifest: Manifest) -> dict[str, np.ndarray]:
    """The per-record index of a tar dataset, checked against the manifest: one entry per record
    for every field (the shard, offset and size of its member; or its value, for scalars)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            index = {k: z[k] for k in z.files}
    except Exception as exc:  # numpy's messages (e.g. "contains pickled data") mislead here
        raise DatasetError(f"{path}: the record index cannot be read ({exc.__class__.__name__}); "
                           "the dataset is damaged") from None
    wanted = [f"{name}.{part}" for name in manifest.fields
              for part in ("shard", "offset", "nbytes")]
    for key in wanted:
        if key not in index:
            raise DatasetError(f"{path}: the record index has no '{key}'; the dataset is damaged")
        if len(index[key]) != manifest.count:
            raise DatasetError(f"{path}: '{key}' indexes {len(index[key])} records, the manifest "
                               f"{manifest.count}; the dataset is damaged")
    return index


def _shards(path: Path, manifest: Manifest) -> list[dict[str, Any]]:
    """The manifest's shard list: plain file names inside the dataset, counts adding up."""
    shards = manifest.extra.get("shards")
    ok = isinstance(shards, list) and all(
        isinstance(s, dict) and isinstance(s.get("name"), str) and isinstance(s.get("count"), int)
        and s["count"] >= 0 and s["name"] not in ("", ".", "..") and "/" not in s["name"]
        and "\\" not in s["name"] for s in shards)
    if not ok or sum(s["count"] for s in shards) != manifest.count:
        raise DatasetError(f"{path}: the manifest's shard list is damaged (names must be files "
                           "in the dataset, counts must add up to its records)")
    return shards


def _check_index(path: Path, index: dict[str, np.ndarray], manifest: Manifest,
                 shard_start: np.ndarray) -> None:
    """Every record's member lies in the shard that holds it, at a non-negative offset, with
    the size its field needs: checked before any view is laid over a shard."""
    counts = np.diff(shard_start)
    expected_shard = np.repeat(np.arange(len(counts)), counts)
    for name, field in manifest.fields.items():
        shard, offset, nbytes = (index[f"{name}.{col}"] for col in ("shard", "offset", "nbytes"))
        if any(a.dtype.kind not in "iu" for a in (shard, offset, nbytes)) or (len(offset) and (
                offset.min() < 0 or nbytes.min() < 0)) or not np.array_equal(shard, expected_shard):
            raise DatasetError(f"{path}: the index of '{name}' points outside its shards; the "
                               "dataset is damaged")
        if field.variable:
            row = int(np.prod(field.row_shape, dtype=np.int64)) * field.np_dtype.itemsize
            bad = (nbytes % row != 0) if row else (nbytes != 0)
        elif f"{name}.values" in index:  # read from the index; the member may be text (.cls)
            bad = False
        else:
            bad = nbytes != field.nbytes
        if np.any(bad):
            raise DatasetError(f"{path}: the index of '{name}' gives sizes that do not fit its "
                               f"field ({field.dtype} {list(field.shape)}); the dataset is "
                               "damaged (or the manifest edited)")
        values = index.get(f"{name}.values")
        if values is not None and (values.dtype != field.np_dtype or len(values) != manifest.count):
            raise DatasetError(f"{path}: the index's values of '{name}' do not match the "
                               "manifest; the dataset is damaged")
