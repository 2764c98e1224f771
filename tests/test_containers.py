"""One conformance suite for every container, plus raw reads with each format's own library."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest
import webdataset as wds
import xxhash

import packdata
from packdata.containers.tar import shard_paths
from tests.conftest import CONTAINERS, pillow_pixels


def expected(png_folder: Path) -> tuple[list[str], dict[str, int]]:
    labels = json.loads((png_folder / "labels.json").read_text())["labels"]
    return sorted(labels), labels


def test_round_trip_is_pixel_exact(packed, container, png_folder):
    ds = packdata.open(packed[container])
    names, labels = expected(png_folder)
    assert len(ds) == len(names)
    for i, name in enumerate(names):
        image, label = ds[i]
        assert image.dtype.is_floating_point is False and image.shape == (3, 32, 32)
        np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), pillow_pixels(png_folder / name))
        assert int(label) == labels[name]
        assert ds.keys[i] == Path(name).stem


def test_batch_read_matches_single_reads_in_order(packed, container):
    ds = packdata.open(packed[container])
    order = [77, 3, 119, 3, -1, 50]
    images, labels = ds[order]
    assert images.shape == (6, 3, 32, 32) and labels.shape == (6,)
    for j, i in enumerate(order):
        single_image, single_label = ds[i]
        assert torch_equal(images[j], single_image) and int(labels[j]) == int(single_label)


def torch_equal(a, b) -> bool:
    return bool((a == b).all())


def test_out_of_range_index_is_an_index_error(packed, container):
    ds = packdata.open(packed[container])
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]
    with pytest.raises(IndexError):
        ds[[0, len(ds) + 5]]


def test_manifest_describes_the_records(packed, container, png_folder):
    ds = packdata.open(packed[container])
    m = ds.manifest
    assert m.container == container and m.kind == "image" and m.count == len(ds)
    assert m.fields["image"].shape == (3, 32, 32) and m.fields["image"].dtype == "|u1"  # byte order pinned
    assert m.classes[0] == "airplane" and len(m.classes) == 10
    names, _ = expected(png_folder)
    for i in (0, 57, len(ds) - 1):
        image, label = ds[i]
        raw = image.numpy().tobytes()  # stored C×H×W
        assert m.checksums[i] == xxhash.xxh3_64_intdigest(raw + np.int64(label).tobytes())


def test_lmdb_reads_with_plain_lmdb(packed, png_folder, tmp_path):
    names, labels = expected(png_folder)
    # a copy: LMDB allows one open per process, and packdata's reader may hold the original
    copy = shutil.copytree(packed["lmdb"], tmp_path / "copy.lmdb")
    env = lmdb.open(str(copy), readonly=True, lock=False)
    with env.begin() as txn:
        manifest = json.loads(txn.get(b"__manifest__"))["packdata"]
        assert manifest["count"] == len(names)
        for i in (0, 42):
            value = txn.get(b"%010d" % i)
            pixels = np.frombuffer(value[:3072], np.uint8).reshape(3, 32, 32).transpose(1, 2, 0)
            np.testing.assert_array_equal(pixels, pillow_pixels(png_folder / names[i]))
            assert np.frombuffer(value[3072:3080], "<i8")[0] == labels[names[i]]
    env.close()


def test_hdf5_reads_with_plain_h5py(packed, png_folder):
    names, labels = expected(png_folder)
    with h5py.File(packed["hdf5"], "r") as f:
        assert f["image"].shape == (len(names), 3, 32, 32)  # C×H×W: a batch read is N×C×H×W
        assert f["image"].chunks is None  # contiguous: memory-mappable
        for i in (0, 99):
            np.testing.assert_array_equal(f["image"][i].transpose(1, 2, 0),
                                          pillow_pixels(png_folder / names[i]))
            assert f["label"][i] == labels[names[i]]
        assert json.loads(f["manifest"][()])["packdata"]["container"] == "hdf5"


def test_tar_shards_read_with_webdataset(packed, png_folder):
    names, labels = expected(png_folder)
    shards = [str(p) for p in shard_paths(packed["tar"])]
    assert len(shards) == 3  # 120 samples, 50 per shard
    samples = list(wds.WebDataset(shards, shardshuffle=False).decode())
    assert [s["__key__"] for s in samples] == [Path(n).stem for n in names]
    for s, name in zip(samples, names):
        np.testing.assert_array_equal(s["image.npy"].transpose(1, 2, 0),  # stored C×H×W
                                      pillow_pixels(png_folder / name))
        assert s["cls"] == labels[name]


@pytest.mark.parametrize("target", CONTAINERS.values())
def test_keep_encoding_stores_the_file_bytes(tmp_path, png_folder, target):
    source = packdata.open_source(png_folder, encoding="keep")
    ds = packdata.open(packdata.convert(source, tmp_path / target, workers=1).path)
    names, labels = expected(png_folder)
    assert ds.manifest.fields["image"].variable
    np.testing.assert_array_equal(
        ds.lengths("image"), [(png_folder / n).stat().st_size for n in names]
    )
    for i in (0, 13, len(ds) - 1):
        raw = ds.reader.read(np.array([i]))["image"][0]
        assert raw.tobytes() == (png_folder / names[i]).read_bytes()
        image, label = ds[i]
        np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), pillow_pixels(png_folder / names[i]))
    images, _ = ds[[1, 2, 3]]
    assert images.shape == (3, 3, 32, 32)


def test_keep_encoded_tar_members_are_pngs_for_webdataset(tmp_path, png_folder):
    source = packdata.open_source(png_folder, encoding="keep")
    path = packdata.convert(source, tmp_path / "keep-tar", workers=1).path
    names, _ = expected(png_folder)
    first = next(iter(wds.WebDataset([str(p) for p in shard_paths(path)], shardshuffle=False)))
    assert first["png"] == (png_folder / names[0]).read_bytes()


def test_hdf5_copies_spooled_records_in_row_aligned_blocks(tmp_path, png_folder, monkeypatch):
    from packdata.containers import spool

    monkeypatch.setattr(spool, "BLOCK_BYTES", 5000)  # not a multiple of a 3072-byte image
    ds = packdata.open(packdata.convert(packdata.open_source(png_folder), tmp_path / "b.h5").path)
    names, _ = expected(png_folder)
    for i in (0, 1, 2, len(ds) - 1):
        np.testing.assert_array_equal(ds[i][0].permute(1, 2, 0).numpy(), pillow_pixels(png_folder / names[i]))


def _stored(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {name: f[name][()] for name in f if name not in ("manifest", "__records__")}


@pytest.mark.parametrize("options", [{"max_size": 20}, {"encoding": "keep"}])
def test_hdf5_lays_variable_rows_out_from_the_headers_and_writes_them_in_place(
        tmp_path, png_folder, monkeypatch, options):
    """Images of any size (their pixel rows counted from the headers) and kept files (their
    bytes from their sizes) go straight into datasets made at their final size, by the
    converting process (one worker) or by the workers that load them (two); the file holds what
    the spooled path (no rows known ahead) writes, byte for byte."""
    from packdata.containers import hdf5
    from packdata.sources.base import Survey
    from packdata.sources.images import ImageSource

    monkeypatch.setattr(ImageSource, "survey", lambda self, items: Survey(None, []))
    spooled = packdata.convert(packdata.open_source(png_folder, **options), tmp_path / "s.h5",
                               workers=2)
    monkeypatch.undo()

    def never(self):
        raise AssertionError("moved to spools although every record fit")

    monkeypatch.setattr(hdf5.HDF5Writer, "_to_spools", never)
    b = _stored(spooled.path)
    for workers in (1, 2):
        placed = packdata.convert(packdata.open_source(png_folder, **options),
                                  tmp_path / f"p{workers}.h5", workers=workers)
        assert np.array_equal(placed.manifest.checksums, spooled.manifest.checksums)
        a = _stored(placed.path)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        assert packdata.verify(placed.path).ok
        # two workers wrote every record themselves: only the checksums crossed
        assert ("place" in placed.costs.workers) == (workers == 2)
    # only checksums and keys (24 bytes and the key's a record) crossed, not a record
    assert placed.costs.bytes["handed_over"] < 64 * placed.manifest.count


def test_hdf5_moves_rows_laid_out_in_place_to_spools_when_an_input_is_skipped(tmp_path,
                                                                              png_folder,
                                                                              monkeypatch):
    from packdata.containers import hdf5

    moved = []
    to_spools = hdf5.HDF5Writer._to_spools
    monkeypatch.setattr(hdf5.HDF5Writer, "_to_spools",
                        lambda self: (moved.append(self.count), to_spools(self)))
    folder = shutil.copytree(png_folder, tmp_path / "in")
    bad = sorted(folder.glob("*.png"))[50]
    bad.write_bytes(bad.read_bytes()[:100])  # its header still reads: its rows were counted
    out = packdata.convert(packdata.open_source(folder, max_size=20), tmp_path / "v.h5",
                           workers=1, on_error="skip")
    assert [s["path"] for s in out.manifest.skipped] == [str(bad)]
    assert out.manifest.count == 119 and packdata.verify(out.path).ok
    assert moved == [119]  # laid out for 120, moved to the spools at the end
    bad.unlink()  # the same folder without it: the same records
    alone = packdata.convert(packdata.open_source(folder, max_size=20), tmp_path / "w.h5",
                             workers=1)
    assert np.array_equal(out.manifest.checksums, alone.manifest.checksums)
    a, b = _stored(out.path), _stored(alone.path)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_truncated_tar_shard_is_a_named_error(tmp_path, packed):
    copy = shutil.copytree(packed["tar"], tmp_path / "t")
    shard = shard_paths(copy)[-1]
    shard.write_bytes(shard.read_bytes()[:5000])
    with pytest.raises(packdata.DatasetError, match=f"{shard.name}: shard truncated"):
        packdata.open(copy)  # the records sampled at open include the last one
    ds = packdata.open(copy, verify="off")
    ds[0]  # other shards still read
    with pytest.raises(packdata.DatasetError, match=f"{shard.name}: shard truncated"):
        ds[len(ds) - 1]


@pytest.mark.parametrize("damage", [("image.offset", -4096), ("image.nbytes", 7),
                                    ("image.shard", 0), ("image.offset", 1 << 40)])
def test_tar_open_reads_no_record_entry_and_a_damaged_one_fails_its_read(tmp_path, packed,
                                                                         damage):
    """Opening checks the index's columns and its first and last entries only (so it costs the
    same at 10^4 and 10^7 records); a damaged entry in between opens, and its record's read
    fails as a DatasetError naming the dataset, never a wrong sample, with verify off too."""
    copy = shutil.copytree(packed["tar"], tmp_path / "t")
    column, value = damage
    with np.load(copy / "index.npz") as z:
        arrays = {k: z[k] for k in z.files}
    middle = len(arrays[column]) // 2 + 10  # in a shard other than the first (50 a shard)
    assert arrays[column][middle] != value
    arrays[column][middle] = value
    np.savez(copy / "index.npz", **arrays)
    ds = packdata.open(copy, verify="off")
    ds[0], ds[len(ds) - 1], ds[[middle - 1, middle + 1]]  # the others read
    with pytest.raises(packdata.DatasetError, match=f"{copy}"):
        ds[middle]
    with pytest.raises(packdata.DatasetError, match=f"{copy}"):
        ds[[0, middle]]


def test_tar_manifest_is_read_through_manifest_everywhere(tmp_path, packed):
    """Shard listing and the DALI index read the manifest as the reader does: a version this
    packdata does not read is refused, not parsed by hand."""
    from packdata.containers.tar.reindex import write_reader_indexes

    copy = shutil.copytree(packed["tar"], tmp_path / "t")
    assert [p.name for p in shard_paths(copy)] == [p.name for p in shard_paths(packed["tar"])]
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["packdata"]["version"] = 99
    (copy / "manifest.json").write_text(json.dumps(manifest))
    for read in (shard_paths, lambda p: write_reader_indexes(p, tmp_path / "idx")):
        with pytest.raises(packdata.DatasetError, match="manifest version 99"):
            read(copy)


def test_truncated_hdf5_is_a_named_error(tmp_path, packed):
    damaged = tmp_path / "d.h5"
    data = packed["hdf5"].read_bytes()
    damaged.write_bytes(data[: len(data) // 2])
    with pytest.raises(packdata.DatasetError, match="d.h5"):
        packdata.open(damaged)


@pytest.mark.parametrize("keep", [40_000, 0])
def test_truncated_lmdb_is_a_named_error_not_a_crash(tmp_path, packed, keep):
    """LMDB maps its file: reading a page past a truncated end would be SIGBUS, not an error."""
    copy = shutil.copytree(packed["lmdb"], tmp_path / "t.lmdb")
    data = (copy / "data.mdb").read_bytes()
    (copy / "data.mdb").write_bytes(data[:keep])
    with pytest.raises(packdata.DatasetError, match="t.lmdb"):
        packdata.open(copy)[0]


def test_lmdb_missing_record_is_a_named_error(tmp_path, packed):
    copy = shutil.copytree(packed["lmdb"], tmp_path / "t.lmdb")
    with lmdb.open(str(copy), subdir=True) as env, env.begin(write=True) as txn:
        txn.delete(b"%010d" % 7)
    with pytest.raises(packdata.DatasetError, match="t.lmdb: LMDB holds 121 entries"):
        packdata.open(copy)  # entries are counted at open, before any read


def test_hdf5_missing_field_is_a_named_error(tmp_path, packed):
    copy = tmp_path / "d.h5"
    shutil.copy(packed["hdf5"], copy)
    with h5py.File(copy, "r+") as f:
        del f["label"]
    with pytest.raises(packdata.DatasetError, match="no dataset 'label'"):
        packdata.open(copy)


@pytest.mark.parametrize("damage", ["garbage", "missing key", "short"])
def test_damaged_tar_index_is_a_named_error(tmp_path, packed, damage):
    copy = shutil.copytree(packed["tar"], tmp_path / "t")
    with np.load(copy / "index.npz") as z:
        index = {k: z[k] for k in z.files}
    if damage == "garbage":
        (copy / "index.npz").write_bytes(b"not an index")
    else:
        index = ({k: v for k, v in index.items() if k != "image.offset"} if damage == "missing key"
                 else {k: v[:-5] for k, v in index.items()})
        np.savez(copy / "index.npz", **index)
    with pytest.raises(packdata.DatasetError, match="index.npz.*damaged"):
        packdata.open(copy)


def test_manifest_of_another_version_is_refused(tmp_path, packed):
    copy = shutil.copytree(packed["tar"], tmp_path / "t")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["packdata"]["version"] = 99
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(packdata.DatasetError, match="manifest version 99"):
        packdata.open(copy)


def test_lmdb_records_located_in_the_file_read_as_key_lookups(packed):
    from packdata.containers.lmdb import LMDBReader, RecordMap

    located, looked_up = LMDBReader(packed["lmdb"]), LMDBReader(packed["lmdb"])
    order = np.random.default_rng(0).permutation(len(looked_up.manifest.keys))
    for idx in (order[:37], order, order[5:9][::-1]):  # new records, then known ones, reversed
        a, b = located.read(idx), looked_up._lookup(idx)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert isinstance(located._located(), RecordMap)
    assert (located._located().offsets >= 0).all()  # every record located once, then reused


def test_lmdb_record_offsets_stored_at_conversion(packed, tmp_path):
    """Conversion stores where each record lies in data.mdb: a fresh reader's first read knows
    every record (no lookup per record during the first epoch), and the map reads what key
    lookups read. A compacted copy (records moved) falls back to locating them one by one."""
    from packdata.containers.lmdb import LMDBReader, shared_env

    reader = LMDBReader(packed["lmdb"])
    first = reader.read(np.array([5]))
    assert (reader._located().offsets >= 0).all()
    idx = np.random.default_rng(1).permutation(len(reader.manifest.keys))
    a, b = reader.read(idx), reader._lookup(idx)
    assert np.array_equal(first["image"][0], a["image"][idx.tolist().index(5)])
    assert all(np.array_equal(a[k], b[k]) for k in a)
    compact = tmp_path / "compact.lmdb"
    compact.mkdir()
    shared_env(packed["lmdb"]).copy(str(compact), compact=True)  # data.mdb only
    shutil.copy(packed["lmdb"] / "records.npz", compact)  # the dataset is the whole folder
    moved = LMDBReader(compact)
    a, b = moved.read(idx), moved._lookup(idx)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_gather_rows_matches_numpy_on_mapped_byte_windows(tmp_path):
    from packdata.containers.base import gather_rows, map_file
    from packdata.containers.joined import byte_window

    data = np.random.default_rng(0).integers(0, 256, 40_000, dtype=np.uint8)
    (tmp_path / "bytes").write_bytes(data.tobytes())
    mapped = map_file(tmp_path / "bytes")
    rows = np.array([5, 0, 17_001, 5, 39_000 - 96], dtype=np.int64)  # any order, repeats
    for nbytes in (8, 96, 1000):  # numpy's gather below 64 bytes a row, torch's above
        window = byte_window(mapped, nbytes)
        want = np.stack([data[r : r + nbytes] for r in rows])
        assert np.array_equal(gather_rows(window, rows), want)
        out = np.zeros((len(rows), nbytes // 4), dtype=np.float32)
        assert gather_rows(window, rows, out) is out
        assert np.array_equal(out.view(np.uint8), want)
        typed = gather_rows(window, rows, dtype="<i2", shape=(2, nbytes // 4))
        assert typed.shape == (len(rows), 2, nbytes // 4) and typed.dtype == np.int16
        assert np.array_equal(typed.reshape(len(rows), -1).view(np.uint8), want)
        assert gather_rows(window, rows[:0]).shape == (0, nbytes)


def test_reads_without_torch_loaded_match_reads_with_it(packed, container):
    """``packdata verify`` reads without importing torch: the same bytes by numpy's gather."""
    import subprocess
    import sys

    idx = [7, 0, 19, 3]
    script = (
        "import sys, numpy as np\nfrom packdata import containers\n"
        f"r = containers.get({container!r}).READER({str(packed[container])!r})\n"
        f"b = r.read(np.array({idx}))\nassert 'torch' not in sys.modules\n"
        "sys.stdout.write(b['image'].tobytes().hex() + ' ' + b['label'].tobytes().hex())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr
    from packdata import containers

    batch = containers.get(container).READER(packed[container]).read(np.array(idx))
    assert done.stdout == batch["image"].tobytes().hex() + " " + batch["label"].tobytes().hex()


def test_a_child_forked_after_parallel_reads_reads_too(packed):
    """torch's intra-op threads do not survive a fork: a child of a process that gathered on
    several of them reads with numpy's gather instead of hanging."""
    import subprocess
    import sys

    script = (
        "import os, signal, sys, numpy as np, torch\nimport packdata\n"
        "torch.set_num_threads(2)\n"
        f"ds = packdata.open({str(packed['hdf5'])!r})\n"
        "want = ds[list(range(20))][0]\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    signal.alarm(20)\n"
        "    got = packdata.open(ds.path)[list(range(20))][0]\n"
        "    ok = np.array_equal(got.numpy(), want.numpy())  # (torch.equal: threads too)\n"
        "    os._exit(0 if ok else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "sys.exit(os.waitstatus_to_exitcode(status))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])


