"""Labels: a conversion that finds none says so (naming a labels file beside SRC), an unlabelled
dataset serves one sample shape on every path, and labels files in the forms users have (numpy
integers in a pickle, class names in JSON). Real CIFAR PNGs and LiDAR trees."""

from __future__ import annotations

import json
import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from typer.testing import CliRunner

import packdata
from packdata.cli import app
from packdata.errors import InputWarning, PackdataError
from tests.conftest import copy_sample

LIDAR = Path(__file__).parent / "fixtures" / "lidar"


@pytest.fixture
def beside(tmp_path) -> Path:
    """CIFAR PNGs in ``png/`` with their labels.json beside the folder, not in it."""
    src = copy_sample(tmp_path / "png", count=20)
    (src / "labels.json").rename(tmp_path / "labels.json")
    return src


def test_no_labels_found_is_an_input_warning_naming_the_file_beside(tmp_path, beside):
    with pytest.warns(InputWarning, match=r"png: no labels found \(no labels.json, labels.csv, "
                      r"labels.pkl in it, no class sub-folders\): each sample is an image alone, "
                      r"without a label; .*labels.json lies beside it: pass --labels"):
        result = packdata.convert(packdata.open_source(beside), tmp_path / "u.h5", workers=1)
    assert "label" not in result.manifest.fields


