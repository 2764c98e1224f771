"""Conversion: container choice, bad inputs, and outputs that never look valid when incomplete."""

from __future__ import annotations

import collections
import contextlib
import json
import multiprocessing
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import packdata
from packdata.errors import (
    ArgumentError,
    InputWarning,
    OutputExistsError,
    PackdataError,
    SampleError,
)
from packdata.sources.images import ImageSource
from tests.conftest import copy_sample, fifo_folder


def test_container_is_chosen_by_suffix_or_format(tmp_path, png_folder):
    source = packdata.open_source(png_folder)
    assert packdata.convert(source, tmp_path / "a.lmdb").manifest.container == "lmdb"
    assert packdata.convert(source, tmp_path / "a.hdf5").manifest.container == "hdf5"
    assert packdata.convert(source, tmp_path / "dir").manifest.container == "tar"
    assert packdata.convert(source, tmp_path / "x.db", container="lmdb").manifest.container == "lmdb"
    result = packdata.convert(source, tmp_path / "shards" / "cifar-%03d.tar",
                              container_options={"shard_size": "50"})
    assert result.path == tmp_path / "shards"
    assert sorted(p.name for p in result.path.glob("*.tar")) == [
        "cifar-000.tar", "cifar-001.tar", "cifar-002.tar"]
    with pytest.raises(PackdataError, match="cannot tell the container"):
        packdata.convert(source, tmp_path / "x.zip")


