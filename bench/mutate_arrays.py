"""Mutations of a dataset's per-record arrays, for ``bench/fuzz_readers.py --arrays``: the keys
with their offsets, hashes and order, the records' checksums, the table of the arrays' block
checksums and the manifest's checksum (in ``records.npz``, tar's ``index.npz`` or the HDF5
file's ``__records__`` group), and each container's own tables (LMDB's ``__offsets__`` and
length tables in data.mdb, HDF5's offsets of variable fields, tar's index columns).

Each mutation changes the stored bytes (one that would not, e.g. zeroing an array of zeros, is
drawn again), through the plain libraries (zipfile, h5py, lmdb): flipped bits in one array,
one array zeroed, two differing entries of one array swapped, one array deleted, or a coherent
rewrite: the keys reversed or renamed, with their offsets, hashes and order and the block
checksums recomputed as a writer would (the manifest's checksum left as it was: what covers the
table is what catches it).
"""

from __future__ import annotations

import io
import random
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

KINDS = ("flip", "flip", "zero", "swap", "delete", "rewrite")


@dataclass
class Array:
    """Where one stored array's bytes lie: ``file`` at ``start`` (``nbytes``, rows of ``row``
    bytes), and how its store names it (``store``: npz, h5 or lmdb; ``name``)."""

    name: str
    file: Path
    start: int
    nbytes: int
    row: int
    store: str


def arrays_of(path: Path) -> list[Array]:
    """The per-record arrays of the dataset at ``path``."""
    if path.is_file():
        return _h5_arrays(path)
    if (path / "data.mdb").is_file():
        return _npz_arrays(path / "records.npz", lambda n: True) + _lmdb_tables(path)
    return _npz_arrays(path / "index.npz", lambda n: True)


def _npz_arrays(npz: Path, wanted) -> list[Array]:
    from packdata.recordmeta import _members

    members = _members(npz, npz.stat().st_size).arrays
    return [Array(name, npz, start, size, int(dtype.itemsize * np.prod(shape[1:], dtype=int)),
                  "npz") for name, (start, size, dtype, shape) in members.items() if wanted(name)]


def _h5_arrays(path: Path) -> list[Array]:
    import h5py

    out = []
    with h5py.File(path, "r") as f:
        names = [f"__records__/{n}" for n in f["__records__"]] + \
            [n for n in f if n.endswith("_offsets")]
        for name in names:
            ds = f[name]
            out.append(Array(name, path, ds.id.get_offset(), ds.id.get_storage_size(),
                             ds.dtype.itemsize, "h5"))
    return out


def _forget_envs() -> None:
    """Close the LMDB environments packdata keeps in this process: LMDB refuses to open files
    one of them has open (or had, if their device and inode numbers come back)."""
    from packdata.containers import lmdbenv

    for key in list(lmdbenv._envs):
        lmdbenv._envs.pop(key)[2].close()


def _lmdb_tables(path: Path) -> list[Array]:
    import lmdb

    from packdata.containers.lmdbcheck import Tree

    _forget_envs()
    with lmdb.open(str(path), readonly=True, lock=False) as env:
        info = env.info()
        with env.begin() as txn:
            keys = [k for k, _ in txn.cursor() if k.startswith(b"__") and k != b"__manifest__"]
    tree = Tree(path, info["last_pgno"], info["last_txnid"])
    out = []
    for key in keys:
        start, size = tree.locate(key)
        out.append(Array(key.decode(), path / "data.mdb", start, size, 8, "lmdb"))
    return out


