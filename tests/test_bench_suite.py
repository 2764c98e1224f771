"""run_bench end to end: --compare on an image folder, and inputs that are not datasets."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from packdata.bench import runner
from packdata.bench.settings import BenchSettings
from packdata.bench.suite import run_bench
from packdata.errors import BenchError, DatasetError

TINY = BenchSettings(batch_size=20, steps=2, warmup=1, max_seconds=30, device="cpu")


@pytest.fixture
def known_costs(fake_clock, monkeypatch):
    """Real batches and real training steps, on a clock that moves by known costs: 50 ms to
    bring each batch to the device (loading), 10 ms each training step. I/O alone then runs at
    20 / 0.050 = 400 samples/s and training alone at 20 / 0.010 = 2,000."""
    to_device, step = runner.to_device, runner.Trainer.__call__

    def loaded(*args, **kwargs):
        fake_clock.now += 0.050
        return to_device(*args, **kwargs)

    def trained(self, batch):
        step(self, batch)
        fake_clock.now += 0.010

    monkeypatch.setattr(runner, "to_device", loaded)
    monkeypatch.setattr(runner.Trainer, "__call__", trained)


def test_compare_measures_the_folder_and_every_container(png_folder, known_costs):
    log: list[str] = []
    result = run_bench(png_folder, TINY, compare=True, log=log.append)
    names = [run["input"]["name"] for run in result["runs"]]
    assert names == ["folder", "lmdb", "hdf5", "tar"]
    assert all(run["input"]["count"] == 120 for run in result["runs"])
    assert any("converted" in line for line in log)
    # training alone never touches storage: measured once, shared by every input
    assert len({id(run["train"]) for run in result["runs"]}) == 1
    for run in result["runs"]:
        assert run["io"]["samples_per_s"] == pytest.approx(400) and run["loop"]["steps"] == 2
        assert run["train"]["samples_per_s"] == pytest.approx(2000)
        assert run["loop"]["samples_per_s"] == pytest.approx(20 / 0.060)
        assert run["io_over_train"] == pytest.approx(0.2)
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


def test_augmentation_runs_on_the_io_side(packed):
    """A user's augmentation that costs 40 ms a batch: the I/O rate includes it, as the training
    loop would wait for it; the loop counts it as loading time."""
    calls = []

    def slow_flip(images: torch.Tensor) -> torch.Tensor:
        calls.append(images.shape)
        time.sleep(0.04)
        return images.flip(-1).float()

    result = run_bench(packed["lmdb"], TINY, augment=slow_flip)
    run = result["runs"][0]
    assert result["settings"]["augment"].endswith("slow_flip")
    assert run["io"]["samples_per_s"] < 20 / 0.04  # never faster than the augmentation allows
    assert run["loop"]["load_ms"] >= 40
    # first batch, then I/O alone and the real loop: warm-up and timed steps each
    assert len(calls) >= 1 + 2 * (1 + 2) and calls[0] == (20, 3, 32, 32)
    if run["io_over_train"] < 1.1:  # I/O-bound (as expected at ≤ 500 samples/s): say why
        assert "this I/O rate includes the augmentation" in " ".join(run["advice"])


def test_cifar_augmentation_by_name_and_the_target_estimate(packed, known_costs):
    result = run_bench(packed["tar"], TINY, augment="cifar", target_gpu="A100", mfu=0.5)
    assert result["settings"]["augment"] == "cifar"
    assert result["settings"]["target"] == {"name": "A100", "peak_flops": 19.5e12,
                                            "precision": "fp32", "mfu": 0.5}
    run, flops = result["runs"][0], result["flops"]
    assert run["io"]["samples"] == 40
    estimate = run["target"]
    assert estimate["gpu_samples_per_s"] == pytest.approx(0.5 * 19.5e12 / flops["per_sample"])
    assert estimate["io_samples_per_s"] == pytest.approx(400)
    assert estimate["text"] in run["verdict"] and run["verdict"].count("An A100 at 50% MFU") == 1
    assert flops["achieved_per_s"] == pytest.approx(flops["per_sample"] * 2000)
    with pytest.raises(BenchError, match="--augment 'autoaugment': known: cifar"):
        run_bench(packed["hdf5"], TINY, augment="autoaugment")


def test_cifar_augmentation_is_for_images(packed_text):
    with pytest.raises(BenchError, match="--augment cifar is for images; this dataset holds "
                       "text samples"):
        run_bench(packed_text["hdf5"], TINY, augment="cifar")


def test_target_without_a_flop_count_is_omitted_with_the_reason(packed, tmp_path):
    (tmp_path / "rnn.py").write_text(
        "import torch\n"
        "class Rows(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.rnn = torch.nn.LSTM(32, 8, batch_first=True)\n"
        "    def forward(self, x):\n"
        "        return self.rnn(x.flatten(1, 2))[0][:, -1]\n")
    result = run_bench(packed["lmdb"], dataclasses.replace(TINY, model=f"{tmp_path}/rnn.py:Rows"),
                       target_gpu="H100")
    run = result["runs"][0]
    assert result["flops"]["per_sample"] is None and "rnn" in result["flops"]["reason"]
    assert run["target"]["reason"] == result["flops"]["reason"]
    assert "No estimate for H100: the step runs aten." in run["verdict"]