@pytest.fixture
def bad_folder(tmp_path, png_folder) -> Path:
    folder = copy_sample(tmp_path / "bad", count=20)
    names = sorted(p.name for p in folder.glob("*.png"))
    data = (folder / names[3]).read_bytes()
    (folder / names[3]).write_bytes(data[: len(data) // 2])  # truncated
    (folder / names[7]).write_bytes(b"not an image at all")  # corrupt
    return folder


def test_bad_image_fails_naming_the_file(tmp_path, bad_folder):
    bad = sorted(p.name for p in bad_folder.glob("*.png"))[3]
    with pytest.raises(SampleError, match=bad) as info:
        packdata.convert(_SmallBlocks(bad_folder), tmp_path / "out.lmdb", workers=2)
    assert "cannot decode image" in str(info.value)
    assert multiprocessing.active_children() == []  # the workers were stopped, not left running
    assert not (tmp_path / "out.lmdb").exists()
    assert list(tmp_path.glob(".out.lmdb*")) == []


@pytest.mark.parametrize("target", ["out.lmdb", "out.h5", "out-tar"])
def test_bad_images_skipped_and_recorded(tmp_path, bad_folder, target):
    result = packdata.convert(packdata.open_source(bad_folder), tmp_path / target,
                              on_error="skip", workers=2)
    names = sorted(p.name for p in bad_folder.glob("*.png"))
    assert [Path(s["path"]).name for s in result.skipped] == [names[3], names[7]]
    ds = packdata.open(result.path)
    assert len(ds) == 18 and ds.manifest.skipped == result.skipped
    assert names[3].removesuffix(".png") not in ds.keys
    again = packdata.convert(packdata.open_source(bad_folder), tmp_path / f"again-{target}",
                             on_error="skip", workers=1)
    assert again.skipped == result.skipped  # same output for the same input, reasons included


def test_what_the_listing_leaves_out_is_reported(tmp_path):
    """Files with other suffixes and labels naming no file: warned, with a count and the first
    names, and recorded in the manifest (the labels file itself is an input, not ignored)."""
    folder = copy_sample(tmp_path / "f", count=20)
    for i in range(7):
        (folder / f"notes{i}.txt").write_text("not an image")
    meta = json.loads((folder / "labels.json").read_text())
    meta["labels"]["gone_0001.png"] = 3
    (folder / "labels.json").write_text(json.dumps(meta))
    with pytest.warns(InputWarning) as warned:
        result = packdata.convert(packdata.open_source(folder), tmp_path / "o.h5", workers=1)
    messages = " | ".join(str(w.message) for w in warned)
    assert "ignored 7 files of another kind than image (suffix not .png" in messages
    assert "notes0.txt, notes1.txt, notes2.txt, notes3.txt, notes4.txt and 2 more" in messages
    assert "ignored 1 entry of" in messages and "gone_0001.png" in messages
    ignored = result.manifest.source["ignored"]
    assert [v["count"] for v in ignored.values()] == [7, 1]
    assert ignored[next(iter(ignored))]["first"][0] == "notes0.txt"
    assert result.manifest.count == 20


def test_missing_label_is_a_clear_error(tmp_path, png_folder):
    folder = copy_sample(tmp_path / "f", count=10)
    (folder / "stray.png").write_bytes(next(folder.glob("*.png")).read_bytes())
    with pytest.raises(SampleError, match="no label for 'stray.png'"):
        packdata.convert(packdata.open_source(folder), tmp_path / "o.h5")


def test_destination_exists(tmp_path, png_folder, packed):
    source = packdata.open_source(png_folder)
    existing = tmp_path / "mine.h5"
    existing.write_bytes(b"precious user data")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        packdata.convert(source, existing)
    with pytest.raises(OutputExistsError, match="not a packdata dataset"):
        packdata.convert(source, existing, overwrite=True)
    assert existing.read_bytes() == b"precious user data"
    out = packdata.convert(source, tmp_path / "d.lmdb").path
    again = packdata.convert(source, out, overwrite=True)
    assert len(packdata.open(again.path)) == 120


def test_overwrite_spares_look_alikes_and_refuses_links(tmp_path, png_folder, packed):
    import h5py

    source = packdata.open_source(png_folder)
    user = tmp_path / "user.h5"  # an HDF5 file of the user's that has a 'manifest' of its own
    with h5py.File(user, "w") as f:
        f["manifest"] = "my notes"
        f["precious"] = np.arange(3)
    user_dir = tmp_path / "user-dir"  # looks like tar output, is not
    user_dir.mkdir()
    (user_dir / "manifest.json").write_text('{"mine": true}')
    (user_dir / "index.npz").write_bytes(b"x")
    for existing in (user, user_dir):
        with pytest.raises(OutputExistsError, match="not a packdata dataset"):
            packdata.convert(source, existing, overwrite=True)
    with h5py.File(user) as f:
        assert sorted(f) == ["manifest", "precious"]
    assert (user_dir / "manifest.json").exists()
    link = tmp_path / "link.lmdb"
    link.symlink_to(packed["lmdb"], target_is_directory=True)
    with pytest.raises(PackdataError, match="symbolic link"):
        packdata.convert(source, link, overwrite=True)
    assert link.is_symlink() and len(packdata.open(packed["lmdb"])) == 120


def test_inputs_sharing_a_key_are_refused(tmp_path):
    folder = copy_sample(tmp_path / "dup", count=10)
    first = sorted(folder.glob("*.png"))[0]
    shutil.copy(first, first.with_suffix(".jpg"))
    with pytest.raises(PackdataError, match=f"would both be sample '{first.stem}'"):
        packdata.convert(packdata.open_source(folder, labels=folder / "labels.json"),
                         tmp_path / "o.h5")


@pytest.mark.parametrize("block", [2, 1 << 16])
def test_the_key_check_compares_keys_whose_hashes_meet(monkeypatch, block):
    """A weak hash (the key's length) makes every key meet others: distinct keys pass, and the
    first input repeating an earlier one's key is named with it, across blocks or within one."""
    from packdata.conversion import job
    from packdata.sources.base import Item

    monkeypatch.setattr(job, "key_hashes",
                        lambda keys: np.fromiter(map(len, keys), np.uint64, len(keys)))
    monkeypatch.setattr(job, "KEY_BLOCK", block)
    items = [Item(key=k, path=Path(f"{k}.png")) for k in ("aa", "bb", "cc", "d", "e")]
    job._check_unique_keys(items)
    items += [Item(key="e", path=Path("e.jpg")), Item(key="bb", path=Path("bb.jpg"))]
    with pytest.raises(PackdataError, match="^e.png and e.jpg would both be sample 'e'"):
        job._check_unique_keys(items)


@pytest.mark.parametrize("on_disk_block", [None, 1, 3])
def test_keys_that_collide_as_tar_members_are_refused(tmp_path, monkeypatch, on_disk_block):
    """Found by sorting the member names' hashes: in memory, or on disk in blocks (of 1: the
    pair always straddles two blocks)."""
    if on_disk_block:
        from packdata import spooling
        from packdata.containers.tar import writer

        monkeypatch.setattr(spooling, "SORT_IN_MEMORY", 2)
        monkeypatch.setattr(spooling, "SORT_BLOCK", on_disk_block)
        monkeypatch.setattr(writer, "SORT_BLOCK", on_disk_block)
    folder = copy_sample(tmp_path / "dots", count=10)
    names = sorted(folder.glob("*.png"))
    labels = json.loads((folder / "labels.json").read_text())
    for src, new in ((names[0], "a.b.png"), (names[1], "a_b.png")):
        src.rename(folder / new)
        labels["labels"][new] = labels["labels"].pop(src.name)
    (folder / "labels.json").write_text(json.dumps(labels))
    with pytest.raises(PackdataError, match="'a.b' and 'a_b' both make tar members"):
        packdata.convert(packdata.open_source(folder), tmp_path / "out-tar", container="tar")
    assert len(packdata.open(packdata.convert(packdata.open_source(folder),
                                              tmp_path / "o.h5").path)) == 10


def test_output_inside_source_is_refused(tmp_path):
    folder = copy_sample(tmp_path / "src", count=10)
    with pytest.raises(PackdataError, match="outside the source"):
        packdata.convert(packdata.open_source(folder), folder / "out.lmdb")


def test_different_sizes_convert_unscaled_or_resized(tmp_path, png_folder):
    from PIL import Image

    folder = copy_sample(tmp_path / "sizes", count=10)
    Image.new("RGB", (40, 30)).save(folder / "zz_big.png")
    labels = json.loads((folder / "labels.json").read_text())
    labels["labels"]["zz_big.png"] = 1
    (folder / "labels.json").write_text(json.dumps(labels))
    mixed = packdata.open(packdata.convert(packdata.open_source(folder), tmp_path / "o.h5").path)
    assert mixed[0][0].shape == (3, 32, 32) and mixed[10][0].shape == (3, 30, 40)
    ds = packdata.open(packdata.convert(packdata.open_source(folder, resize="16x8"),
                                        tmp_path / "r.h5").path)
    assert ds[0][0].shape == (3, 8, 16) and len(ds) == 11


def test_labels_files(tmp_path, png_folder):
    folder = copy_sample(tmp_path / "lab", count=10)
    table = json.loads((folder / "labels.json").read_text())["labels"]
    (folder / "labels.json").unlink()
    (tmp_path / "labels.pkl").write_bytes(pickle.dumps(table))
    with open(tmp_path / "labels.csv", "w") as f:
        f.write("file,label\n" + "".join(f"{k},{v}\n" for k, v in table.items()))
    for labels in ("labels.pkl", "labels.csv"):
        result = packdata.convert(packdata.open_source(folder, labels=tmp_path / labels),
                                  tmp_path / f"{labels}.h5")
        ds = packdata.open(result.path)
        assert [int(ds[i][1]) for i in range(len(ds))] == [table[k] for k in sorted(table)]
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps(["not", "a", "dict"]))
    with pytest.raises(PackdataError, match="dict of file name"):
        packdata.convert(packdata.open_source(folder, labels=tmp_path / "evil.pkl"),
                         tmp_path / "e.h5")


@pytest.mark.parametrize(("content", "message"), [
    (pickle.dumps(collections.OrderedDict(a=1)), "dict of file name"),
    (b"cnonexistent_mod\nX\n.", "cannot read labels .ModuleNotFoundError"),  # a missing class
    (pickle.dumps({"a.png": -1}), "must be ≥ 0; 'a.png' has -1"),
])
def test_bad_labels_pickles_are_clear_errors(tmp_path, content, message):
    from packdata.sources.labels import load_labels

    (tmp_path / "labels.pkl").write_bytes(content)
    with pytest.raises(PackdataError, match=message):
        load_labels(tmp_path / "labels.pkl")


def test_class_folders(tmp_path, png_folder):
    for i, p in enumerate(sorted(png_folder.glob("*.png"))[:30]):
        cls = p.name.split("_")[0]
        (tmp_path / "tree" / cls).mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / cls / f"{i:03d}.png").write_bytes(p.read_bytes())
    ds = packdata.open(packdata.convert(packdata.open_source(tmp_path / "tree"),
                                        tmp_path / "t.lmdb").path)
    assert ds.classes == sorted({p.name for p in (tmp_path / "tree").iterdir()})
    assert ds.keys[0].count("/") == 1
    assert int(ds[0][1]) == 0 and int(ds[len(ds) - 1][1]) == len(ds.classes) - 1


