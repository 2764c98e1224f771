"""Pixels you can trust: what conversion changes in an image's values (16-bit values clipped,
alpha dropped, EXIF orientation not applied) is counted and said, one line per change naming the
files; --keep-16bit and --exif-orientation keep what the default drops; Pillow's own warnings
never reach the user unnamed; broken files are named for what they are. Every odd file is built
with Pillow from real CIFAR-10 pixels (packdata/demo_data)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from typer.testing import CliRunner

import packdata
from packdata.cli import app
from packdata.errors import InputWarning, OptionError
from packdata.sources.pixels import NOT_ORIENTED, alpha_dropped, clipped
from tests.conftest import SAMPLE

ROTATED = 6  # EXIF orientation: turn 90° clockwise to view


def cifar(i: int) -> np.ndarray:
    """The i-th real CIFAR image of the sample, H×W×3 uint8."""
    names = sorted(p for p in SAMPLE.glob("*.png"))
    with Image.open(names[i]) as im:
        return np.asarray(im.convert("RGB"))


def odd_images(folder: Path) -> dict[str, Path]:
    """One file of each kind a photo folder holds beside plain RGB, from CIFAR pixels."""
    folder.mkdir()
    made = {}

    def save(name: str, im: Image.Image, **kw) -> None:
        made[name] = folder / name
        im.save(made[name], **kw)

    save("plain.png", Image.fromarray(cifar(0)))
    save("grey16.png", Image.fromarray(cifar(1)[..., 0].astype(np.uint16) * 257))
    alpha = np.dstack([cifar(2), np.tile(np.arange(32, dtype=np.uint8) * 8, (32, 1))])
    save("rgba.png", Image.fromarray(alpha, "RGBA"))
    palette = Image.fromarray(cifar(3)).quantize(16)
    palette.info["transparency"] = 0
    save("palette.png", palette, transparency=0)
    save("cmyk.jpg", Image.fromarray(cifar(4)).convert("CMYK"), quality=95)
    exif = Image.Exif()
    exif[0x0112] = ROTATED
    save("turned.jpg", Image.fromarray(cifar(5)[:, :24]), exif=exif, quality=95)  # 24 wide
    return made


def convert(src: Path, dst: Path, **options) -> tuple[packdata.PackedDataset, list[str]]:
    """``src`` converted (one worker: warnings are raised here), and the warnings said."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        packdata.convert(packdata.open_source(src, **options), dst, workers=1)
    return packdata.open(dst), [str(w.message) for w in caught if w.category is not InputWarning
                                or "no labels found" not in str(w.message)]


def served(ds: packdata.PackedDataset, name: str) -> np.ndarray:
    """The record of input ``name`` as served, H×W×C."""
    return ds[ds.keys.index_of(Path(name).stem)].permute(1, 2, 0).numpy()


def pillow_rgb(path: Path, oriented: bool = False) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray((ImageOps.exif_transpose(im) if oriented else im).convert("RGB"))


@pytest.fixture(scope="module")
def odd(tmp_path_factory) -> dict[str, Path]:
    return odd_images(tmp_path_factory.mktemp("odd") / "src")


def test_the_default_is_pillows_rgb_and_each_change_is_one_warning_naming_its_files(tmp_path,
                                                                                     odd):
    ds, said = convert(odd["plain.png"].parent, tmp_path / "d.h5")
    for name, path in odd.items():  # torchvision's ImageFolder: convert("RGB"), as stored
        assert np.array_equal(served(ds, name), pillow_rgb(path)), name
    assert served(ds, "grey16.png").min() == 255  # clipped: the white square
    root = odd["plain.png"].parent
    assert sorted(said) == sorted([
        f"{root}: 1 input: {clipped('RGB')}: {odd['grey16.png']}",
        f"{root}: 2 inputs: {alpha_dropped('RGB')}: {odd['palette.png']}, {odd['rgba.png']}",
        f"{root}: 1 input: {NOT_ORIENTED}: {odd['turned.jpg']}",
    ])  # Pillow's own "Palette images with Transparency …" is not among them
    changed = ds.manifest.source["changed"]
    assert changed[alpha_dropped("RGB")] == {"count": 2, "first": [str(odd["palette.png"]),
                                                                   str(odd["rgba.png"])]}


