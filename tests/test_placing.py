"""Workers that write their records straight into the output (packdata.conversion.placing, the
HDF5 writer's layout, packdata.containers.placement): the same file as the converting process
writes, only checksums handed over; a block that does not fit its place (a skipped input, a
record larger than its header said) gives the layout up, and what workers wrote after that is
read back, so the output is still exactly the records in order."""

from __future__ import annotations

import shutil
import time

import h5py
import numpy as np
import pytest

import packdata
from packdata.containers import hdf5
from packdata.containers.placement import FilePlacement
from packdata.errors import InputWarning
from packdata.sources.base import Survey
from packdata.sources.images import ImageSource


def stored(path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {name: f[name][()] for name in f if name not in ("manifest", "__records__")}


def same_file_contents(a, b) -> bool:
    x, y = stored(a), stored(b)
    return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


@pytest.fixture
def spied(monkeypatch) -> dict[str, int]:
    """How often the layout was given up, and blocks were read back from it."""
    calls = {"given_up": 0, "read_back": 0}
    give_up, read = hdf5.HDF5Writer.give_up_placement, FilePlacement.read

    def counted_give_up(self):
        calls["given_up"] += self.placement is not None
        give_up(self)

    def counted_read(self, fd, slot):
        calls["read_back"] += 1
        return read(self, fd, slot)

    monkeypatch.setattr(hdf5.HDF5Writer, "give_up_placement", counted_give_up)
    monkeypatch.setattr(FilePlacement, "read", counted_read)
    return calls


@pytest.mark.parametrize("options", [{}, {"max_size": 20}], ids=["fixed", "rows"])
def test_workers_write_the_records_the_converting_process_would(tmp_path, png_folder, spied,
                                                                 options):
    here = packdata.convert(packdata.open_source(png_folder, **options), tmp_path / "1.h5",
                            workers=1)
    placed = packdata.convert(packdata.open_source(png_folder, **options), tmp_path / "2.h5",
                              workers=2)
    assert placed.costs.workers["place"] > 0 and spied == {"given_up": 0, "read_back": 0}
    # only checksums and keys (24 bytes and the key's a record) crossed, not a record
    assert placed.costs.bytes["handed_over"] < 64 * placed.manifest.count  # checksums, keys
    assert np.array_equal(placed.manifest.checksums, here.manifest.checksums)
    assert same_file_contents(placed.path, here.path)
    assert packdata.verify(placed.path).ok


@pytest.fixture
def slow_second_block(monkeypatch) -> None:
    """Input 20 (``bird_0000``, in the second block of 16) loads a second late: the other worker
    places the blocks after it meanwhile, which are then read back."""
    load = ImageSource.load

    def slow(self, item):
        if item.key == "bird_0000":
            time.sleep(1.0)
        return load(self, item)

    monkeypatch.setattr(ImageSource, "load", slow)


@pytest.mark.parametrize("options", [{}, {"max_size": 20}], ids=["fixed", "rows"])
def test_a_skipped_input_gives_the_layout_up_and_later_blocks_are_read_back(
        tmp_path, png_folder, spied, slow_second_block, options):
    """120 inputs in blocks of 16; the bad one is in the second block, which comes back after
    the blocks behind it were written in their places."""
    folder = shutil.copytree(png_folder, tmp_path / "in")
    bad = folder / "bird_0000.png"
    bad.write_bytes(bad.read_bytes()[:100])  # its header still reads: its rows were counted
    out = packdata.convert(packdata.open_source(folder, **options), tmp_path / "v.h5",
                           workers=2, on_error="skip")
    assert [s["path"] for s in out.manifest.skipped] == [str(bad)]
    assert spied["given_up"] == 1 and spied["read_back"] >= 1
    assert out.manifest.count == 119 and packdata.verify(out.path).ok
    bad.unlink()  # the same folder without it: the same records
    alone = packdata.convert(packdata.open_source(folder, **options), tmp_path / "w.h5",
                             workers=1)
    assert np.array_equal(out.manifest.checksums, alone.manifest.checksums)
    assert same_file_contents(out.path, alone.path)


def test_a_record_larger_than_its_header_said_is_stored_all_the_same(
        tmp_path, png_folder, monkeypatch, spied, slow_second_block):
    survey = ImageSource.survey

    def short(self, items):  # one row too few for input 20, in the second block of 16
        found = survey(self, items)
        names = items.keys()
        if "bird_0000" in names:
            found.rows["image"][names.index("bird_0000")] -= 1
        return found

    monkeypatch.setattr(ImageSource, "survey", short)
    out = packdata.convert(packdata.open_source(png_folder, max_size=20), tmp_path / "v.h5",
                           workers=2)
    monkeypatch.setattr(ImageSource, "survey", lambda self, items: Survey(None, []))
    spooled = packdata.convert(packdata.open_source(png_folder, max_size=20),
                               tmp_path / "s.h5", workers=2)
    assert spied["given_up"] == 1 and spied["read_back"] >= 1
    assert np.array_equal(out.manifest.checksums, spooled.manifest.checksums)
    assert same_file_contents(out.path, spooled.path) and packdata.verify(out.path).ok


def test_a_bad_input_stops_a_placed_conversion_leaving_nothing(tmp_path, png_folder):
    folder = shutil.copytree(png_folder, tmp_path / "in")
    bad = sorted(folder.glob("*.png"))[40]
    bad.write_bytes(bad.read_bytes()[:100])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(packdata.PackdataError, match=bad.name):
        packdata.convert(packdata.open_source(folder), out / "d.h5", workers=2)
    assert list(out.iterdir()) == []


def test_what_the_probe_notes_is_counted_once(tmp_path, png_folder):
    """The probe loads the first input here, and its worker loads it again: an alpha channel
    dropped from that input is one input in the manifest, as with one worker (once 4: the
    probe's note, inherited by each forked worker, and the worker's own)."""
    from PIL import Image

    src = tmp_path / "src"
    src.mkdir()
    pngs = sorted(png_folder.glob("*.png"))[:40]
    with Image.open(pngs[0]) as im:
        rgba = im.convert("RGBA")
    rgba.putalpha(128)
    rgba.save(src / "a_first.png")  # the probe's input
    for path in pngs:
        shutil.copy(path, src / path.name)
    with pytest.warns(InputWarning):  # no labels; an alpha channel dropped
        one = packdata.convert(packdata.open_source(src), tmp_path / "1.h5", workers=1)
        two = packdata.convert(packdata.open_source(src), tmp_path / "2.h5", workers=2)
    assert two.costs.workers["place"] > 0  # placed: the probe ran
    changed = two.manifest.source["changed"]
    assert changed == one.manifest.source["changed"]
    assert [entry["count"] for entry in changed.values()] == [1]


def test_the_block_checksums_cover_what_the_workers_wrote(tmp_path, png_folder):
    """Format 3 over a placed file: the records and the variable field's offsets, both written
    by the workers with pwrite, verify; a byte changed in either is caught, named."""
    out = packdata.convert(packdata.open_source(png_folder, max_size=20), tmp_path / "p.h5",
                           workers=2)
    assert out.costs.workers["place"] > 0 and packdata.verify(out.path).ok
    with h5py.File(out.path, "r") as f:
        where = {name: (f[name].id.get_offset(), f[name].id.get_storage_size())
                 for name in ("image", "image_offsets", "label")}
    for name, (start, size) in where.items():
        bad = tmp_path / f"bad-{name}.h5"
        shutil.copy(out.path, bad)
        with open(bad, "r+b") as f:  # a byte in the middle of the dataset
            f.seek(start + size // 2)
            byte = f.read(1)[0]
            f.seek(start + size // 2)
            f.write(bytes([byte ^ 0x10]))
        report = packdata.verify(bad)
        assert not report.ok, name
        if name == "image_offsets":
            assert any("'image_offsets' does not match its checksum" in p
                       for p in report.problems), report
        else:
            assert len(report.bad) == 1, report  # the one record whose bytes changed
