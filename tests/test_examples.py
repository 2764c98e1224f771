"""The examples in examples/ train on tiny real slices: both data paths run, the loss falls, the
table and the JSON are written, and a dataset of the wrong kind is refused naming what it is."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

import packdata
from packdata.errors import PackdataError
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
CIFAR = ROOT / "packdata" / "demo_data" / "cifar10"

pytestmark = pytest.mark.usefixtures("one_thread")


def example(name: str):
    return load_script(ROOT / "examples" / f"{name}.py", f"example_{name}")


@pytest.fixture(scope="module")
def tiny_cifar(tmp_path_factory) -> Path:
    """40 real CIFAR-10 PNGs (4 per class) with their labels.json."""
    meta = json.loads((CIFAR / "labels.json").read_text())
    names = [n for n in sorted(meta["labels"]) if int(n.rsplit("_", 1)[1][:4]) < 4]
    out = tmp_path_factory.mktemp("cifar")
    for n in names:
        shutil.copyfile(CIFAR / n, out / n)
    (out / "labels.json").write_text(json.dumps(
        {"classes": meta["classes"], "labels": {n: meta["labels"][n] for n in names}}))
    return out


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_bytes(gzip.decompress((FIXTURES / "text" / "gpt2" / "tokenizer.json.gz").read_bytes()))
    return path


@pytest.fixture(scope="module")
def one_pep(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("peps")
    shutil.copyfile(FIXTURES / "text" / "peps" / "pep-0294.txt", out / "pep-0294.txt")
    return out


def check_run(doc: dict, json_path: Path, out: str) -> None:
    assert set(doc["epochs"]) == {"baseline", "packdata"}
    for name, rows in doc["epochs"].items():
        assert rows[-1]["loss"] < rows[0]["loss"], (name, [r["loss"] for r in rows])
        for row in rows:
            assert 0 <= row["load_share"] <= 1 and row["seconds"] > 0 and row["steps"] > 0
    written = json.loads(json_path.read_text())
    assert written["epochs"]["packdata"][0]["steps"] == doc["epochs"]["packdata"][0]["steps"]
    assert "| epoch | baseline s | baseline loading | baseline loss" in out
    assert "packdata loading" in out and "[packdata] epoch 0:" in out


def test_cifar_example_trains_on_both_paths(tiny_cifar, tmp_path, capsys):
    doc = example("cifar10_cnn").main([
        "--data", str(tiny_cifar), "--epochs", "3", "--batch-size", "8", "--device", "cpu",
        "--model", "small-cnn", "--json", str(tmp_path / "cifar.json")])
    check_run(doc, tmp_path / "cifar.json", capsys.readouterr().out)
    assert doc["train_samples"] == 36 and doc["test_samples"] == 4
    assert doc["epochs"]["baseline"][0]["samples"] == doc["epochs"]["packdata"][0]["samples"] == 36
    assert all(0 <= r["test_accuracy"] <= 1 for r in doc["epochs"]["packdata"])


def test_lidar_example_trains_on_both_paths(tmp_path, capsys):
    pytest.importorskip("laspy")
    doc = example("lidar_pointnet").main([
        "--data", str(FIXTURES / "lidar-pieces"), "--epochs", "3", "--batch-size", "8",
        "--points", "128", "--variants", "2", "--device", "cpu", "--lr", "3e-3",
        "--json", str(tmp_path / "lidar.json")])
    check_run(doc, tmp_path / "lidar.json", capsys.readouterr().out)
    assert doc["classes"] == ["airborne_tree", "mobile_stem", "survey"]


def test_text_example_trains_on_both_paths(one_pep, tmp_path, capsys):
    doc = example("text_lm").main([
        "--data", str(one_pep), "--epochs", "3", "--batch-size", "8", "--device", "cpu",
        "--json", str(tmp_path / "text.json")])  # bytes tokeniser: a small output layer
    out = capsys.readouterr().out
    check_run(doc, tmp_path / "text.json", out)
    base, packed = doc["epochs"]["baseline"][0], doc["epochs"]["packdata"][0]
    assert base["loss_count"] == packed["loss_count"]  # the same real tokens on both paths
    assert packed["padding"] < base["padding"]  # length buckets pad less than random batches
    assert "held-out loss per real token" in out


def test_text_baseline_tokenises_as_the_container_stores(one_pep, gpt2, tmp_path):
    """The baseline's per-item tokenising gives exactly the ids packdata pre-tokenised."""
    pytest.importorskip("tokenizers")
    text_lm = example("text_lm")
    lines = text_lm.read_lines(one_pep)
    src = packdata.open_source(one_pep, kind="text", tokenizer=gpt2, per_line=True,
                               add_bos=True, add_eos=True, max_length=32)
    packdata.convert(src, tmp_path / "lines.h5", workers=1)
    ds = packdata.open(tmp_path / "lines.h5")
    items = text_lm.LineDataset(lines, str(gpt2), 32)
    items.bos = items.eos = 50256
    assert len(ds) == len(lines) > 50
    assert all(torch.equal(ds[i], items[i]) for i in range(len(lines)))


@pytest.mark.parametrize("name, data", [
    ("cifar10_cnn", FIXTURES / "lidar-pieces"),
    ("lidar_pointnet", CIFAR),
    ("text_lm", CIFAR),
])
def test_examples_refuse_the_wrong_kind_of_dataset(name, data, capsys, monkeypatch):
    module = example(name)
    with pytest.raises(PackdataError, match=r"expected .*, found (pointcloud|image) data \(\d+ \.(las|png)"):
        module.main(["--data", str(data), "--device", "cpu"])
    monkeypatch.setattr(sys, "argv", [name, "--data", str(data), "--device", "cpu"])
    assert module.common.run_main(module.main, None) == 2
    assert capsys.readouterr().err.startswith("error: ")
