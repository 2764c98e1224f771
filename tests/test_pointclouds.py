"""Point-cloud sources on real LAS/LAZ scans: stored samples, variants, containers, bad input."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import laspy
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import packdata
from packdata import checksum
from packdata.cli import app
from packdata.containers import get as get_container
from packdata.containers import integrity
from packdata.errors import DatasetError, InputWarning, MissingExtraError, PackdataError, SampleError
from packdata.manifest import Field
from packdata.prep.pointsample import coverage_radius
from packdata.sources import pointfiles
from packdata.verification import verify
from tests.conftest import needs_native_rows

FIXTURES = Path(__file__).parent / "fixtures" / "lidar"
FILTERED = sorted(FIXTURES.glob("ahn_filtered_*.las"))  # 4,040 and 3,317 points
SURF = sorted(FIXTURES.glob("ahn_surf_*.laz"))  # 11,059 and 11,376 points
N, K = 1024, 3
# float64 storage keeps UTM-sized coordinates exact, so stored rows can be matched to source rows
# (float32 merges a few neighbours 3 cm apart at y ≈ 487,000 m)
EXACT = {"fields": "xyz,intensity", "point_labels": "classification", "dtype": "float64"}


def las_table(path: Path, columns=("x", "y", "z")) -> np.ndarray:
    las = laspy.read(path)
    return np.stack([np.asarray(las[c] if c not in "xyz" else getattr(las, c), np.float64)
                     for c in columns], axis=1)


def rows(a: np.ndarray) -> set[bytes]:
    a = np.ascontiguousarray(a)
    return {r.tobytes() for r in a.reshape(-1, a.shape[-1])}


def raw_records(path: Path) -> dict[str, np.ndarray]:
    reader = get_container(packdata.open(path).container_name).READER(path)
    try:
        return reader.read(np.arange(reader.manifest.count))
    finally:
        reader.close()


@pytest.fixture(scope="session")
def tree_folder(tmp_path_factory) -> Path:
    """Class sub-folders: 'filtered' (LAS) and 'surf' (LAZ), two real trees each."""
    root = tmp_path_factory.mktemp("trees")
    for name, files in (("filtered", FILTERED), ("surf", SURF)):
        (root / name).mkdir()
        for f in files:
            shutil.copy(f, root / name / f.name)
    return root


def convert(src: Path, dst: Path, **options):
    options = {"points": N, "variants": K, **options}
    return packdata.convert(packdata.open_source(src, **options), dst, workers=1)


@pytest.fixture(scope="session")
def fps_h5(tree_folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pc") / "fps.h5"
    return convert(tree_folder, out, **EXACT, sampling="fps").path


def test_shapes_dtypes_and_manifest(fps_h5):
    ds = packdata.open(fps_h5)
    m = ds.manifest
    assert m.kind == "pointcloud" and len(ds) == 4 and ds.classes == ["filtered", "surf"]
    assert m.fields["points"].shape == (K, N, 4) and m.fields["points"].dtype == "<f8"
    assert m.fields["point_labels"].shape == (K, N)
    assert m.options["columns"] == ["x", "y", "z", "intensity"]
    assert m.options["sampling"] == "fps" and m.options["variants"] == K and m.options["seed"] == 0
    counts = [laspy.read(f).header.point_count for f in FILTERED + SURF]
    assert m.extra["num_points"] == counts
    points, label, point_labels = ds[0]
    assert points.shape == (N, 4) and points.dtype == torch.float64  # as stored
    assert label.dtype == torch.int64 and int(label) == 0
    assert point_labels.shape == (N,) and point_labels.dtype == torch.int64
    points, labels, point_labels = ds[[3, 1]]
    assert points.shape == (2, N, 4) and labels.tolist() == [1, 0]


@pytest.mark.parametrize("sampling", ["random", "fps", "voxel"])
def test_stored_points_are_source_points(tmp_path, tree_folder, sampling, fps_h5):
    path = fps_h5 if sampling == "fps" else convert(
        tree_folder, tmp_path / "o.h5", sampling=sampling, **EXACT).path
    rec = raw_records(path)
    for i, f in enumerate(FILTERED + SURF):
        source = las_table(f, ("x", "y", "z", "intensity"))
        for v in range(K):
            stored = rec["points"][i, v]
            assert rows(stored) <= rows(source), f"{f.name} variant {v}"
            assert len(rows(stored)) == N  # distinct: no point taken twice
        cls = np.asarray(laspy.read(f).classification)
        lookup = {r.tobytes(): c for r, c in zip(source[:, :3].copy(), cls)}
        stored_xyz = np.ascontiguousarray(rec["points"][i, 0, :, :3])
        assert [lookup[r.tobytes()] for r in stored_xyz] == rec["point_labels"][i, 0].tolist()


def test_determinism_seed_and_variants(tmp_path, tree_folder, fps_h5):
    again = raw_records(convert(tree_folder, tmp_path / "a.lmdb", sampling="fps", **EXACT).path)
    first = raw_records(fps_h5)
    assert np.array_equal(first["points"], again["points"])
    other = raw_records(convert(tree_folder, tmp_path / "b.h5", sampling="fps", seed=1).path)
    assert not np.array_equal(first["points"][..., :3], other["points"])
    for cloud in first["points"]:
        assert all(rows(cloud[a]) != rows(cloud[b]) for a in range(K) for b in range(a))


def test_epochs_serve_different_variants(fps_h5):
    ds = packdata.open(fps_h5)
    stored = raw_records(fps_h5)["points"]
    served = []
    for epoch in range(K + 1):
        ds.set_epoch(epoch)
        served.append(ds[[0, 1]][0].numpy())
    for epoch in range(K):
        assert np.array_equal(served[epoch][0], stored[0, epoch % K])
        assert np.array_equal(served[epoch][1], stored[1, (1 + epoch) % K])
    assert np.array_equal(served[K], served[0])


@pytest.fixture(scope="module")
def twelve_trees(tmp_path_factory) -> Path:
    """The four real trees, three times each (under other names: sampled afresh), in their class
    folders: more records than a default open checks (8), so a read meets records unchecked."""
    root = tmp_path_factory.mktemp("twelve")
    for name, files in (("filtered", FILTERED), ("surf", SURF)):
        (root / name).mkdir()
        for copy in range(3):
            for f in files:
                shutil.copy(f, root / name / f"{f.stem}_{copy}{f.suffix}")
    return root


def flip_stored_bytes(path: Path, stored: np.ndarray) -> None:
    """Flip a byte in the middle of ``stored``'s bytes where the container holds them, found by
    content (raw in LMDB, HDF5 and tar alike, and in one place only)."""
    needle = np.ascontiguousarray(stored).tobytes()
    for f in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
        data = bytearray(f.read_bytes())
        at = data.find(needle)
        if at >= 0:
            assert data.find(needle, at + 1) < 0, "the bytes are stored twice"
            data[at + len(needle) // 2] ^= 0x40
            f.write_bytes(bytes(data))
            return
    raise AssertionError(f"{len(needle)} bytes not found under {path}")


@pytest.mark.parametrize("native", [True, False], ids=["checked-as-gathered", "pure"])
@pytest.mark.parametrize("target", ["v.lmdb", "v.h5", "v-tar"])
def test_a_variant_read_is_checked_by_that_variant_alone(tmp_path, twelve_trees, target, native,
                                                         monkeypatch):
    """Each variant has its checksum (with the record's other fields): the default open serves
    the intact variants of a record whose other variant is damaged, refuses the damaged one
    whenever it is served (by any path), and packdata verify names the record. Where packdata's
    C extension was built, each variant is checked as it is gathered (no hashing after the
    read); without it, after."""
    if native:
        needs_native_rows()
    monkeypatch.setattr(checksum, "NATIVE_ROWS", native)
    path = convert(twelve_trees, tmp_path / target).path
    fields = packdata.open(path, verify="off").manifest.fields
    assert fields["variant_checksums"] == Field("<u8", (K,), checks_entries_of=("points",))
    stored = raw_records(path)["points"]
    record = 2  # records 0, 1, 3, 4, 6, 7, 9, 11 are checked at open
    flip_stored_bytes(path, stored[record, 1])
    ds = packdata.open(path)
    assert ds.reader.gathers_checked == native
    if native:  # the entries' hashes after a read are not taken
        monkeypatch.setattr(integrity, "entry_checksums", None)
    ds.set_epoch(0)  # record i serves variant (i + epoch) % K: record 2, variant 2
    assert np.array_equal(ds[record][0].numpy(), stored[record, 2])
    assert sum(len(b[0]) for b in packdata.loader(ds, batch_size=5, shuffle=True)) == 12
    ds.set_epoch(2)  # variant 1: damaged, though the record was read (and checked) before
    with pytest.raises(DatasetError, match=f"record {record} .*does not match its checksum"):
        ds[record]
    with pytest.raises(DatasetError, match=f"record {record} "):
        list(packdata.loader(ds, batch_size=5, epoch=2))
    ds.set_epoch(1)  # variant 0, intact
    assert np.array_equal(ds[[record, 5]][0][0].numpy(), stored[record, 0])
    report = verify(path)
    assert [bad["index"] for bad in report.bad] == [record], report.bad


def test_a_damaged_variant_checksum_refuses_its_variant(tmp_path, twelve_trees):
    """The stored checksums are data too: a byte flipped in variant 1's refuses variant 1
    (the others are checked by their own), and a whole-record read names the record."""
    path = convert(twelve_trees, tmp_path / "c.h5").path
    record = 5
    stored = raw_records(path)
    flip_stored_bytes(path, stored["variant_checksums"][record])  # the middle byte: variant 1's
    ds = packdata.open(path)
    for epoch, variant in ((0, 2), (1, 0)):  # record 5 serves variant (5 + epoch) % 3
        ds.set_epoch(epoch)
        assert np.array_equal(ds[record][0].numpy(), stored["points"][record, variant])
    ds.set_epoch(2)
    with pytest.raises(DatasetError, match=f"record {record} "):
        ds[record]
    assert [bad["index"] for bad in verify(path).bad] == [record]


@pytest.mark.parametrize("container", ["tar", "lmdb", "hdf5"])
def test_parts_joined_hold_the_records_of_one_process(tmp_path, twelve_trees, container):
    """Converted in parts of 5 records and joined, the dataset reads as one written at once:
    tar's index keeps each record's K variant checksums as a row of K, as a single writer's."""
    source = packdata.open_source(twelve_trees, points=N, variants=K)
    one = packdata.convert(source, tmp_path / "one", container=container, workers=1).path
    parts = packdata.convert(source, tmp_path / "parts", container=container, part_size=5,
                             workers=1).path
    expected, joined = raw_records(one), raw_records(parts)
    for name in expected:
        assert np.array_equal(joined[name], expected[name]), name
    assert verify(parts).ok


def test_verify_names_a_variant_checksums_member_that_differs_from_the_index(tmp_path,
                                                                           twelve_trees):
    """Tar reads the variant checksums from its index; their ``.npy`` member (what other tar
    readers get) edited alone is found by verify, not served by reads."""
    path = convert(twelve_trees, tmp_path / "v-tar").path
    with np.load(path / "index.npz") as z:
        shard = int(z["variant_checksums.shard"][4])
        offset = int(z["variant_checksums.offset"][4])
    shard_file = sorted(path.glob("*.tar"))[shard]
    data = bytearray(shard_file.read_bytes())
    data[offset + 9] ^= 0x01  # variant 1's checksum, in the member only
    shard_file.write_bytes(bytes(data))
    ds = packdata.open(path)
    assert all(len(ds[i][0]) == N for i in range(len(ds)))  # reads check against the index's
    report = verify(path)
    assert [b["index"] for b in report.bad] == [4]
    assert "member copy of 'variant_checksums'" in report.bad[0]["problem"]


def test_inspect_says_what_the_variant_checksums_check(tmp_path, tree_folder):
    path = convert(tree_folder, tmp_path / "i.h5", point_labels="classification").path
    result = CliRunner().invoke(app, ["inspect", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "a checksum per entry of points, point_labels" in result.output


def test_one_variant_is_checked_by_its_record_checksum_alone(tmp_path, tree_folder):
    result = convert(tree_folder, tmp_path / "one.h5", variants=1)
    assert "variant_checksums" not in result.manifest.fields
    assert result.manifest.entry_checks is None
    assert packdata.open(result.path)[3][0].shape == (N, 3)


def test_a_variant_the_records_do_not_store_is_named(fps_h5):
    """A manifest whose variant count exceeds what the records store (an edit the manifest's
    own checksum would refuse at open, made here in memory) fails by the dataset's name."""
    ds = packdata.open(fps_h5)
    ds.manifest.options["variants"] = K + 3
    ds.set_epoch(K + 2)  # record 0 serves variant K + 2
    with pytest.raises(DatasetError, match=f"asks for entry {K + 2} of 'points', which stores {K}"):
        ds[0]


def test_set_epoch_reaches_persistent_workers(fps_h5):
    ds = packdata.open(fps_h5)
    stored = raw_records(fps_h5)["points"]
    batches = packdata.loader(ds, 2, shuffle=False, num_workers=2, persistent_workers=True)
    for epoch in range(K):
        ds.set_epoch(epoch)
        points = next(iter(batches))[0].numpy()
        assert np.array_equal(points[0], stored[0, epoch % K])


def test_random_variant_order_is_seeded(tmp_path, tree_folder):
    path = convert(tree_folder, tmp_path / "r.h5", sampling="random", variants=4,
                   variant_order="random").path
    ds = packdata.open(path)
    picks = []
    for epoch in range(6):
        ds.set_epoch(epoch)
        picks.append([ds[i][0].numpy().tobytes() for i in range(len(ds))])
    assert len({tuple(p) for p in picks}) > 1
    ds.set_epoch(2)
    assert [ds[i][0].numpy().tobytes() for i in range(len(ds))] == picks[2]


def test_fps_covers_better_than_random(tmp_path, tree_folder, fps_h5):
    rand = raw_records(convert(tree_folder, tmp_path / "r.h5", sampling="random", **EXACT).path)
    fps = raw_records(fps_h5)
    for i, f in enumerate(SURF, start=2):
        xyz = las_table(f)
        index = {r.tobytes(): j for j, r in enumerate(xyz)}
        radius = {}
        for name, rec in (("fps", fps), ("random", rand)):
            chosen = [index[r.tobytes()] for r in np.ascontiguousarray(rec["points"][i, 0, :, :3])]
            radius[name] = coverage_radius(xyz, np.array(chosen))
        assert radius["fps"] < 0.7 * radius["random"], radius


@pytest.mark.parametrize("target", ["rt.lmdb", "rt.h5", "rt-tar"])
def test_round_trip_every_container(tmp_path, tree_folder, fps_h5, target):
    path = convert(tree_folder, tmp_path / target, sampling="fps", **EXACT).path
    expected, got = raw_records(fps_h5), raw_records(path)
    assert sorted(expected) == sorted(got)
    for name in expected:
        assert np.array_equal(expected[name], got[name]), name
    ds = packdata.open(path)
    batches = list(packdata.loader(ds, batch_size=3, shuffle=True))
    assert sum(len(b[0]) for b in batches) == 4 and batches[0][0].shape[1:] == (N, 4)
    # reading one selected variant per record gives exactly that slice of the full record
    reader = get_container(ds.container_name).READER(path)
    order, variant = np.array([3, 0, 2, 3]), np.array([1, 0, K - 1, 0])
    one = reader.read(order, {"points": variant})["points"]
    np.testing.assert_array_equal(one, got["points"][order, variant])


def test_fewer_points_replace_or_pad(tmp_path):
    folder = tmp_path / "small"
    folder.mkdir()
    shutil.copy(FILTERED[1], folder)  # 3,317 points
    n = 3317
    rep = convert(folder, tmp_path / "rep.h5", points=4096, variants=2, sampling="random",
                  dtype="float64")
    assert rep.manifest.extra["clouds_with_replacement"] == 1
    stored = raw_records(rep.path)["points"][0]
    assert all(len(rows(v)) == n for v in stored)  # every point at least once
    pad = convert(folder, tmp_path / "pad.h5", points=4096, variants=2, fewer="pad")
    assert pad.manifest.extra["clouds_padded"] == 1
    rec = raw_records(pad.path)
    assert rec["mask"].shape == (1, 2, 4096) and rec["mask"].sum(axis=-1).tolist() == [[n, n]]
    assert not rec["points"][0][~rec["mask"][0]].any()
    points, mask = packdata.open(pad.path)[0]
    assert mask.dtype == torch.bool and int(mask.sum()) == n


def test_nonfinite_points_dropped_and_counted(tmp_path):
    xyz = las_table(SURF[0])
    xyz[::100, 1] = np.nan
    xyz[5::100, 2] = np.inf
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "tree.npy", xyz)
    result = convert(folder, tmp_path / "o.h5", sampling="random")
    bad = int((~np.isfinite(xyz).all(axis=1)).sum())
    assert result.manifest.extra["nonfinite_points_dropped"] == bad
    assert result.manifest.extra["clouds_with_nonfinite"] == 1
    assert np.isfinite(raw_records(result.path)["points"]).all()


def test_float16_overflow_is_an_error_not_infinities(tmp_path, tree_folder):
    """Map coordinates (hundreds of thousands of metres) do not fit float16 unnormalised."""
    with pytest.raises(SampleError, match="overflow float16.*--normalize"):
        convert(tree_folder, tmp_path / "f.h5", dtype="float16")
    assert not (tmp_path / "f.h5").exists()


def test_normalize_and_float16(tmp_path, tree_folder):
    result = convert(tree_folder, tmp_path / "n.h5", normalize="unit_sphere", dtype="float16")
    rec = raw_records(result.path)
    assert rec["points"].dtype == np.float16
    assert packdata.open(result.path)[0][0].dtype == torch.float32  # served in a compute type
    radius = np.linalg.norm(rec["points"].astype(np.float32), axis=-1)
    assert radius.max() <= 1.001 and radius.max() > 0.8
    xyz = las_table(FILTERED[0])
    assert np.allclose(rec["center"][0], xyz.mean(axis=0))
    back = rec["points"][0, 0].astype(np.float64) * rec["scale"][0] + rec["center"][0]
    assert np.abs(back[:, None, :2] - xyz[None, ::7, :2]).min(axis=1).max() < 5  # metres, coarse


def test_ply_xyz_npy_sources_match_las(tmp_path):
    las = laspy.read(FILTERED[0])
    table = np.stack([las.x, las.y, las.z, np.asarray(las.intensity, np.float64)], axis=1)
    folder = tmp_path / "formats"
    folder.mkdir()
    header = ("ply\nformat {}\nelement vertex " + str(len(table)) + "\nproperty double x\n"
              "property double y\nproperty double z\nproperty ushort intensity\nend_header\n")
    rec = np.zeros(len(table), dtype=[("x", "<f8"), ("y", "<f8"), ("z", "<f8"), ("i", "<u2")])
    rec["x"], rec["y"], rec["z"], rec["i"] = table.T
    (folder / "bin.ply").write_bytes(header.format("binary_little_endian 1.0").encode()
                                     + rec.tobytes())
    with open(folder / "text.ply", "w") as f:
        f.write(header.format("ascii 1.0"))
        np.savetxt(f, table, fmt="%.3f %.3f %.3f %d")
    np.savetxt(folder / "spaced.xyz", table, fmt="%.3f", header="X Y Z Intensity", comments="//")
    np.savetxt(folder / "commas.txt", table, fmt="%.3f", delimiter=",")  # 4 unnamed columns
    np.save(folder / "array.npy", table)
    for path in sorted(folder.iterdir()):
        got = pointfiles.select(pointfiles.read_columns(path, ["x", "y", "z", "intensity"]),
                                ["xyz", "intensity"], path)
        assert np.allclose(got, table, atol=1e-6), path.name
    assert packdata.sources.detect_kind(folder) == "pointcloud"
    result = convert(folder, tmp_path / "f.h5", fields="xyz,intensity")
    assert result.manifest.count == 5


def test_bad_las_files(tmp_path):
    data = FILTERED[0].read_bytes()
    folder = tmp_path / "bad"
    folder.mkdir()
    shutil.copy(FILTERED[1], folder / "a_good.las")
    (folder / "b_truncated.las").write_bytes(data[: len(data) // 2])
    (folder / "c_header.las").write_bytes(b"LASX" + data[4:])  # corrupt signature
    laz = SURF[0].read_bytes()
    (folder / "d_truncated.laz").write_bytes(laz[: len(laz) // 2])
    aligned = data[: len(data) - 34 * 100]  # whole records missing: laspy reads it silently
    (folder / "e_short.las").write_bytes(aligned)
    with pytest.raises(SampleError, match="b_truncated.las"):
        convert(folder, tmp_path / "o.h5")
    result = packdata.convert(packdata.open_source(folder, points=256), tmp_path / "o.h5",
                              on_error="skip", workers=1)
    skipped = {Path(s["path"]).name: s["reason"] for s in result.skipped}
    assert sorted(skipped) == ["b_truncated.las", "c_header.las", "d_truncated.laz", "e_short.las"]
    assert "truncated: the header says 4040 points" in skipped["e_short.las"]
    assert packdata.open(result.path).keys == ["a_good"]


def panicking_laz(data: bytes) -> bytes:
    """A real LAZ damaged the way lazrs does not check: its LASzip record made to say
    variable-size chunks, and its chunk table to say there are none."""
    out = bytearray(data)
    vlr = out.find(b"laszip encoded") - 2 + 54  # VLR header: 54 bytes from its reserved field
    struct.pack_into("<I", out, vlr + 12, 0xFFFFFFFF)  # chunk size: variable
    point_data = struct.unpack_from("<I", out, 96)[0]  # LAS header: offset to point data
    table = struct.unpack_from("<q", out, point_data)[0]  # LAZ: chunk table offset comes first
    struct.pack_into("<I", out, table + 4, 0)  # chunk table: version, then chunk count
    return bytes(out)


@pytest.mark.parametrize("workers", [1, 2])
def test_decoder_panic_is_that_files_error(tmp_path, workers):
    """lazrs panics (pyo3's PanicException, a BaseException) on some damaged LAZ files: that is
    the file's SampleError, or a counted skip, in the parent and in workers alike."""
    folder = tmp_path / "p"
    folder.mkdir()
    shutil.copy(FIXTURES / "simple.laz", folder / "a_good.laz")
    (folder / "b_panics.laz").write_bytes(panicking_laz((FIXTURES / "simple.laz").read_bytes()))
    with pytest.raises(BaseException) as raised:
        laspy.read(folder / "b_panics.laz", laz_backend=laspy.LazBackend.Lazrs)
    assert not isinstance(raised.value, Exception)  # it does panic, past `except Exception`
    source = packdata.open_source(folder, points=256)
    with pytest.raises(SampleError, match="b_panics.laz: cannot read point cloud .*Panic"):
        packdata.convert(source, tmp_path / "o.h5", workers=workers)
    result = packdata.convert(source, tmp_path / "o.h5", workers=workers, on_error="skip")
    assert [Path(s["path"]).name for s in result.skipped] == ["b_panics.laz"]
    assert packdata.open(result.path).keys == ["a_good"]


def test_a_header_claiming_billions_of_points_says_so(tmp_path):
    folder = tmp_path / "h"
    folder.mkdir()
    for name, src in (("a.las", FILTERED[0]), ("b.laz", FIXTURES / "simple.laz")):
        data = bytearray(src.read_bytes())
        struct.pack_into("<I", data, 107, 2**32 - 1)  # LAS 1.2 header: legacy point count
        (folder / name).write_bytes(bytes(data))
    reasons = {}
    for name in ("a.las", "b.laz"):
        with pytest.raises(SampleError) as info:
            pointfiles.read_columns(folder / name, ["x", "y", "z"])
        reasons[name] = info.value.reason
    assert reasons["a.las"] == "truncated: the header says 4294967295 points, the file holds 4040"
    assert reasons["b.laz"].startswith("the header says 4294967295 points, more than fit")


def test_float32_precision_loss_is_warned_and_the_manifest_says_what_was_applied(
        tmp_path, tree_folder):
    """The fixtures' scale is 1 cm; float32 at y ≈ 487,434 m steps by 3.1 cm."""
    with pytest.warns(InputWarning, match=r"float32 stores coordinates in steps of up to 0.0312 "
                                          r"\(file units\) where the files' own scale is 0.01"):
        raw = convert(tree_folder, tmp_path / "raw.h5", variants=1).manifest
    assert raw.extra["precision"]["largest_step"] == 2.0**-5
    assert raw.extra["coordinates"].startswith("stored = file coordinates (no offset")
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)  # centred, float32 keeps the centimetres
        centred = convert(tree_folder, tmp_path / "c.h5", variants=1, normalize="center").manifest
    assert centred.extra["precision"]["files_coarser_than_their_scale"] == 0
    assert "per-record field 'center'" in centred.extra["coordinates"]


def test_missing_field_names_field_and_file(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    shutil.copy(FILTERED[0], folder)
    with pytest.raises(SampleError, match=f"{FILTERED[0].name}: field 'nir' not found"):
        convert(folder, tmp_path / "o.h5", fields="xyz,nir")
    with pytest.raises(SampleError, match="point-label field 'segment' not found"):
        convert(folder, tmp_path / "o.h5", point_labels="segment")


def test_laz_without_backend_names_the_extra(tmp_path, tree_folder, monkeypatch):
    monkeypatch.setattr(laspy.LazBackend, "detect_available", staticmethod(lambda: ()))
    with pytest.raises(MissingExtraError, match=r'pip install "packdata\[lidar\]"'):
        convert(tree_folder, tmp_path / "o.h5")


def test_options_are_validated(tree_folder):
    with pytest.raises(PackdataError, match="sampling 'best'"):
        packdata.open_source(tree_folder, sampling="best")
    with pytest.raises(PackdataError, match="does not apply to pointcloud"):
        packdata.open_source(tree_folder, resize=32)


def test_cli_convert(tmp_path, tree_folder, png_folder):
    runner = CliRunner()
    out = tmp_path / "cli.h5"
    result = runner.invoke(app, ["convert", str(tree_folder), str(out), "--points", "512",
                                 "--sampling", "voxel", "--variants", "2", "--fields",
                                 "xyz,rgb", "--normalize", "center", "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert "4 pointcloud samples" in result.output
    m = packdata.open(out).manifest
    assert m.fields["points"].shape == (2, 512, 6) and m.options["normalize"] == "center"
    result = runner.invoke(app, ["convert", str(png_folder), str(tmp_path / "x.h5"),
                                 "--points", "512"])
    assert result.exit_code == 2 and "option --points does not apply to image" in result.output


def test_parallel_convert_after_laz_was_read_in_the_parent(tmp_path):
    """laspy's default LAZ backend starts a thread pool; forked workers then used to hang."""
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(260):  # > one 256-item block, so convert forks 2 workers
        (folder / f"c{i:03d}.laz").symlink_to(FIXTURES / "simple.laz")
    script = (
        "import sys, laspy, packdata\n"
        f"laspy.read({str(SURF[0])!r})\n"  # default backend: lazrs with its thread pool
        f"src = packdata.open_source({str(folder)!r}, points=256, sampling='random')\n"
        f"print(packdata.convert(src, {str(tmp_path / 'o.h5')!r}, workers=2).manifest.count)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "260"


@pytest.mark.parametrize("normalize", ["center", "unit_sphere"])
def test_precision_advice_never_repeats_an_option_given(tmp_path, tree_folder, normalize):
    """float16 steps by more than the files' 1 cm even once centred (trees ~20 m tall) or scaled
    into the unit sphere: the advice is a wider type, never the normalisation already given."""
    with pytest.warns(InputWarning, match=r"float16 stores coordinates") as record:
        packdata.open_source(tree_folder, normalize=normalize, dtype="float16").items()
    message = str(record[0].message)
    assert "--normalize" not in message, message
    assert message.endswith("; use --dtype float32 or float64"), message
    with pytest.warns(InputWarning, match=r"; use --normalize center, or --dtype float64$"):
        packdata.open_source(tree_folder, dtype="float32").items()



def outside_box(las) -> bool:
    xyz = np.stack([las.x, las.y, las.z], axis=1)
    return bool(((xyz < las.header.mins) | (xyz > las.header.maxs)).any())


def test_garbage_in_compressed_points_decoding_outside_the_bounding_box_is_damaged_input(
        tmp_path):
    """4 KB of zeros written into the compressed points of a copy of a real LAZ file: lazrs
    decodes it without complaint, into coordinates outside the header's bounding box."""
    data = bytearray((FIXTURES / "simple.laz").read_bytes())
    with (FIXTURES / "simple.laz").open("rb") as f:
        header = laspy.LasHeader.read_from(f)
    at = header.offset_to_point_data + 3578  # past the chunk-table offset, inside the points
    data[at : at + 4096] = bytes(4096)
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "damaged.laz").write_bytes(bytes(data))
    shutil.copy(FIXTURES / "simple.las", folder / "intact.las")
    decoded = laspy.read(folder / "damaged.laz")  # the decoder itself says nothing
    assert len(decoded.points) == header.point_count and outside_box(decoded)
    with pytest.raises(SampleError, match=r"damaged.laz: damaged point data: [xyz] decodes to "
                                          r".* outside the header's bounding box"):
        pointfiles.read_columns(folder / "damaged.laz", ["x", "y", "z"])
    source = packdata.open_source(folder, points=64, normalize="center")
    with pytest.raises(SampleError, match="damaged.laz: damaged point data"):
        packdata.convert(source, tmp_path / "fail.h5", workers=1)
    result = packdata.convert(source, tmp_path / "skip.h5", workers=1, on_error="skip")
    assert [s["path"] for s in result.skipped] == [str(folder / "damaged.laz")]
    assert packdata.open(result.path).keys == ["intact"]


def test_a_laz_file_that_aborts_its_decoder_is_a_named_error_with_one_worker(tmp_path):
    """Random bytes over the compressed points of a real LAZ file make lazrs abort the process
    that decodes it (checked in a child): conversion loads point clouds in a worker process even
    with workers=1 (the source declares ISOLATE_LOADING), so it ends in an error naming the file."""
    import random

    data = bytearray((FIXTURES / "simple.laz").read_bytes())
    data[18022 : 18022 + 4096] = random.Random(26).randbytes(len(data[18022 : 18022 + 4096]))
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "damaged.laz").write_bytes(bytes(data))
    shutil.copy(FIXTURES / "simple.las", folder / "intact.las")
    decoder = subprocess.run([sys.executable, "-c", "import laspy, sys; laspy.read(sys.argv[1])",
                              str(folder / "damaged.laz")], capture_output=True, timeout=120)
    assert decoder.returncode < 0  # killed by a signal: the decoder itself does not survive it
    script = ("import sys, packdata\nfrom packdata.errors import PackdataError\n"
              "source = packdata.open_source(sys.argv[1], points=64)\n"
              "try:\n    packdata.convert(source, sys.argv[2], workers=1)\n"
              "except PackdataError as exc:\n    print('refused:', exc)\n")
    done = subprocess.run([sys.executable, "-c", script, str(folder), str(tmp_path / "out.h5")],
                          capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("refused:") and "damaged.laz" in done.stdout, done.stdout
    assert not (tmp_path / "out.h5").exists()  # nothing that looks like a dataset is left


def test_intact_files_lie_inside_their_bounding_box(tmp_path):
    """The check refuses no intact file: the fixtures; nor a header that states its box as the
    stored integers (as laspy's sample simple1_3.las was written), which match the points."""
    for path in sorted(FIXTURES.glob("*.la[sz]")) + sorted(
            (FIXTURES.parent / "lidar-pieces").rglob("*.las")):
        assert len(pointfiles.read_columns(path, ["x", "y", "z"])["x"])
    las = laspy.read(FIXTURES / "simple.las")
    data = bytearray((FIXTURES / "simple.las").read_bytes())
    h = las.header
    raw = [np.asarray(las[d]) for d in ("X", "Y", "Z")]
    # LAS 1.0-1.4 public header: max x, min x, max y, min y, max z, min z at byte 179
    struct.pack_into("<6d", data, 179, *[float(f(r)) for r in raw for f in (np.max, np.min)])
    (tmp_path / "stated.las").write_bytes(bytes(data))
    with (tmp_path / "stated.las").open("rb") as f:
        assert laspy.LasHeader.read_from(f).mins[0] == raw[0].min() != h.mins[0]
    assert len(pointfiles.read_columns(tmp_path / "stated.las", ["x", "y", "z"])["x"]) == 1065
    data[179 : 179 + 8] = struct.pack("<d", float(raw[0].max() - 5))  # and now it does not match
    (tmp_path / "short.las").write_bytes(bytes(data))
    with pytest.raises(SampleError, match="short.las: damaged point data: x decodes"):
        pointfiles.read_columns(tmp_path / "short.las", ["x", "y", "z"])


@pytest.mark.parametrize("fields", [5, ["xyz", 3], {"intensity": 1}])
def test_fields_that_are_not_names_are_refused_by_name(fields):
    from packdata.sources.pointclouds import parse_fields

    with pytest.raises(packdata.errors.OptionError, match="--fields .*expected names"):
        parse_fields(fields)  # 5 was a TypeError from iterating it
    assert parse_fields(["intensity"]) == parse_fields("intensity") == ["xyz", "intensity"]