class _Interrupting(ImageSource):
    def load(self, item):
        if item.key.endswith("0007"):
            raise KeyboardInterrupt
        return super().load(item)


@pytest.mark.parametrize("target", ["i.lmdb", "i.h5", "i-tar"])
def test_interrupted_conversion_leaves_nothing(tmp_path, png_folder, target):
    with pytest.raises(KeyboardInterrupt):
        packdata.convert(_Interrupting(png_folder), tmp_path / target, workers=1)
    assert [p.name for p in tmp_path.iterdir()] == []


class _SmallBlocks(ImageSource):
    """Tasks of 4 images, so that a small folder keeps several worker tasks in flight."""

    def blocks(self, items):
        return [items[i : i + 4] for i in range(0, len(items), 4)]


class _Dying(_SmallBlocks):
    """A worker killed mid-conversion (as by the OOM killer or a crash in a decoder)."""

    def load(self, item):
        if item.key.endswith("0007"):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().load(item)


class _ShrinksLater(_SmallBlocks):
    """From the ninth image on, 16×16 pixels: a whole worker task of records alike, unlike the
    first's."""

    def load(self, item):
        record = super().load(item)
        if int(item.key.rsplit("_", 1)[1]) >= 8 and item.key.startswith("airplane"):
            record["image"] = np.ascontiguousarray(record["image"][:, :16, :16])
        return record


