"""The per-record arrays' own checksums (packdata.blockchecks, format 3): keys never served
unchecked, a damaged array named by the read that touches it and by `packdata verify`, a
rewrite of the arrays with their checksums refused at open, opening flat in the records; and
format-2 datasets still read, with the checks they can have."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

import packdata
from packdata.blockchecks import BLOCK_BYTES, BlockChecks, block_table
from packdata.errors import DatasetError
from packdata.manifest import header_hash
from packdata.verification import verify
from tests.conftest import load_script

mutations = load_script(Path(__file__).resolve().parents[1] / "bench" / "mutate_arrays.py",
                        "mutate_arrays")
RECORD_ARRAYS = ("keys", "key_offsets", "key_hashes", "key_order", "checksums")


def copy_of(packed, container, tmp_path) -> Path:
    src = packed[container]
    dst = tmp_path / src.name
    (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    return dst


def array(path: Path, name: str):
    """The stored array ``name`` (a record array, or a container's table) of the dataset."""
    found = [a for a in mutations.arrays_of(path)
             if a.name.rsplit("/", 1)[-1].rsplit(".", 1)[-1] == name or a.name == name]
    assert len(found) == 1, (name, [a.name for a in mutations.arrays_of(path)])
    return found[0]


def flip(target, at: int = 0) -> None:
    with open(target.file, "r+b") as f:
        f.seek(target.start + at)
        byte = f.read(1)[0]
        f.seek(target.start + at)
        f.write(bytes([byte ^ 0x10]))


def test_a_table_of_block_checksums_checks_each_block_once_and_names_a_damaged_one():
    data = np.arange(3 * BLOCK_BYTES // 8 + 5, dtype="<i8")  # 4 blocks, the last one short
    table = block_table([data])
    assert len(table) == 4
    assert len(set(block_table([np.zeros(2 * BLOCK_BYTES, np.uint8)]).tolist())) == 2  # seeded
    rows = np.arange(3 * 50_000, dtype="<i8").reshape(-1, 3)  # 24-byte rows across blocks
    assert np.array_equal(block_table([rows]), block_table([rows.reshape(-1).view(np.uint8)]))
    checks = BlockChecks(table, {"offsets": (data, True)}, len(data), "here")
    checks.rows("offsets", [0, 8192])  # rows of blocks 0 and 1
    assert checks.ok.tolist() == [True, True, False, False] and checks.records_left == 2
    damaged = data.copy()
    damaged[-1] += 1
    bad = BlockChecks(table, {"offsets": (damaged, True)}, len(data), "here")
    bad.records(np.array([0, 1]))
    with pytest.raises(DatasetError, match=r"here: the record array 'offsets' does not match "
                       r"its checksum \(entries 24,576-24,580\)"):
        bad.records(np.array([len(data) - 1]))
    assert bad.damaged() == ["the record array 'offsets' does not match its checksum (entries "
                             "24,576-24,580)"]
    with pytest.raises(DatasetError, match="hold 3 blocks, their checksums 4"):
        BlockChecks(table, {"offsets": (data[:-10], True)}, len(data), "here")


def test_opening_checks_no_block_and_a_key_checks_only_its_own(packed, container):
    ds = packdata.open(packed[container])
    checks = ds.manifest.checks
    assert ds.manifest.version == 3 and not checks.ok.any()  # opening: the table alone
    assert ds.keys[5] == packdata.open(packed[container]).keys.data[  # the key as stored
        int(ds.keys.offsets[5]) : int(ds.keys.offsets[6])].tobytes().decode()
    touched = {checks.sections[n].first for n in ("key_offsets", "keys")}
    assert set(np.flatnonzero(checks.ok).tolist()) == touched
    ds[[0, 1, 2]]  # a checked read: the record tables' blocks (checksums, offsets, index)
    per_record = [s for s in checks.sections.values() if s.per_record]
    assert all(checks.ok[s.first] for s in per_record) and checks.records_left == 0


@pytest.mark.parametrize("name", [*RECORD_ARRAYS, "blocks", "manifest_hash"])
def test_a_damaged_record_array_is_never_served_and_verify_names_it(tmp_path, packed, container,
                                                                    name):
    """A flipped byte in any record array: no key read differs from the original, lookups
    find every key or raise a DatasetError naming the dataset, never a raw exception; and
    `packdata verify` says what is damaged."""
    original = list(packdata.open(packed[container]).keys)
    path = copy_of(packed, container, tmp_path)
    flip(array(path, name), at=7 if name != "keys" else 3)
    try:
        keys = packdata.open(path, verify="off").keys
    except DatasetError as exc:  # refused at open (the table, the checksum, an end offset)
        assert str(path) in str(exc)
    else:
        for i, key in enumerate(original):
            for read, args, want in ((keys.__getitem__, i, key), (keys.index_of, key, i),
                                     (keys.__contains__, key, True)):
                try:
                    got = read(args)
                except DatasetError as exc:
                    assert str(path) in str(exc)
                else:
                    assert got == want
    report = verify(path)
    assert not report.ok
    if name in RECORD_ARRAYS:  # named: by its checksum, or by the open that refuses it
        assert f"{name}" in " ".join(report.problems), report.problems


def test_a_damaged_table_of_the_container_is_named_by_a_checked_read_and_by_verify(
        tmp_path, packed, container):
    name = {"lmdb": "__offsets__", "hdf5": "checksums", "tar": "image.offset"}[container]
    path = copy_of(packed, container, tmp_path)
    flip(array(path, name), at=9)
    ds = packdata.open(path)
    with pytest.raises(DatasetError, match=f"{path}.*'{name}' does not match its checksum"):
        ds[list(range(len(ds)))]
    assert any(f"'{name}' does not match its checksum" in p for p in verify(path).problems)


@pytest.mark.parametrize("how", ["reversed", "renamed"])
def test_keys_rewritten_with_their_checksums_are_refused_at_open(tmp_path, packed, container,
                                                                 how):
    """Keys, their offsets, hashes and order, and every block checksum rewritten as a writer
    would: the manifest's checksum covers the table, so the dataset is refused at open, and
    verify says so (before, two such rewrites were read with their new keys)."""
    path = copy_of(packed, container, tmp_path)
    mutations.rewrite_keys(path, how)
    with pytest.raises(DatasetError, match=f"{path.name}.*manifest does not match its checksum"):
        packdata.open(path, verify="off")
    assert not verify(path).ok


@pytest.mark.parametrize("name", [*RECORD_ARRAYS, "blocks", "manifest_hash"])
def test_a_deleted_record_array_is_refused_at_open(tmp_path, packed, container, name):
    path = copy_of(packed, container, tmp_path)
    mutations.delete(path, array(path, name))
    with pytest.raises(DatasetError, match=path.name):
        packdata.open(path, verify="off")
    assert not verify(path).ok


def stored_manifest(container: str, path: Path) -> bytes:
    """The manifest's JSON as stored (what its checksum covers)."""
    if container == "tar":
        return (path / "manifest.json").read_bytes()
    if container == "hdf5":
        import h5py

        with h5py.File(path, "r") as f:
            raw = f["manifest"][()]
        return raw if isinstance(raw, bytes) else raw.encode()
    import lmdb

    mutations._forget_envs()
    with lmdb.open(str(path), readonly=True, lock=False) as env, env.begin() as txn:
        return bytes(txn.get(b"__manifest__"))


def as_version_2(container: str, path: Path) -> None:
    """The dataset at ``path`` as format 2 wrote it: no table of block checksums, the manifest's
    checksum over its JSON alone."""
    from tests.test_verify import edit_manifest

    edit_manifest(container, path, lambda m: m.update(version=2))
    text = stored_manifest(container, path)
    if container == "hdf5":
        import h5py

        with h5py.File(path, "r+") as f:
            del f["__records__/blocks"], f["__records__/manifest_hash"]
            f.create_dataset("__records__/manifest_hash", data=header_hash(text))
        return
    npz, prefix = (path / "index.npz", "__records__.") if container == "tar" else \
        (path / "records.npz", "")
    mutations.rewrite_npz(npz, {f"{prefix}manifest_hash": header_hash(text)},
                          drop={f"{prefix}blocks"})


def test_format_2_datasets_read_with_the_checks_they_can_have(tmp_path, packed, container):
    """A format-2 dataset (no block checksums) opens and reads; its keys are served only when
    found at their place in the key index, so a damaged key is an error, not another key, and
    verify checks the key arrays against each other."""
    path = copy_of(packed, container, tmp_path)
    as_version_2(container, path)
    ds = packdata.open(path)
    new = packdata.open(packed[container])
    assert ds.manifest.version == 2 and ds.manifest.checks is None
    assert list(ds.keys) == list(new.keys) and ds.keys.index_of(new.keys[7]) == 7
    assert verify(path).ok
    target = array(path, "keys")
    flip(target, at=int(np.asarray(ds.keys.offsets)[7]) + 1)  # a byte of key 7
    ds = packdata.open(path)
    with pytest.raises(DatasetError, match=f"{path.name}.*key 7 is not in the key index"):
        ds.keys[7]
    assert any("keys do not match the key index" in p for p in verify(path).problems)


def test_the_fuzz_harness_mutates_every_array_and_changes_bytes(tmp_path, packed):
    """bench/mutate_arrays.py reaches every per-record array of every container, and every
    mutation it makes changes stored bytes (what lets fuzz_readers --arrays demand that
    verify names each mutant)."""
    for container in ("lmdb", "hdf5", "tar"):
        names = {a.name.rsplit("/", 1)[-1].rsplit(".", 1)[-1]
                 for a in mutations.arrays_of(packed[container])}
        assert set(RECORD_ARRAYS) | {"blocks", "manifest_hash"} <= names, names
    rng = random.Random(0)
    for n in range(12):
        path = copy_of(packed, "tar", tmp_path / str(n))
        before = {p.name: p.read_bytes() for p in path.iterdir()}
        what = mutations.mutate_arrays(path, rng)
        assert {p.name: p.read_bytes() for p in path.iterdir()} != before, what
    json.dumps(what)
