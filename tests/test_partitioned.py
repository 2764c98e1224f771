"""Conversion into parts: local processes, byte-identical records, resume after a kill."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import packdata
from packdata.conversion.parts import RECIPE, work_dir
from packdata.errors import PackdataError


def _records(path: Path) -> tuple[list, list]:
    m = packdata.open(path).manifest
    return list(m.keys), m.checksums.tolist()


def test_parts_in_two_processes_match_one_process(tmp_path, png_folder, packed):
    source = packdata.open_source(png_folder)
    one = packdata.convert(source, tmp_path / "one", container="hdf5", part_size=25, workers=1)
    two = packdata.convert(source, tmp_path / "two", container="hdf5", part_size=25, workers=2)
    assert _records(one.path) == _records(two.path) == _records(packed["hdf5"])
    assert not work_dir(one.path).exists()


KILL = """
import os, sys, packdata
source = packdata.open_source(sys.argv[1])
class Dying(type(source)):
    def load(self, item):  # dies like `kill -9` while converting the fourth part
        if item.key == self.items()[70].key:
            os._exit(9)
        return super().load(item)
source.__class__ = Dying
packdata.convert(source, sys.argv[2], container="lmdb", part_size=20, workers=1)
"""


def test_resume_after_kill_keeps_finished_parts(tmp_path, png_folder, packed):
    dst = tmp_path / "out"
    run = subprocess.run([sys.executable, "-c", KILL, str(png_folder), str(dst)], timeout=120)
    assert run.returncode == 9
    work = work_dir(dst)
    assert not dst.exists() and (work / RECIPE).is_file()  # nothing that looks like a dataset
    finished = sorted(p.name for p in work.glob("part-*.lmdb"))
    assert finished == [f"part-{n:06d}.lmdb" for n in range(3)]
    stamps = {p: (work / p / "data.mdb").stat().st_mtime_ns for p in finished}

    with pytest.raises(PackdataError, match="part_size=20, this run asks part_size=30"):
        packdata.convert(packdata.open_source(png_folder), dst, container="lmdb", part_size=30,
                         resume=True)
    with pytest.raises(PackdataError, match="options.encoding='raw', this run asks "
                                            "options.encoding='keep'"):
        packdata.convert(packdata.open_source(png_folder, encoding="keep"), dst,
                         container="lmdb", resume=True)

    done = packdata.convert(packdata.open_source(png_folder), dst, container="lmdb",
                            resume=True, workers=1)
    assert _records(done.path) == _records(packed["lmdb"])
    assert {p: (dst / p / "data.mdb").stat().st_mtime_ns for p in finished} == stamps  # kept
    assert not work.exists() and not (dst / RECIPE).exists()
    assert json.loads((dst / "manifest.json").read_text())["packdata"]["options"]["part_size"] == 20


def test_cli_resume_option(tmp_path, png_folder):
    from typer.testing import CliRunner

    from packdata.cli import app

    result = CliRunner().invoke(app, ["convert", str(png_folder), str(tmp_path / "ds"),
                                      "--engine", "local", "--part-size", "50", "--workers", "1"])
    assert result.exit_code == 0, result.output
    ds = packdata.open(tmp_path / "ds")
    assert ds.manifest.container == "tar" and len(ds) == 120
    assert [s["name"] for s in ds.manifest.extra["shards"]] == [
        "shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == [
        "index.npz", "manifest.json", "shard-000000.idx", "shard-000000.tar", "shard-000001.idx",
        "shard-000001.tar", "shard-000002.idx", "shard-000002.tar", "wids-index.json"]


def test_killed_while_joining_tar_parts_resumes(tmp_path, png_folder, packed, monkeypatch):
    import packdata.conversion.parts as partitioned

    source = packdata.open_source(png_folder)

    def dies(path):  # after the shards are linked and the index written, like a kill -9 there
        raise KeyboardInterrupt

    monkeypatch.setattr(partitioned.shutil, "rmtree", dies)
    with pytest.raises(KeyboardInterrupt):
        packdata.convert(source, tmp_path / "ds", part_size=50, workers=1)
    monkeypatch.undo()
    assert not (tmp_path / "ds").exists()
    done = packdata.convert(source, tmp_path / "ds", part_size=50, workers=1, resume=True)
    assert _records(done.path) == _records(packed["tar"])
    ds = packdata.open(done.path)
    assert (ds[list(range(120))][0] == packdata.open(packed["tar"])[list(range(120))][0]).all()


def test_parts_written_where_this_machine_cannot_see_them_are_an_error(tmp_path, png_folder,
                                                                       monkeypatch):
    import packdata.conversion.parts as partitioned

    real = partitioned.convert_part

    def elsewhere(part):  # a worker on another machine writing to its own disk
        part.dst = tmp_path / "worker-disk" / part.dst.name
        part.dst.parent.mkdir(exist_ok=True)
        return real(part)

    monkeypatch.setattr(partitioned, "convert_part", elsewhere)
    with pytest.raises(PackdataError, match="part-000000.h5: a task reported this part written, "
                                            "but it is not here; on a cluster the destination"):
        packdata.convert(packdata.open_source(png_folder), tmp_path / "ds", container="hdf5",
                         part_size=60, workers=1)
    assert not (tmp_path / "ds").exists()


def test_joined_tar_parts_carry_the_reader_indexes_of_one_process(tmp_path, png_folder):
    from packdata.containers.tar.indexes import WIDS_INDEX

    source = packdata.open_source(png_folder)
    one = packdata.convert(source, tmp_path / "one", container_options={"shard_size": "40"}).path
    parts = packdata.convert(source, tmp_path / "parts", part_size=40, workers=1,
                             container_options={"shard_size": "40"}).path
    idx = {p.name: p.read_text() for p in one.glob("*.idx")}
    assert len(idx) > 1 and {p.name: p.read_text() for p in parts.glob("*.idx")} == idx
    spec = json.loads((parts / WIDS_INDEX).read_text())
    assert spec == json.loads((one / WIDS_INDEX).read_text())
    assert "name" not in spec  # not the hidden folder it was built in


@pytest.mark.parametrize("flags", [["--resume"], ["--part-size", "50"], ["--engine", "local"],
                                   ["--scheduler", "tcp://127.0.0.1:9"]])
@pytest.mark.parametrize("name", ["plain.h5", "plain.hdf5", "plain.lmdb"])
def test_a_file_named_destination_is_refused_parts_up_front(tmp_path, png_folder, flags, name,
                                                           monkeypatch):
    """out.h5 is one HDF5 file: parts (a folder) into it are refused before any input is read,
    with one line saying what to ask for instead."""
    from typer.testing import CliRunner

    from packdata.cli import app
    from packdata.sources import images

    def never(*args):
        raise AssertionError("an input was loaded")

    monkeypatch.setattr(images.ImageSource, "load", never)
    container = "lmdb" if name.endswith(".lmdb") else "hdf5"
    result = CliRunner().invoke(app, ["convert", str(png_folder), str(tmp_path / name), *flags,
                                      "--workers", "1"])
    assert result.exit_code == 2, result.output
    assert f"{name}: {flags[0]} converts in parts, which writes a folder of {container} parts " \
           "(a sharded dataset)" in result.output
    assert f"(plain/ --format {container}), or leave out {flags[0]} to write {name}" \
        in result.output.replace(str(tmp_path) + "/", "")
    assert len(result.output.strip().splitlines()) == 1
    assert sorted(tmp_path.iterdir()) == []  # no parts folder, no dataset
    with pytest.raises(PackdataError, match="converts in parts"):  # the library the same
        packdata.convert(packdata.open_source(png_folder), tmp_path / name, part_size=50)
    monkeypatch.undo()  # named as a folder with --format, the same parts are a sharded dataset
    done = packdata.convert(packdata.open_source(png_folder), tmp_path / "plain",
                            container=container, part_size=60, workers=1)
    assert done.manifest.container == "sharded" and done.manifest.count == 120