def mutate_arrays(path: Path, rng: random.Random) -> str:
    """Damage one per-record array of the dataset at ``path`` in place; what was done."""
    how = rng.choice(KINDS)
    if how == "rewrite":
        return rewrite_keys(path, rng.choice(["reversed", "renamed"]))
    arrays = [a for a in arrays_of(path) if a.nbytes]
    target = rng.choice(arrays)
    if how == "delete":
        delete(path, target)
        return f"{target.name}: deleted"
    with open(target.file, "r+b") as f:
        f.seek(target.start)
        data = bytearray(f.read(target.nbytes))
        before = bytes(data)
        if how == "flip":
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            what = "bits flipped"
        elif how == "zero":
            data[:] = bytes(len(data))
            what = "zeroed"
        else:
            rows = len(data) // target.row
            pairs = [(a, b) for a in range(rows) for b in range(a + 1, rows)
                     if data[a * target.row : (a + 1) * target.row]
                     != data[b * target.row : (b + 1) * target.row]]
            if not pairs:
                return mutate_arrays(path, rng)
            a, b = rng.choice(pairs[:5000])
            ra, rb = slice(a * target.row, (a + 1) * target.row), \
                slice(b * target.row, (b + 1) * target.row)
            data[ra], data[rb] = data[rb], data[ra]
            what = f"entries {a} and {b} swapped"
        if bytes(data) == before:  # nothing changed (zeros zeroed): draw again
            return mutate_arrays(path, rng)
        f.seek(target.start)
        f.write(data)
    return f"{target.name}: {what}"


def delete(path: Path, target: Array) -> None:
    if target.store == "h5":
        import h5py

        with h5py.File(path, "r+") as f:
            del f[target.name]
    elif target.store == "lmdb":
        import lmdb

        _forget_envs()
        with lmdb.open(str(path), map_size=1 << 30) as env, env.begin(write=True) as txn:
            txn.delete(target.name.encode())
    else:
        rewrite_npz(target.file, {}, drop={target.name})


def rewrite_npz(npz: Path, arrays: dict[str, np.ndarray], drop: set[str] = frozenset()) -> None:
    """``npz`` with members ``arrays`` replaced (or added) and ``drop`` left out, the others
    copied as they are."""
    out = io.BytesIO()
    with zipfile.ZipFile(npz) as old, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as new:
        for info in old.infolist():
            name = info.filename[:-4]
            if name in drop or name in arrays:
                continue
            new.writestr(info, old.read(info))
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
            new.writestr(f"{name}.npy", buffer.getvalue())
    npz.write_bytes(out.getvalue())


def rewrite_keys(path: Path, how: str) -> str:
    """The keys rewritten coherently: reversed (record ``i`` gets the key of record ``n-1-i``)
    or renamed (each with ``~`` appended), their offsets, hashes and order recomputed, and the
    block checksums of every array recomputed, as a writer makes them; the manifest's checksum
    is left as it was."""
    from packdata import containers
    from packdata.recordmeta import DTYPES, Keys
    from packdata.recordmeta import arrays_of as record_arrays

    reader = containers.for_existing(path).READER(path)
    m = reader.manifest
    keys = list(m.keys)
    keys = keys[::-1] if how == "reversed" else [k + "~" for k in keys]
    arrays = record_arrays(Keys.from_list(keys), np.asarray(m.checksums))
    tables = []
    if getattr(m, "checks", None) is not None:  # format 3 (a format-2 dataset has no table)
        from packdata.blockchecks import TABLE, block_table

        tables = [s.data for name, s in m.checks.sections.items() if name not in DTYPES]
        arrays[TABLE] = block_table([*arrays.values(), *tables])
    arrays = {k: np.array(v) for k, v in arrays.items()}  # off the files about to change
    reader.close()
    del reader, m, tables
    _forget_envs()
    if path.is_file():
        import h5py

        with h5py.File(path, "r+") as f:
            for name, array in arrays.items():
                del f[f"__records__/{name}"]
                f.create_dataset(f"__records__/{name}", data=array)
    elif (path / "data.mdb").is_file():
        rewrite_npz(path / "records.npz", arrays)
    else:
        rewrite_npz(path / "index.npz", {f"__records__.{k}": v for k, v in arrays.items()})
    return f"keys {how}, with their arrays and block checksums"