def test_the_cli_shows_it_as_one_line_and_the_suggested_command_labels_the_samples(tmp_path,
                                                                                   beside):
    result = CliRunner().invoke(app, ["convert", str(beside), str(tmp_path / "u.h5"),
                                      "--workers", "1"])
    assert result.exit_code == 0, result.output
    warned = [line for line in result.output.splitlines() if "no labels found" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: ")
    suggested = warned[0].split("pass ", 1)[1].split()  # --labels FILE
    result = CliRunner().invoke(app, ["convert", str(beside), str(tmp_path / "l.h5"),
                                      "--workers", "1", *suggested])
    assert result.exit_code == 0 and "no labels found" not in result.output, result.output
    image, label = packdata.open(tmp_path / "l.h5")[0]
    assert label == json.loads((tmp_path / "labels.json").read_text())["labels"][
        "airplane_0000.png"]


def test_labelled_sources_do_not_warn(tmp_path, beside):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*no labels found", InputWarning)
        packdata.open_source(beside, labels=tmp_path / "labels.json").items()
        packdata.open_source(LIDAR.parent / "lidar-pieces").items()  # class sub-folders


def test_unlabelled_point_clouds_warn_too(tmp_path):
    src = tmp_path / "clouds"
    src.mkdir()
    shutil.copy(LIDAR / "simple.las", src)
    with pytest.warns(InputWarning, match="no labels found .* each sample is a point cloud alone"):
        packdata.open_source(src, normalize="center").items()


def test_a_labels_file_beside_naming_none_of_the_inputs_is_not_suggested(tmp_path, beside):
    """LiDAR trees in a folder beside CIFAR's labels.json: the file names none of them, so the
    warning does not point at it (the suggested command would fail); a labels.pkl beside is
    never unpickled to find out."""
    trees = tmp_path / "trees"
    trees.mkdir()
    shutil.copy(LIDAR / "simple.las", trees)
    shutil.copy(Path(packdata.__file__).parent / "demo_data" / "cifar10" / "labels.json",
                tmp_path / "labels.json")
    (tmp_path / "labels.pkl").write_bytes(b"not a pickle: never read")
    with pytest.warns(InputWarning, match="no labels found") as said:
        packdata.open_source(trees, normalize="center").items()
    assert "lies beside it" not in str(said[0].message)
    assert "pass --labels FILE if they are in a file elsewhere" in str(said[0].message)


def every_path(ds) -> list:
    """The first two samples as each path serves them, batched: ds[i] stacked, ds[[...]], a
    stock DataLoader's first batch, packdata.loader's first batch."""
    return [torch.stack([ds[0], ds[1]]), ds[[0, 1]],
            next(iter(DataLoader(ds, batch_size=2))),
            next(iter(packdata.loader(ds, 2, shuffle=False)))]


def test_an_unlabelled_dataset_serves_a_lone_tensor_on_every_path(tmp_path, beside):
    with pytest.warns(InputWarning):
        images = packdata.open(packdata.convert(packdata.open_source(beside),
                                                tmp_path / "u.h5", workers=1).path)
    src = tmp_path / "clouds"
    src.mkdir()
    for f in sorted(LIDAR.glob("ahn_filtered_*.las")):
        shutil.copy(f, src)
    with pytest.warns(InputWarning):
        clouds = packdata.open(packdata.convert(packdata.open_source(src, points=256,
                                                                     normalize="center"),
                                                tmp_path / "c.h5", workers=1).path)
    for ds, shape in ((images, (3, 32, 32)), (clouds, (256, 3))):
        assert isinstance(ds[0], torch.Tensor) and ds[0].shape == shape
        batches = every_path(ds)
        for batch in batches:
            assert isinstance(batch, torch.Tensor) and batch.shape == (2, *shape)
            assert torch.equal(batch, batches[0])


# -- labels files ---------------------------------------------------------------------------

def labels_of(folder: Path, labels: Path) -> tuple[dict[str, int], list[str] | None]:
    ds = packdata.open(packdata.convert(packdata.open_source(folder, labels=labels),
                                        labels.with_name(labels.name + ".h5"), workers=1).path)
    return {key: int(ds[i][1]) for i, key in enumerate(ds.keys)}, ds.classes


def test_a_pickle_of_numpy_integers_is_accepted(tmp_path, beside):
    table = json.loads((tmp_path / "labels.json").read_text())["labels"]
    (tmp_path / "np.pkl").write_bytes(pickle.dumps({k: np.int64(v) for k, v in table.items()}))
    (tmp_path / "np32.pkl").write_bytes(pickle.dumps({k: np.uint8(v) for k, v in table.items()}))
    expected = {k.removesuffix(".png"): v for k, v in table.items()}
    assert labels_of(beside, tmp_path / "np.pkl")[0] == expected
    assert labels_of(beside, tmp_path / "np32.pkl")[0] == expected


def test_json_with_class_names_is_accepted_as_csv_is(tmp_path, beside):
    meta = json.loads((tmp_path / "labels.json").read_text())
    names = {k: meta["classes"][v] for k, v in meta["labels"].items()}
    (tmp_path / "names.json").write_text(json.dumps(names))
    (tmp_path / "names.csv").write_text("file,label\n" + "".join(f"{k},{v}\n"
                                                                  for k, v in names.items()))
    by_json, classes = labels_of(beside, tmp_path / "names.json")
    assert (by_json, classes) == labels_of(beside, tmp_path / "names.csv")
    assert classes == sorted(meta["classes"])
    assert all(classes[v] == names[k + ".png"] for k, v in by_json.items())
    # with the class list given, names index into it (not re-sorted)
    order = meta["classes"][::-1]
    (tmp_path / "listed.json").write_text(json.dumps({"classes": order, "labels": names}))
    by_list, classes = labels_of(beside, tmp_path / "listed.json")
    assert classes == order and all(order[v] == names[k + ".png"] for k, v in by_list.items())


@pytest.mark.parametrize("table, problem", [
    ({"a.png": 1.5}, "expected a dict of file name"),
    ({"a.png": True}, "expected a dict of file name"),
    ({"a.png": "cat", "b.png": 2}, "mixes class names and indices"),
    ({"classes": ["cat"], "labels": {"a.png": "dog"}}, "'dog' .* not in its classes"),
])
def test_bad_labels_files_name_the_file_and_the_problem(tmp_path, table, problem):
    path = tmp_path / "labels.json"
    path.write_text(json.dumps(table))
    from packdata.sources.labels import load_labels

    with pytest.raises(PackdataError, match=rf"labels.json: .*{problem}"):
        load_labels(path)


def test_a_listing_is_a_table_of_rows_not_an_object_per_file(tmp_path):
    """Items of a folder of files are rows of one table (paths in one byte array, labels in an
    int array): each item as the file's key, path and label; a slice, as handed to a worker,
    carries its own rows only; a row costs tens of bytes, not an object per file."""
    import tracemalloc

    from packdata.sources.base import FileTable, Item

    folder = copy_sample(tmp_path / "png", count=30)
    labels = json.loads((folder / "labels.json").read_text())["labels"]
    items = packdata.open_source(folder).items()
    assert isinstance(items, FileTable) and len(items) == 30
    names = sorted(p.name for p in folder.glob("*.png"))
    assert list(items) == [Item(n[:-4], folder / n, labels[n]) for n in names]
    assert items.keys() == [n[:-4] for n in names] == items[:].keys()  # without the items
    assert items.paths() == [str(folder / n) for n in names]
    assert items[-1] == items[29] and list(items[3:5]) == [items[3], items[4]]
    assert items[::10] == [items[0], items[10], items[20]]
    with pytest.raises(IndexError):
        items[30]
    unlabelled = FileTable.of(folder, ["a/b.png"], [None])
    assert unlabelled.labels is None and unlabelled[0] == Item("a/b", folder / "a/b.png", None)

    files = [f"class-{i % 10}/image-{i:07d}.png" for i in range(100_000)]
    tracemalloc.start()
    table = FileTable.of(tmp_path, files, [i % 10 for i in range(100_000)])
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert held / len(table) < 64  # 23 bytes of path, 8 of offset, 8 of label a row
    assert table[12345] == Item("class-5/image-0012345", tmp_path / files[12345], 5)
    block = table[12300:12400]
    assert list(block) == list(table)[12300:12400]
    assert len(pickle.dumps(block)) < len(pickle.dumps(table)) / 100
