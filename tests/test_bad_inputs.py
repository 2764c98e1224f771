"""A generated bad-input corpus, made here from real files (CIFAR-10 PNGs, AHN LiDAR, PEPs), each
case through the `packdata convert` command: without --on-error skip a non-zero exit and one line
naming the file and the problem; with it, a counted skip listed in the manifest."""

from __future__ import annotations

import io
import json
import shutil
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

import packdata
from packdata.cli import app
from packdata.units import plural
from tests.conftest import TEXT_FIXTURES, copy_sample

runner = CliRunner()
LIDAR = Path(__file__).parent / "fixtures" / "lidar"


def png_with_size(data: bytes, width: int, height: int) -> bytes:
    """A real PNG whose IHDR claims another size (its CRC fixed, so only the size is wrong)."""
    ihdr = data[12:29]  # chunk type + 13 bytes of data
    patched = ihdr[:4] + struct.pack(">II", width, height) + ihdr[12:]
    return data[:12] + patched + struct.pack(">I", zlib.crc32(patched)) + data[33:]


def damage_image(folder: Path, case: str) -> str | list[str]:
    """Damage one image of ``folder`` as ``case`` says; returns the bad file's name."""
    names = sorted(p.name for p in folder.glob("*.png"))
    bad = folder / names[5]
    data = bad.read_bytes()
    if case == "truncated png":
        bad.write_bytes(data[: len(data) // 2])
    elif case == "truncated jpeg":
        with Image.open(io.BytesIO(data)) as im:
            out = io.BytesIO()
            im.save(out, format="JPEG")
        bad.unlink()
        bad = bad.with_suffix(".jpg")
        bad.write_bytes(out.getvalue()[: len(out.getvalue()) // 2])
        labels = json.loads((folder / "labels.json").read_text())
        labels["labels"][bad.name] = labels["labels"].pop(names[5])
        (folder / "labels.json").write_text(json.dumps(labels))
    elif case == "zero bytes":
        bad.write_bytes(b"")
    elif case == "text named .png":
        bad.write_bytes((TEXT_FIXTURES / "peps" / "pep-0210.txt").read_bytes())
    elif case == "decompression bomb":
        bad.write_bytes(png_with_size(data, 40_000, 40_000))
    elif case == "symlink loop":
        bad.unlink()
        loop = folder / "loop.png"
        bad.symlink_to(loop)
        loop.symlink_to(bad)
        labels = json.loads((folder / "labels.json").read_text())
        labels["labels"]["loop.png"] = 0
        (folder / "labels.json").write_text(json.dumps(labels))
        return [bad.name, loop.name]  # both names are the loop
    elif case == "unlabelled file":
        labels = json.loads((folder / "labels.json").read_text())
        del labels["labels"][bad.name]
        (folder / "labels.json").write_text(json.dumps(labels))
    return bad.name


def damage_cloud(folder: Path, case: str) -> str:
    las = folder / "ahn_filtered_tree_121913_487434.las"
    laz = folder / "ahn_surf_ahn_surf_121913_487434.laz"
    if case == "corrupt las header":
        data = bytearray(las.read_bytes())
        data[0:4] = b"XXXX"
        las.write_bytes(bytes(data))
        return las.name
    if case == "truncated laz":
        laz.write_bytes(laz.read_bytes()[: laz.stat().st_size // 2])
        return laz.name
    if case == "header claims points it lacks":
        data = las.read_bytes()
        las.write_bytes(data[: len(data) - (len(data) - 400) // 2])  # half the point records
        return las.name
    if case == "zero points":
        import laspy

        with laspy.open(las) as f:
            header = f.header
        empty = laspy.LasData(header)
        empty.points = laspy.ScaleAwarePointRecord.zeros(0, header=header)
        empty.write(las)
        return las.name
    raise AssertionError(case)


def damage_text(folder: Path, case: str) -> str:
    bad = folder / "pep-0294.txt"
    if case == "not utf-8":
        data = bad.read_bytes()
        bad.write_bytes(data[:500] + b"\xff\xfe\xc3" + data[500:])
    elif case == "empty":
        bad.write_bytes(b"")
    elif case == "binary":
        bad.write_bytes(next((packdata.__path__[0] / Path("demo_data/cifar10")).glob("*.png"))
                        .read_bytes())
    return bad.name


def image_folder(tmp_path: Path) -> Path:
    return copy_sample(tmp_path / "in", count=30)


def cloud_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    for f in LIDAR.glob("ahn_*"):
        shutil.copy(f, folder / f.name)
    return folder


def text_folder(tmp_path: Path) -> Path:
    return shutil.copytree(TEXT_FIXTURES / "peps", tmp_path / "in")


CASES = {
    **{c: (image_folder, damage_image, []) for c in (
        "truncated png", "truncated jpeg", "zero bytes", "text named .png", "decompression bomb",
        "symlink loop", "unlabelled file")},
    **{c: (cloud_folder, damage_cloud, ["--points", "256"]) for c in (
        "corrupt las header", "truncated laz", "header claims points it lacks", "zero points")},
    **{c: (text_folder, damage_text, []) for c in ("not utf-8", "empty", "binary")},
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_in_one_line_or_is_skipped_and_listed(tmp_path, case):
    make, damage, options = CASES[case]
    src = make(tmp_path)
    bad = damage(src, case)
    bad = sorted(bad) if isinstance(bad, list) else [bad]
    out = tmp_path / "out.lmdb"
    result = runner.invoke(app, ["convert", str(src), str(out), "--workers", "1", *options])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    if case == "empty":  # an empty document is skipped by policy, never an error
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 2, result.output
        assert len(errors) == 1 and bad[0] in errors[0], result.output
        assert "Traceback" not in result.output
        assert not out.exists() and list(tmp_path.glob(".out.lmdb*")) == []
    result = runner.invoke(app, ["convert", str(src), str(out), "--workers", "1", "--overwrite",
                                 "--on-error", "skip", *options])
    assert result.exit_code == 0, result.output
    assert f"skipped {plural(len(bad), 'input')}:" in result.output
    skipped = packdata.open(out).manifest.skipped
    assert sorted(Path(s["path"]).name for s in skipped) == bad, skipped


def test_mixed_modes_and_unusual_names_convert(tmp_path):
    """Grey, palette and RGBA PNGs beside RGB ones, names with spaces and non-ASCII: all kept."""
    src = image_folder(tmp_path)
    labels = json.loads((src / "labels.json").read_text())
    names = sorted(p.name for p in src.glob("*.png"))
    for name, mode, new in zip(names, ("L", "P", "RGBA"), ("grey cat.png", "café ü.png",
                                                            "鳥 alpha.png")):
        with Image.open(src / name) as im:
            im.convert(mode).save(src / new)
        (src / name).unlink()
        labels["labels"][new] = labels["labels"].pop(name)
    (src / "labels.json").write_text(json.dumps(labels))
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["convert", str(src), str(out), "--workers", "1"])
    assert result.exit_code == 0, result.output
    ds = packdata.open(out)
    assert len(ds) == 30 and {"grey cat", "café ü", "鳥 alpha"} <= set(ds.keys)
    image, _ = ds[ds.keys.index("鳥 alpha")]
    assert tuple(image.shape) == (3, 32, 32)
