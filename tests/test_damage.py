"""Damaged and hand-edited datasets: a named packdata error, never a signal, a raw library
exception or silently different data."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import packdata
from tests.test_verify import edit_manifest, without_header_hash

ROOT = Path(__file__).resolve().parents[1]
LIDAR = ROOT / "tests" / "fixtures" / "lidar"
PAGE = 4096


def huge_value_size(path: Path, key: bytes) -> None:
    """Set the value size in ``key``'s LMDB leaf node to ~4 GB, as a few flipped bits in
    data.mdb can: LMDB trusts it, so copying the value reads past the end of the file."""
    data = bytearray((path / "data.mdb").read_bytes())
    found = 0
    for start in range(2 * PAGE, len(data), PAGE):  # every copy: older ones lie in free pages
        page = data[start : start + PAGE]
        if page[10] & 0x3F != 0x02:  # leaf pages only
            continue
        lower = int.from_bytes(page[12:14], "little")
        for at in range(16, lower, 2):
            node = int.from_bytes(page[at : at + 2], "little")
            ksize = int.from_bytes(page[node + 6 : node + 8], "little")
            if bytes(page[node + 8 : node + 8 + ksize]) == key:
                data[start + node : start + node + 4] = (0xFFFFFF00).to_bytes(4, "little")
                found += 1
    assert found, f"no leaf node for {key!r}"
    (path / "data.mdb").write_bytes(bytes(data))


def run_python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_a_damaged_lmdb_value_size_is_a_named_error_not_sigbus(tmp_path, packed):
    """The SIGBUS case: reading the record (and `packdata verify`) died by signal 7."""
    copy = shutil.copytree(packed["lmdb"], tmp_path / "d.lmdb")
    huge_value_size(copy, b"0000000000")
    plain = run_python("-c", "import lmdb, sys; env = lmdb.open(sys.argv[1], readonly=True, "
                       "lock=False); env.begin().get(b'0000000000')", str(copy))
    assert plain.returncode < 0  # LMDB alone: killed by a signal (SIGBUS or SIGSEGV)
    read = run_python("-c", "import sys, packdata; packdata.open(sys.argv[1])[0]", str(copy))
    assert read.returncode == 1, read  # an exception, not a signal (-7)
    assert "DatasetError" in read.stderr and f"{copy}/data.mdb" in read.stderr
    assert "damaged" in read.stderr
    verify = run_python("-m", "packdata", "verify", str(copy))
    assert verify.returncode == 1, verify  # not 135 (killed by SIGBUS)
    assert f"{copy}/data.mdb" in verify.stdout and "damaged" in verify.stdout


@pytest.mark.parametrize("key", [b"__offsets__", b"__lengths__/tokens", b"0000000000"])
def test_a_damaged_value_size_in_a_text_lmdb_is_a_named_error_not_sigbus(tmp_path, packed_text,
                                                                           key):
    """Variable-size records, read at their stored offsets: a ~4 GB value size in the node of
    the offsets, a length table or the first record (the keys still looked up) is found on the
    key's path by packdata's own lookup, in a child that must not die by a signal."""
    copy = shutil.copytree(packed_text["lmdb"], tmp_path / "d.lmdb")
    huge_value_size(copy, key)
    read = run_python("-c", "import sys, packdata; ds = packdata.open(sys.argv[1]); "
                      "[ds[i] for i in range(len(ds))]", str(copy))
    assert read.returncode == 1, read  # an exception, not a signal
    assert "DatasetError" in read.stderr and str(copy) in read.stderr, read.stderr
    verify = run_python("-m", "packdata", "verify", str(copy))
    assert verify.returncode == 1 and str(copy) in verify.stdout, verify


def swap_fields(m: dict) -> None:
    m["fields"] = dict(reversed(list(m["fields"].items())))


def reverse_image_shape(m: dict) -> None:
    m["fields"]["image"]["shape"] = m["fields"]["image"]["shape"][::-1]


EDITS = {  # the edits that once read silently different data
    "lmdb dtype uint8 to int8": ("lmdb", lambda m: m["fields"]["image"].update(dtype="|i1")),
    "lmdb shape reversed": ("lmdb", reverse_image_shape),
    "tar shape reversed": ("tar", reverse_image_shape),
    "hdf5 label dtype": ("hdf5", lambda m: m["fields"]["label"].update(dtype="<u8")),
    "lmdb field order swapped": ("lmdb", swap_fields),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_hand_edited_manifest_is_refused(tmp_path, packed, edit):
    container, change = EDITS[edit]
    src = packed[container]
    copy = tmp_path / src.name
    (shutil.copytree if src.is_dir() else shutil.copy)(src, copy)
    edit_manifest(container, copy, change)
    with pytest.raises(packdata.DatasetError, match=r"manifest does not match its checksum"
                       ) as err:
        packdata.open(copy, verify="off")
    assert copy.name in str(err.value) and "convert the dataset again" in str(err.value)


@pytest.fixture(scope="module")
def lidar(tmp_path_factory) -> Path:
    pytest.importorskip("laspy")
    src = tmp_path_factory.mktemp("clouds")
    for f in LIDAR.glob("ahn_*.las"):
        shutil.copy(f, src / f.name)
    out = tmp_path_factory.mktemp("lidar") / "d.lmdb"
    return packdata.convert(packdata.open_source(src, points=256), out, workers=1).path


@pytest.mark.parametrize("edit", ["variants 1 to 6", "kind to text"])
def test_a_lidar_manifest_edited_without_its_checksum_is_a_named_error(tmp_path, lidar, edit):
    """An edited manifest whose checksum was deleted too is refused at open (a dataset of format
    2 or later always has one), before any of its facts is believed (with the checksum
    deleted, these edits once read as a raw IndexError and KeyError: 'tokens')."""
    copy = shutil.copytree(lidar, tmp_path / "d.lmdb")
    assert packdata.open(lidar).manifest.options["variants"] == 1
    if edit == "kind to text":
        edit_manifest("lmdb", copy, lambda m: m.update(kind="text"))
    else:
        edit_manifest("lmdb", copy, lambda m: m["options"].update(variants=6))
    without_header_hash("lmdb", copy)
    with pytest.raises(packdata.DatasetError, match=f"{copy}.*checksum is missing"):
        packdata.open(copy)


def damage_manifest(container: str, path: Path) -> None:
    """Overwrite the first bytes of the manifest's JSON as stored (a flipped page, a bad
    copy), through no library: it is no JSON any more."""
    if container == "tar":
        data = bytearray((path / "manifest.json").read_bytes())
        data[:4] = b"\0\0\0\0"
        (path / "manifest.json").write_bytes(bytes(data))
        return
    if container == "hdf5":
        from packdata.containers.hdf5layout import layout_of

        file, at = path, layout_of(path).datasets["manifest"].offset
    else:
        from packdata.containers.lmdb import shared_tree

        file, at = path / "data.mdb", shared_tree(path).locate(b"__manifest__")[0]
    with open(file, "r+b") as f:
        f.seek(at)
        f.write(b"\0\0\0\0")


@pytest.mark.parametrize("container", ["lmdb", "hdf5", "tar"])
def test_a_damaged_manifest_is_named_and_overwrite_replaces_the_dataset(tmp_path, packed,
                                                                         png_folder, container):
    """A manifest that is no JSON any more, in files that are packdata's (the record arrays
    are there): named as a damaged packdata dataset, with what failed (once "not a packdata
    dataset", which made `convert --overwrite` refuse to replace the dataset it wrote); verify
    says the same; `convert --overwrite` replaces it, and only with --overwrite."""
    from typer.testing import CliRunner

    from packdata.cli import app
    from packdata.errors import OutputExistsError, UnreadableDataset
    from packdata.verification import verify

    src = packed[container]
    copy = tmp_path / src.name
    (shutil.copytree if src.is_dir() else shutil.copy)(src, copy)
    damage_manifest(container, copy)
    said = f"{copy}: the manifest is not packdata JSON .*its manifest is damaged"
    with pytest.raises(UnreadableDataset, match=said):
        packdata.open(copy)
    report = verify(copy)
    assert not report.ok and "its manifest is damaged" in report.problems[0]
    with pytest.raises(OutputExistsError, match="--overwrite"):
        packdata.convert(packdata.open_source(png_folder), copy)
    result = CliRunner().invoke(app, ["convert", str(png_folder), str(copy), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert len(packdata.open(copy)) == len(packdata.open(src))