@pytest.mark.parametrize("workers", [1, 2])
def test_a_task_of_records_unlike_the_first_is_refused_naming_its_file(tmp_path, png_folder,
                                                                        workers):
    """A block handed over as one table is checked against the first record's fields like any
    record: the error names the block's first input, and skipping keeps the others."""
    with pytest.raises(SampleError, match=r"airplane_0008\.png.*expected shape \[3, 32, 32\], "
                                          r"got \[3, 16, 16\].*must match the first input"):
        packdata.convert(_ShrinksLater(png_folder), tmp_path / "o.lmdb", workers=workers)
    result = packdata.convert(_ShrinksLater(png_folder), tmp_path / "o.h5", workers=workers,
                              on_error="skip")
    assert [s["path"].rsplit("/", 1)[1] for s in result.skipped] == [
        f"airplane_{i:04d}.png" for i in range(8, 12)]
    ds = packdata.open(result.path)
    assert len(ds) == 116 and ds[0][0].shape == (3, 32, 32)
    kept = [p.stem for p in sorted(png_folder.glob("*.png")) if p.stem not in
            {f"airplane_{i:04d}" for i in range(8, 12)}]
    assert list(ds.manifest.keys) == kept and ds.manifest.keys.index_of(kept[100]) == 100
    assert packdata.verify(result.path).ok


def test_dead_worker_is_an_error_naming_its_files_not_a_hang(tmp_path, png_folder):
    def hung(*_):
        raise TimeoutError("the conversion hung after its worker died")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    try:
        with pytest.raises(PackdataError, match="worker stopped unexpectedly .* from .*airplane_000[04]"):
            packdata.convert(_Dying(png_folder), tmp_path / "d.h5", workers=2)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert list(tmp_path.iterdir()) == []


class _UnpicklableFailure(_SmallBlocks):
    """A source whose error cannot travel back from a worker (it holds a lambda)."""

    def load_block(self, items):
        exc = PackdataError("the tokeniser does not fit")
        exc.hook = lambda: None
        raise exc


def test_what_leaves_a_worker_always_pickles(tmp_path, png_folder):
    with pytest.raises(PackdataError, match="airplane_0000.png: PackdataError: the tokeniser"):
        packdata.convert(_UnpicklableFailure(png_folder), tmp_path / "u.h5", workers=2)
    assert list(tmp_path.iterdir()) == []


