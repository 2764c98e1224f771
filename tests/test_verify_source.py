"""`packdata verify DST --source SRC` rebuilds the conversion from the options its manifest
recorded: datasets converted with non-default options of every kind pass intact, and a record
with one flipped byte is named. Real inputs: the CIFAR PNGs, the fixture PEPs and GPT-2
tokenizer, the fixture LiDAR trees."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

import packdata
from packdata.cli import app
from tests.conftest import copy_sample

runner = CliRunner()
LIDAR = Path(__file__).parent / "fixtures" / "lidar"


def verify_source(dst: Path, src: Path) -> tuple[int, str]:
    result = runner.invoke(app, ["verify", str(dst), "--source", str(src)])
    output = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        output += repr(result.exception)  # a traceback, not a report
    return result.exit_code, output


def flip_record_byte(path: Path, field: str, record: int) -> None:
    """Flip one byte inside ``record``'s ``field`` of an HDF5 dataset, found through h5py: the
    field's rows are contiguous; a variable field's rows start at ``<field>_offsets``."""
    with h5py.File(path, "r") as f:
        ds = f[field]
        row = ds.dtype.itemsize * int(np.prod(ds.shape[1:]))
        first = int(f[f"{field}_offsets"][record]) if f"{field}_offsets" in f else record
        offset = ds.id.get_offset() + first * row + 1
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def intact_then_flipped(dst: Path, src: Path, field: str, record: int = 2) -> None:
    code, output = verify_source(dst, src)
    assert code == 0, output
    count = packdata.open(dst).manifest.count
    assert f"{count} of {count} records checked, {count} compared" in output
    assert output.strip().endswith("OK")
    key = packdata.open(dst).keys[record]
    flip_record_byte(dst, field, record)
    code, output = verify_source(dst, src)
    assert code == 1, output
    assert f"bad: {key} (record {record}): checksum does not match" in output
    assert "Traceback" not in output and "Error(" not in output


@pytest.fixture(scope="module")
def pngs(tmp_path_factory) -> Path:
    return copy_sample(tmp_path_factory.mktemp("verify-src") / "png", count=20)


@pytest.mark.parametrize("options", [
    {"encoding": "keep"}, {"resize": "16"}, {"resize": "24x12"}, {"mode": "L"},
    {"max_size": 16},
], ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_image_options(tmp_path, pngs, options):
    dst = packdata.convert(packdata.open_source(pngs, **options), tmp_path / "d.h5",
                           workers=1).path
    intact_then_flipped(dst, pngs, "image")


def test_labels_file_outside_the_source(tmp_path, pngs):
    src = shutil.copytree(pngs, tmp_path / "src")
    labels = json.loads((src / "labels.json").read_text())
    (src / "labels.json").unlink()
    labels["labels"] = {k: 9 - v for k, v in labels["labels"].items()}  # not the folder's own
    (tmp_path / "mine.json").write_text(json.dumps(labels))
    dst = packdata.convert(packdata.open_source(src, labels=tmp_path / "mine.json"),
                           tmp_path / "d.h5", workers=1).path
    assert packdata.open(dst)[0][1] == 9 - json.loads((pngs / "labels.json").read_text())[
        "labels"][sorted(labels["labels"])[0]]
    intact_then_flipped(dst, src, "label")


def test_a_dataset_from_a_moved_source_finds_its_own_labels_file(tmp_path, pngs):
    dst = packdata.convert(packdata.open_source(pngs), tmp_path / "d.h5", workers=1).path
    assert packdata.open(dst).manifest.options["labels"] is None  # found in SRC, found again
    moved = shutil.copytree(pngs, tmp_path / "moved")
    intact_then_flipped(dst, moved, "label")


def test_labels_in_the_source_but_not_in_the_dataset_are_named_not_a_traceback(tmp_path, pngs):
    src = shutil.copytree(pngs, tmp_path / "src")
    (src / "labels.json").rename(tmp_path / "labels.json")
    dst = packdata.convert(packdata.open_source(src), tmp_path / "d.h5", workers=1).path
    (tmp_path / "labels.json").rename(src / "labels.json")  # now the source has labels
    code, output = verify_source(dst, src)
    assert code == 1 and "Traceback" not in output
    assert "has fields ['image', 'label'], the dataset ['image']" in output


def test_text_tokenizer_and_max_length(tmp_path, peps_dir, gpt2_json):
    src = tmp_path / "peps"
    src.mkdir()
    for f in sorted(peps_dir.glob("*.txt"))[:6]:
        shutil.copy(f, src / f.name)
    source = packdata.open_source(src, tokenizer=str(gpt2_json), max_length=64, add_eos=True)
    dst = packdata.convert(source, tmp_path / "t.h5", workers=1).path
    assert {len(d) for d in packdata.open(dst)[list(range(6))]} == {64}
    intact_then_flipped(dst, src, "tokens")


def test_text_split_chunks(tmp_path, peps_dir):
    src = tmp_path / "peps"
    src.mkdir()
    for f in sorted(peps_dir.glob("*.txt"))[:3]:
        shutil.copy(f, src / f.name)
    source = packdata.open_source(src, max_length=500, split=True, add_bos=True)
    dst = packdata.convert(source, tmp_path / "t.h5", workers=1).path
    assert len(packdata.open(dst)) > 3
    intact_then_flipped(dst, src, "tokens", record=4)


def test_a_changed_tokenizer_file_is_refused_by_name(tmp_path, peps_dir, gpt2_json):
    tok = shutil.copy(gpt2_json, tmp_path / "tokenizer.json")
    dst = packdata.convert(packdata.open_source(peps_dir, tokenizer=str(tok), max_length=64),
                           tmp_path / "t.h5", workers=1).path
    Path(tok).write_text(Path(tok).read_text().replace('"max_length": 50', '"max_length": 51'))
    code, output = verify_source(dst, peps_dir)
    assert code != 0 and "Traceback" not in output
    assert "tokenizer.json: the file changed since the dataset was converted" in output


def test_pointcloud_points_and_sampling(tmp_path):
    src = tmp_path / "trees"
    src.mkdir()
    for f in sorted(LIDAR.glob("ahn_*.la[sz]")):
        shutil.copy(f, src / f.name)
    source = packdata.open_source(src, points=1024, sampling="random", variants=2,
                                  normalize="center", fields="xyz,intensity", seed=3)
    dst = packdata.convert(source, tmp_path / "p.h5", workers=1).path
    assert packdata.open(dst).manifest.fields["points"].shape == (2, 1024, 4)
    intact_then_flipped(dst, src, "points")


def test_recorded_options_recreate_the_source(tmp_path, pngs, peps_dir, gpt2_json):
    """What each kind records is exactly what opening it again with those options records."""
    for root, options in ((pngs, {"resize": "20x10", "mode": "L"}),
                          (LIDAR / "simple.las", {"points": 64, "sampling": "voxel",
                                                  "fields": "intensity"}),
                          (peps_dir, {"tokenizer": str(gpt2_json), "max_length": 9})):
        source = packdata.open_source(root, **options)
        recorded = json.loads(json.dumps(source.options()))  # as a manifest holds them
        assert packdata.open_source(root, source.kind, **recorded).options() == recorded


def test_an_input_that_aborts_its_decoder_is_reported_not_fatal(tmp_path):
    """A LAZ file whose compressed points are overwritten with random bytes makes lazrs abort the
    process decoding it (tests/test_pointclouds.py checks that): ``verify --source`` loads point
    clouds in a worker process, as conversion does, so it ends with an error naming the file."""
    import random
    import subprocess
    import sys

    src = tmp_path / "trees"
    src.mkdir()
    shutil.copy(LIDAR / "simple.las", src / "intact.las")
    shutil.copy(LIDAR / "simple.laz", src / "later.laz")
    dst = packdata.convert(packdata.open_source(src, points=64), tmp_path / "p.h5", workers=1).path
    data = bytearray((src / "later.laz").read_bytes())
    data[18022 : 18022 + 4096] = random.Random(26).randbytes(len(data[18022 : 18022 + 4096]))
    (src / "later.laz").write_bytes(bytes(data))
    done = subprocess.run([sys.executable, "-m", "packdata", "verify", str(dst), "--source",
                           str(src)], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parents[1])
    assert done.returncode > 0, (done.returncode, done.stderr[-2000:])  # not killed by a signal
    output = done.stdout + done.stderr
    assert "later.laz" in output and "stopped unexpectedly" in output, output
    assert "Traceback" not in output


def test_verify_rebuilds_the_source_from_a_folder_it_is_given(tmp_path, pngs):
    """packdata.verify(path, source=folder): the library makes the Source the manifest
    recorded (the command line only passes the folder on)."""
    dst = packdata.convert(packdata.open_source(pngs, mode="L"), tmp_path / "grey.h5",
                           workers=1).path
    report = packdata.verify(dst, source=pngs)
    assert report.ok and report.compared == report.count == 20 and report.source == str(pngs)
    assert report.lines()[0].endswith(f"20 of 20 records checked, 20 compared with {pngs}")
    with pytest.raises(packdata.PackdataError, match="missing: no such file or directory"):
        packdata.verify(dst, source=tmp_path / "missing")
