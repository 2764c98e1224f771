"""run_bench end to end: --compare on an image folder, and inputs that are not datasets."""

from __future__ import annotations

import pytest

from packdata.bench.runner import BenchSettings
from packdata.bench.suite import run_bench
from packdata.errors import BenchError, DatasetError

TINY = BenchSettings(batch_size=20, steps=2, warmup=1, max_seconds=30)


def test_compare_measures_the_folder_and_every_container(png_folder):
    log: list[str] = []
    result = run_bench(png_folder, TINY, compare=True, log=log.append)
    names = [run["input"]["name"] for run in result["runs"]]
    assert names == ["folder", "lmdb", "hdf5", "tar"]
    assert all(run["input"]["count"] == 120 for run in result["runs"])
    assert any("converted" in line for line in log)
    # training alone never touches storage: measured once, shared by every input
    assert len({id(run["train"]) for run in result["runs"]}) == 1
    for run in result["runs"]:
        assert run["io"]["samples_per_s"] > 0 and run["loop"]["steps"] == 2
        assert run["io_over_train"] == pytest.approx(
            run["io"]["samples_per_s"] / run["train"]["samples_per_s"])
        assert run["verdict"]
    assert result["settings"]["model"] == "small-cnn" and result["settings"]["device"] == "cpu"


def test_compare_needs_an_image_folder(packed):
    with pytest.raises(BenchError, match="already a lmdb dataset"):
        run_bench(packed["lmdb"], TINY, compare=True)


def test_not_a_dataset_says_what_was_found(tmp_path):
    (tmp_path / "notes.md").write_text("hello")
    with pytest.raises(DatasetError, match=r"not a packdata dataset \(found a directory "
                       r"holding notes.md\)"):
        run_bench(tmp_path, TINY)
    with pytest.raises(DatasetError, match="not a packdata dataset .found a file of 5 bytes"):
        run_bench(tmp_path / "notes.md", TINY)
    (tmp_path / "doc.txt").write_text("a text document")
    with pytest.raises(DatasetError, match="a folder of text files; convert it first"):
        run_bench(tmp_path, TINY)
    with pytest.raises(DatasetError, match="no such file"):
        run_bench(tmp_path / "missing", TINY)