def test_opening_a_tar_or_lmdb_dataset_leaves_h5py_unloaded(packed):
    """``packdata.open`` asks every container whether a path is its own; only an HDF5 file
    loads h5py (its import costs every fresh process: a spawned worker, a DDP rank)."""
    import subprocess
    import sys

    script = (
        "import sys, packdata\n"
        "for path in sys.argv[1:]:\n"
        "    packdata.open(path)[0]\n"
        "    print('h5py' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script, str(packed["tar"]), str(packed["lmdb"]),
                           str(packed["hdf5"])], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True"]


def test_select_after_a_full_read_checks_its_entries():
    """apply_select (LMDB's lookups, a checked read of records not checked yet) refuses what
    the readers that gather only the selected bytes refuse: numpy alone takes -1 as the last."""
    from packdata.containers.base import apply_select
    from packdata.manifest import Field

    fields = {"points": Field("<i8", (3, 2))}
    whole = np.arange(12).reshape(2, 3, 2)
    got = apply_select({"points": whole.copy()}, {"points": np.array([2, 0])}, fields)
    np.testing.assert_array_equal(got["points"], whole[[0, 1], [2, 0]])
    for bad in ([0, 3], [-1, 0], [0]):
        with pytest.raises(IndexError, match="select"):
            apply_select({"points": whole.copy()}, {"points": np.array(bad)}, fields)