def test_keep_16bit_stores_the_values_and_exif_orientation_turns_the_image(tmp_path, odd):
    ds, said = convert(odd["plain.png"].parent, tmp_path / "d.lmdb", keep_16bit=True,
                       exif_orientation=True)
    grey = served(ds, "grey16.png")
    assert grey.dtype == np.uint16 and grey.shape == (32, 32, 3)
    assert np.array_equal(grey[..., 1], cifar(1)[..., 0].astype(np.uint16) * 257)
    assert np.array_equal(served(ds, "plain.png"), cifar(0).astype(np.uint16) * 257)
    turned = served(ds, "turned.jpg")
    assert turned.shape == (24, 32, 3)  # viewed upright: 24 rows of 32
    assert np.array_equal(turned, pillow_rgb(odd["turned.jpg"], oriented=True).astype(
        np.uint16) * 257)
    assert not any("clipped" in s or "EXIF" in s for s in said)
    assert any("alpha" in s for s in said)
    grey_only, _ = convert(odd["plain.png"].parent, tmp_path / "l.h5", keep_16bit=True, mode="L")
    assert np.array_equal(served(grey_only, "grey16.png")[..., 0],
                          cifar(1)[..., 0].astype(np.uint16) * 257)


def test_orientation_decides_whether_sizes_differ(tmp_path):
    """Two 32×24 JPEGs, one turned by its EXIF tag: one size as stored, two as viewed."""
    src = tmp_path / "src"
    src.mkdir()
    exif = Image.Exif()
    exif[0x0112] = ROTATED
    Image.fromarray(cifar(6)[:, :24]).save(src / "a.jpg", quality=95)
    Image.fromarray(cifar(7)[:, :24]).save(src / "b.jpg", quality=95, exif=exif)
    stored, _ = convert(src, tmp_path / "s.h5")
    assert stored.manifest.fields["image"].shape == (3, 32, 24)
    viewed, _ = convert(src, tmp_path / "v.h5", exif_orientation=True)
    assert viewed.manifest.source["mixed_sizes"]
    assert served(viewed, "b.jpg").shape == (24, 32, 3)


def test_options_that_cannot_work_are_refused_in_one_line(tmp_path, odd):
    with pytest.raises(OptionError, match="--keep-16bit and --exif-orientation need --encoding "
                       "raw"):
        packdata.open_source(odd["plain.png"].parent, encoding="keep", exif_orientation=True)
    with pytest.raises(OptionError, match="--keep-16bit stores modes L or RGB, not --mode RGBA"):
        packdata.open_source(odd["plain.png"].parent, keep_16bit=True, mode="RGBA")


def test_broken_files_are_named_for_what_they_are_and_warnings_print_as_one_line(tmp_path, odd):
    src = tmp_path / "src"
    src.mkdir()
    for path in odd.values():
        (src / path.name).write_bytes(path.read_bytes())
    (src / "empty.png").write_bytes(b"")
    (src / "cut.png").write_bytes(odd["plain.png"].read_bytes()[:200])
    result = CliRunner().invoke(app, ["convert", str(src), str(tmp_path / "d.h5"),
                                      "--workers", "2", "--on-error", "skip"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"  {src / 'empty.png'}: empty file (0 bytes)" in lines
    assert any(line.startswith(f"  {src / 'cut.png'}: cannot decode image") for line in lines)
    warned = [line for line in lines if line.startswith("warning:")]
    assert len(warned) == 4  # no labels, 16-bit, alpha, EXIF: from the workers, gathered
    assert sum("alpha" in line and "palette.png, " in line for line in warned) == 1
    assert "UserWarning" not in result.output and "Palette images" not in result.output
    manifest = json.loads(json.dumps(packdata.open(tmp_path / "d.h5").manifest.source))
    assert manifest["changed"][clipped("RGB")]["count"] == 1
    assert torch.is_tensor(packdata.open(tmp_path / "d.h5")[0])
