"""packdata.verification: the `verify` command, verify= at open, and the structural checks at open."""

from __future__ import annotations

import json
import shutil
import zlib

import h5py
import lmdb
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import packdata
from packdata import checksum
from packdata.cli import app
from packdata.containers.tar import shard_paths
from packdata.loading.streaming import StreamingDataset
from packdata.verification import verify

runner = CliRunner()


def first_pixel_offset(container: str, path) -> tuple:
    """A file and a byte offset inside record 3's pixels, found through the plain libraries."""
    if container == "hdf5":
        with h5py.File(path, "r") as f:
            ds = f["image"]
            return path, ds.id.get_offset() + 3 * int(np.prod(ds.shape[1:])) + 17
    if container == "tar":
        with np.load(path / "index.npz") as z:
            shard, offset = int(z["image.shard"][3]), int(z["image.offset"][3])
        return shard_paths(path)[shard], offset + 17
    with lmdb.open(str(path), readonly=True, lock=False) as env, env.begin() as txn:
        value = bytes(txn.get(b"%010d" % 3))
    data = (path / "data.mdb").read_bytes()
    return path / "data.mdb", data.index(value) + 17


def flip(file, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x40
    file.write_bytes(bytes(data))


def damaged_copy(tmp_path, packed, container):
    src = packed[container]
    copy = tmp_path / src.name
    (shutil.copytree if src.is_dir() else shutil.copy)(src, copy)
    flip(*first_pixel_offset(container, copy))
    return copy


def test_verify_passes_a_sound_dataset(packed, container, png_folder):
    result = runner.invoke(app, ["verify", str(packed[container]), "--source", str(png_folder),
                                 "--deep"])
    assert result.exit_code == 0, result.output
    assert "120 of 120 records checked, 120 compared" in result.output
    assert result.output.strip().endswith("OK")


def test_verify_names_a_flipped_byte(tmp_path, packed, container):
    copy = damaged_copy(tmp_path, packed, container)
    report = verify(copy)
    assert [b["index"] for b in report.bad] == [3]
    assert report.bad[0]["problem"] == "checksum does not match the manifest"
    result = runner.invoke(app, ["verify", str(copy)])
    assert result.exit_code == 1
    key = packdata.open(packed[container]).keys[3]
    assert f"bad: {key} (record 3): checksum" in result.output
    assert "FAILED: 1 bad record, 0 problems" in result.output


def test_verify_full_raises_at_read_and_off_reads_the_wrong_bytes(tmp_path, packed, container):
    copy = damaged_copy(tmp_path, packed, container)
    full = packdata.open(copy, verify="full")
    assert full[[0, 1, 2]][0].shape[0] == 3  # sound records read as usual
    with pytest.raises(packdata.DatasetError, match="record 3 .* does not match its checksum"):
        full[[2, 3]]
    original = packdata.open(packed[container])[3][0]
    assert not np.array_equal(packdata.open(copy, verify="off")[3][0], original)


def through_workers(ds) -> list:
    """Every batch of a stock DataLoader with 2 workers. An iterator whose worker raised is shut
    down here: torch's shutdown then waits its status interval (5 s) for each worker, which
    does not exit, before terminating it; the test waits half a second for each."""
    from torch.utils.data import _utils

    batches = iter(torch.utils.data.DataLoader(ds, batch_size=16, num_workers=2))
    try:
        return list(batches)
    finally:
        interval, _utils.MP_STATUS_CHECK_INTERVAL = _utils.MP_STATUS_CHECK_INTERVAL, 0.5
        try:
            batches._shutdown_workers()
        finally:
            _utils.MP_STATUS_CHECK_INTERVAL = interval


PATHS = {
    "ds[i]": lambda ds: ds[3],
    "batch": lambda ds: ds[[1, 2, 3, 4]],
    "loader": lambda ds: list(packdata.loader(ds, batch_size=16, shuffle=False, num_workers=0)),
    "loader threads": lambda ds: list(packdata.loader(ds, batch_size=8, shuffle=False,
                                                      num_workers=2, workers="thread")),
    "DataLoader workers": lambda ds: through_workers(ds),
    "streaming": lambda ds: list(StreamingDataset(ds.path, shuffle_buffer=1)),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_default_open_refuses_a_flipped_byte_on_every_path(tmp_path, packed, container, path):
    """Every record a default read returns is checked: one byte flipped in record 3 (not among
    the records sampled at open) is an error naming the dataset and the record's key."""
    copy = damaged_copy(tmp_path, packed, container)
    ds = packdata.open(copy)
    # checked as the records are gathered, where packdata's C extension was built
    assert ds.reader.gathers_checked == checksum.NATIVE_ROWS
    assert ds[[0, 1, 2]][0].shape[0] == 3  # sound records read as usual, and again below
    key = ds.keys[3]
    with pytest.raises(packdata.DatasetError, match=rf"{copy.name}: record 3 \('{key}'\) does "
                       "not match its checksum"):
        PATHS[path](ds)


@pytest.mark.parametrize("path", ["ds[i]", "batch", "loader", "DataLoader workers"])
def test_without_the_native_routine_records_are_checked_after_they_are_read(
        tmp_path, packed, container, path, monkeypatch):
    monkeypatch.setattr(checksum, "NATIVE_ROWS", False)
    copy = damaged_copy(tmp_path, packed, container)
    ds = packdata.open(copy)
    assert not ds.reader.gathers_checked
    assert ds[[0, 1, 2]][0].shape[0] == 3
    with pytest.raises(packdata.DatasetError, match=r"record 3 .* does not match its checksum"):
        PATHS[path](ds)


def test_checked_records_are_remembered_in_a_bitmap(packed, container):
    """A record read once is marked verified (one bit, this process's reader); a batch of marked
    records is read without hashing."""
    reader = packdata.open(packed[container]).reader
    reader.read(np.arange(10))
    reader.read(np.array([12, 5]))
    bits = np.unpackbits(reader.verified, bitorder="little")[:len(reader.verified) * 8]
    assert np.flatnonzero(bits).tolist() == [*range(10), 12]


def test_duplicate_indices_never_end_the_checks_early(tmp_path, packed, container):
    """A record read twice in one batch counts once: after every record but the damaged one was
    read (each twice), one is left to check, and a batch mixing a checked record with it hashes
    it and names it."""
    reader = packdata.open(damaged_copy(tmp_path, packed, container)).reader
    others = [i for i in range(reader.manifest.count) if i != 3]
    reader.read(np.array(others + others[::-1]))
    assert reader.remaining == 1
    with pytest.raises(packdata.DatasetError, match=r"record 3 .* does not match its checksum"):
        reader.read(np.array([2, 3, 2]))
    assert reader.remaining == 1


def test_verify_against_source_finds_a_changed_input(tmp_path, packed, png_folder):
    src = shutil.copytree(png_folder, tmp_path / "src")
    name = sorted(src.glob("*.png"))[5]
    shutil.copy(sorted(src.glob("*.png"))[6], name)
    result = runner.invoke(app, ["verify", str(packed["lmdb"]), "--source", str(src)])
    assert result.exit_code == 1
    assert f"differs from a fresh conversion of {name}" in result.output


def test_verify_json_and_unreadable_dataset(tmp_path):
    (tmp_path / "x.lmdb").mkdir()
    result = runner.invoke(app, ["verify", str(tmp_path / "x.lmdb"), "--json"])
    assert result.exit_code == 1
    assert "not a packdata dataset" in json.loads(result.output)["problems"][0]


def edit_manifest(container, copy, edit) -> None:
    """Apply ``edit`` to the manifest dict stored in ``copy``, through the plain libraries."""
    if container == "tar":
        d = json.loads((copy / "manifest.json").read_text())
        edit(d["packdata"])
        (copy / "manifest.json").write_text(json.dumps(d))
    elif container == "hdf5":
        with h5py.File(copy, "r+") as f:
            d = json.loads(f["manifest"][()])
            edit(d["packdata"])
            del f["manifest"]
            f.create_dataset("manifest", data=json.dumps(d))
    else:
        with lmdb.open(str(copy), subdir=True) as env, env.begin(write=True) as txn:
            d = json.loads(bytes(txn.get(b"__manifest__")))
            edit(d["packdata"])
            txn.put(b"__manifest__", json.dumps(d).encode())


def without_header_hash(container, path) -> None:
    """Remove the manifest's checksum from the record arrays (only version-1 datasets may lack
    it: the dataset is then refused)."""
    if container == "hdf5":
        with h5py.File(path, "r+") as f:
            del f["__records__/manifest_hash"]
        return
    npz = path / ("index.npz" if container == "tar" else "records.npz")
    with np.load(npz) as z:
        kept = {k: z[k] for k in z.files if not k.endswith("manifest_hash")}
    assert len(kept) < len(z.files)
    np.savez(npz, **kept)


EDITS = {
    "object dtype": lambda m: m["fields"]["image"].update(dtype="O"),
    "wider dtype": lambda m: m["fields"]["image"].update(dtype="uint16"),
    "count lowered": lambda m: m.update(count=m["count"] - 10),
    "count raised": lambda m: m.update(count=m["count"] + 10),
    "per-record lists added": lambda m: m.update(keys=["a"], checksums=[1]),
    "bigger shape": lambda m: m["fields"]["image"].update(shape=[3, 64, 64]),
    "negative shape": lambda m: m["fields"]["image"].update(shape=[3, -32, 32]),
    "fields missing": lambda m: m.pop("fields"),
    "version 1 without its lists": lambda m: m.update(version=1),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_edited_manifest_is_refused_at_open(tmp_path, packed, container, edit):
    """Refused by the manifest's checksum, also with the checksum deleted (only version-1
    datasets were written without one); and in a version-1 dataset, which has none, by the
    facts checked against the data."""
    src = packed[container]
    copy = tmp_path / src.name
    (shutil.copytree if src.is_dir() else shutil.copy)(src, copy)
    edit_manifest(container, copy, EDITS[edit])
    with pytest.raises(packdata.DatasetError, match=copy.name):
        packdata.open(copy, verify="off")  # the structural checks run whatever verify says
    if edit not in ("per-record lists added", "version 1 without its lists", "fields missing"):
        with pytest.raises(packdata.DatasetError, match="does not match its checksum"):
            packdata.open(copy, verify="off")
    if edit == "version 1 without its lists":
        return
    without_header_hash(container, copy)
    with pytest.raises(packdata.DatasetError, match=copy.name):
        packdata.open(copy, verify="off")
    if edit not in ("per-record lists added", "fields missing"):  # (refused as JSON first)
        with pytest.raises(packdata.DatasetError, match="checksum is missing"):
            packdata.open(copy, verify="off")
    old = tmp_path / f"old-{src.name}"
    (shutil.copytree if src.is_dir() else shutil.copy)(src, old)
    as_version_1(container, old, src)
    edit_manifest(container, old, EDITS[edit])
    with pytest.raises(packdata.DatasetError, match=old.name):
        packdata.open(old, verify="off")


def as_version_1(container, path, original) -> None:
    """Rewrite a copy of ``original`` as format version 1 wrote it, through the plain libraries:
    keys and CRC-32 checksums as JSON lists in the manifest, no per-record arrays beside it."""
    ds = packdata.open(original, verify="off")
    keys = list(ds.keys)
    crcs = []
    for i in range(len(ds)):
        image, label = ds[i]
        crcs.append(zlib.crc32(np.int64(label).tobytes(),
                               zlib.crc32(image.numpy().tobytes())))  # stored C×H×W
    del ds
    edit_manifest(container, path, lambda m: m.update(version=1, keys=keys, checksums=crcs))
    if container == "tar":
        with np.load(path / "index.npz") as z:
            kept = {k: z[k] for k in z.files if not k.startswith("__records__")}
        np.savez(path / "index.npz", **kept)
    elif container == "hdf5":
        with h5py.File(path, "r+") as f:
            del f["__records__"]
    else:
        (path / "records.npz").unlink()


def test_version_1_datasets_still_open_and_are_checked(tmp_path, packed, container):
    """A version-1 dataset (JSON keys, CRC-32 checksums) reads as before, every record checked
    against its CRC-32; `packdata verify` names the format version."""
    src = packed[container]
    old = tmp_path / f"old-{src.name}"
    (shutil.copytree if src.is_dir() else shutil.copy)(src, old)
    as_version_1(container, old, src)
    bad = tmp_path / f"bad-{src.name}"
    (shutil.copytree if src.is_dir() else shutil.copy)(old, bad)
    flip(*first_pixel_offset(container, bad))
    ds, new = packdata.open(old), packdata.open(src)
    assert ds.manifest.version == 1 and ds.keys == new.keys and ds.keys.index_of(new.keys[7]) == 7
    assert torch.equal(ds[[5, 6, 7]][0], new[[5, 6, 7]][0])
    result = runner.invoke(app, ["verify", str(old)])
    assert result.exit_code == 0 and "(format version 1)" in result.output, result.output
    assert "(format version 3)" in runner.invoke(app, ["verify", str(src)]).output
    with pytest.raises(packdata.DatasetError, match=r"record 3 .* does not match its checksum"):
        packdata.open(bad)[[2, 3]]


def test_tar_shard_name_outside_the_dataset_is_refused(tmp_path, packed):
    copy = shutil.copytree(packed["tar"], tmp_path / "t")
    edit_manifest("tar", copy, lambda m: m["extra"]["shards"][0].update(name="../../x.tar"))
    with pytest.raises(packdata.DatasetError, match="does not match its checksum"):
        packdata.open(copy)
    old = tmp_path / "old"
    as_version_1("tar", shutil.copytree(packed["tar"], old), packed["tar"])
    edit_manifest("tar", old, lambda m: m["extra"]["shards"][0].update(name="../../x.tar"))
    with pytest.raises(packdata.DatasetError, match="shard list is damaged"):
        packdata.open(old)  # version 1 has no checksum of its manifest: checked against the data


def test_unknown_verify_level(packed):
    with pytest.raises(ValueError, match="verify='some'"):
        packdata.open(packed["lmdb"], verify="some")


def test_verify_a_truncated_shard_lists_only_the_records_past_the_cut(tmp_path, packed):
    """The records before the cut are intact: checked (CRC-32), not listed as bad."""
    path = tmp_path / "cut"
    shutil.copytree(packed["tar"], path)
    shard = shard_paths(path)[1]
    cut = shard.stat().st_size // 2
    with open(shard, "r+b") as f:
        f.truncate(cut)
    with np.load(path / "index.npz") as z:  # records of shard 1 whose pixels end past the cut
        ends = z["image.offset"] + z["image.nbytes"]
        lost = np.flatnonzero((z["image.shard"] == 1) & (ends > cut)).tolist()
        kept = np.flatnonzero((z["image.shard"] == 1) & (ends <= cut)).tolist()
        needed = max(int((z[k] + z[k[:-6] + "nbytes"])[z[k[:-6] + "shard"] == 1].max())
                     for k in z.files if k.endswith(".offset"))
    assert lost and kept
    report = verify(path)
    assert report.checked == 120
    assert sorted(b["index"] for b in report.bad) == lost
    assert all("lies past the cut" in b["problem"] for b in report.bad)
    assert report.problems == [f"{shard.name}: truncated ({cut:,} bytes, the index needs "
                               f"{needed:,}): the records past the cut are lost"]
    with pytest.raises(packdata.DatasetError, match="shard truncated"):  # reads still refuse
        packdata.open(path)[kept[0]]


def test_verify_names_a_tar_member_that_differs_from_its_index_copy(tmp_path, packed):
    """Tar keeps labels in its index (packdata reads them there) and as ``.cls`` members (what
    webdataset reads): a member edited alone still reads right through packdata, but the
    dataset is no longer one dataset to every reader, and verify names the record."""
    wds = pytest.importorskip("webdataset")
    path = tmp_path / "t"
    shutil.copytree(packed["tar"], path)
    with np.load(path / "index.npz") as z:
        shard, offset = int(z["label.shard"][5]), int(z["label.offset"][5])
        label = int(z["label.values"][5])
    with open(shard_paths(path)[shard], "r+b") as f:
        f.seek(offset)
        f.write(str((label + 1) % 10).encode())  # one digit for another
    key = packdata.open(path).keys[5]
    members = {s["__key__"]: int(s["cls"]) for s in wds.WebDataset(
        [str(p) for p in shard_paths(path)], shardshuffle=False)}
    assert members[key] == (label + 1) % 10  # what another tar reader now gets
    assert int(packdata.open(path)[5][1]) == label  # packdata reads the index's copy
    report = verify(path)
    assert [b["index"] for b in report.bad] == [5]
    assert report.bad[0]["problem"].startswith("its member copy of 'label' does not hold the "
                                               "value in the index")


def test_verify_names_a_shard_cut_after_its_last_record(tmp_path, packed):
    """Cut where its records end (the tar archive's padding and end blocks lost): reads refuse
    the shard as not the one written, and so does verify, though every record is whole."""
    path = tmp_path / "cut"
    shutil.copytree(packed["tar"], path)
    shard = shard_paths(path)[1]
    written = shard.stat().st_size
    with np.load(path / "index.npz") as z:
        needed = max(int((z[k] + z[k[:-6] + "nbytes"])[z[k[:-6] + "shard"] == 1].max())
                     for k in z.files if k.endswith(".offset"))
    with open(shard, "r+b") as f:
        f.truncate(needed)
    report = verify(path)
    assert report.checked == 120 and not report.bad
    assert report.problems == [f"{shard.name}: truncated ({needed:,} bytes, the manifest records "
                               f"{written:,}): its records are whole, the end of its tar archive "
                               "is lost"]
    with pytest.raises(packdata.DatasetError, match="shard truncated"):
        packdata.open(path)[60]


@pytest.mark.parametrize("missing", ["index.npz", "manifest.json"])
def test_a_missing_manifest_or_index_is_named(tmp_path, packed, missing):
    path = tmp_path / "incomplete"
    shutil.copytree(packed["tar"], path)
    (path / missing).unlink()
    result = runner.invoke(app, ["verify", str(path)])
    assert result.exit_code == 1
    other = "index.npz" if missing == "manifest.json" else "the manifest"
    assert f"a packdata tar dataset without its {'record index ' * (missing == 'index.npz')}" \
           f"{missing} ({other} and 3 shards are there" in result.output
    assert "not a packdata dataset" not in result.output
    with pytest.raises(packdata.DatasetError, match=f"without its .*{missing}"):
        packdata.open(path)