def test_worker_errors_pickle_where_exceptions_pickle_their_chain(tmp_path, png_folder):
    """Importing dask.distributed installs tblib's pickling for every exception class, which
    pickles an exception's chain too: what leaves a worker must still pickle then (it broke the
    pool with a chained, unpicklable error). Run apart, so the rest of the suite keeps stock
    pickling."""
    pytest.importorskip("tblib")
    script = (
        "import sys, tblib.pickling_support\n"
        "import packdata\n"
        "from packdata.errors import PackdataError\n"
        "from tests.test_convert import _UnpicklableFailure\n"
        "tblib.pickling_support.install()  # after: it registers the classes that exist\n"
        "try:\n"
        "    packdata.convert(_UnpicklableFailure(sys.argv[1]), sys.argv[2], workers=2)\n"
        "except PackdataError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(png_folder), str(tmp_path / "u.h5")],
                          capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parents[1])
    assert "airplane_0000.png: PackdataError: the tokeniser does not fit" in done.stdout, \
        done.stdout + done.stderr


@pytest.mark.timeout(120)
def test_killed_conversion_leaves_nothing_that_opens(tmp_path, png_folder):
    """SIGTERM mid-conversion: the process cleans up; nothing at DST opens as a dataset. The
    last input is a named pipe, so the conversion cannot finish before the signal: no race."""
    folder = fifo_folder(tmp_path / "in", png_folder, count=300)  # two tasks: the pipe's waits
    out = tmp_path / "out"
    out.mkdir()
    log = open(tmp_path / "stderr.txt", "w+")  # noqa: SIM115 - a pipe nobody reads could fill up
    proc = subprocess.Popen(
        [sys.executable, "-m", "packdata", "convert", str(folder), str(out / "k.lmdb"),
         "--workers", "2"], stderr=log, cwd=Path(__file__).parents[1],
    )
    while not any(out.iterdir()):  # the partial output exists: converting
        assert proc.poll() is None, "the conversion ended on its own"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    while proc.poll() is None:  # a worker may be reading the pipe: give it an end
        with contextlib.suppress(OSError):  # no reader (yet, or any more)
            os.close(os.open(folder / "zz_blocks.png", os.O_WRONLY | os.O_NONBLOCK))
        time.sleep(0.01)
    assert proc.returncode == 130
    log.seek(0)
    assert "interrupted" in log.read()
    leftovers = list(out.iterdir())
    assert leftovers == [], leftovers
    with pytest.raises(PackdataError):
        packdata.open(out / "k.lmdb")


def test_partials_of_killed_conversions_are_cleaned_up(tmp_path, png_folder):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f".out.h5.partial-{dead}-abcdef12"
    stale.write_bytes(b"half a file")
    (tmp_path / f"{stale.name}.image.spool").write_bytes(b"spooled")
    alive = tmp_path / f".out.h5.partial-{os.getpid()}-abcdef12"  # a conversion still running
    alive.write_bytes(b"in progress")
    packdata.convert(packdata.open_source(png_folder), tmp_path / "out.h5")
    assert sorted(p.name for p in tmp_path.iterdir()) == [alive.name, "out.h5"]


@pytest.mark.parametrize("workers", [-2, 1.5, "2"])
def test_a_worker_count_that_is_not_a_count_is_refused_before_anything_is_written(
        tmp_path, png_folder, workers):
    # a negative count ran one worker without a word, a float failed deep in the pool
    with pytest.raises(ArgumentError, match=f"workers must be an integer ≥ 0, got {workers!r}"):
        packdata.convert(packdata.open_source(png_folder), tmp_path / "out.h5", workers=workers)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("shard_size", ["-5", "0", "0MB", "-1GB", "lots"])
def test_a_shard_size_of_nothing_is_refused_by_name_and_leaves_no_output(tmp_path, png_folder,
                                                                         shard_size):
    # "-5" had written one shard per sample (20,003 files for 10,000 images)
    with pytest.raises(ArgumentError, match=f"shard_size '{shard_size}': expected a count or a size"):
        packdata.convert(packdata.open_source(png_folder), tmp_path / "out.tar",
                         container_options={"shard_size": shard_size})
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ArgumentError, match="size '-1MB': expected a byte count"):
        packdata.open(tmp_path / "any", cache_limit="-1MB")
