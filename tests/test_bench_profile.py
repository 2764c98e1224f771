"""--profile: a trace TensorBoard/Chrome can open, and a breakdown that finds known costs where
they were spent."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

import packdata
from packdata.augment import cifar_recipe
from packdata.bench.inputs import BenchInput, LoaderOptions, open_input
from packdata.bench.models import build_model
from packdata.bench.profile import PARTS, breakdown, profile_loop
from packdata.bench.runner import Trainer, first_batch
from packdata.bench.settings import BenchSettings
from packdata.errors import BenchError

CPU = torch.device("cpu")


def event(name, start, end, device=DeviceType.CPU):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end),
                           device_type=device)


def test_profile_writes_trace_and_a_breakdown_within_the_wall_clock(packed, tmp_path):
    inp = open_input(packed["lmdb"])
    settings = BenchSettings(batch_size=32, steps=3, warmup=1)
    batch = first_batch(inp, settings, CPU)
    trainer = Trainer(build_model("small-cnn", "image", batch, 10)[1], CPU)
    start = time.perf_counter()
    result = profile_loop(inp, trainer, settings, LoaderOptions(), tmp_path / "prof",
                          wait=1, warmup=1, active=3, augment=cifar_recipe(seed=0))
    wall_ms = (time.perf_counter() - start) * 1e3
    assert result["steps"] == 3
    assert result["trace_files"], "no trace written"
    trace = json.loads((tmp_path / "prof" / result["trace_files"][0]).read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"packdata.load", "packdata.to_device", "packdata.augment", "packdata.train"} <= names
    parts = result["parts_ms"]
    assert set(parts) == set(PARTS) and all(v >= 0 for v in parts.values())
    # the profiler's clock against this one: 5 steps ran (1 wait, 1 warm-up, 3 active) inside
    # the call, so the 3 active steps took less than all of it
    assert 3 * result["step_ms"] < wall_ms
    assert parts["compute"] > parts["data_loading"]  # a CNN step costs more than an LMDB read


class SleepingTrainer:
    """A training step of a known length (the profiler's clock must find it in ``compute``)."""

    device = CPU

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, batch) -> None:
        time.sleep(self.seconds)


def test_breakdown_matches_known_sleeps_in_loading_and_training(packed, tmp_path):
    """Against known costs: reading each batch sleeps 200 ms (a batch_transform, so the time is
    spent inside packdata.loader's read) and each training step 20 ms, an order of magnitude
    apart. The loader reads in its feeder process while the step runs, so each step waits for
    its batch the read's time beyond the step's (180 ms), less what the feeder read ahead
    during the unprofiled steps (up to 2 batches, 100 ms a profiled step). A sleep lasts at
    least its length, however busy the machine: the parts hold at least those times; above,
    they are compared with each other (a busy machine stretches them all): training stays under
    loading, and what no range covers under it too (a part that took in the other's time, or a
    range the breakdown missed, would cross them), never a few ms of slack."""
    load_ms, train_ms, steps = 200, 20, 4
    ahead_ms = 2 * load_ms

    def slow_read(images):
        time.sleep(load_ms / 1e3)
        return images

    ds = packdata.open(packed["lmdb"], batch_transform=slow_read)
    inp = BenchInput("lmdb", packed["lmdb"], "lmdb", "image", ds, 10)
    settings = BenchSettings(batch_size=16, steps=steps, warmup=0)
    start = time.perf_counter()
    result = profile_loop(inp, SleepingTrainer(train_ms / 1e3), settings, LoaderOptions(),
                          tmp_path / "prof", wait=1, warmup=1, active=steps)
    wall_ms = (time.perf_counter() - start) * 1e3  # the profiled steps ran inside it
    parts, step = result["parts_ms"], result["step_ms"]
    assert parts["data_loading"] >= load_ms - train_ms - ahead_ms / steps
    assert train_ms <= parts["compute"] < parts["data_loading"]
    assert parts["other"] + parts["host_to_device"] + parts["augmentation"] < parts["data_loading"]
    # the labelled ranges do not overlap: their parts together fit in the step
    assert sum(parts[p] for p in PARTS if p != "other") <= step * (1 + 1e-9)
    assert train_ms <= step and steps * step <= wall_ms
    assert result["data_loading_share"] > 0.5


def test_breakdown_from_fixed_events():
    events = [
        event("ProfilerStep*", 0, 1000), event("packdata.load", 0, 300),
        event("packdata.to_device", 300, 350), event("packdata.augment", 350, 400),
        event("packdata.train", 400, 950),
        event("aten::conv2d", 420, 900),  # inside train: not counted twice
        event("ProfilerStep*", 1000, 2000), event("packdata.load", 1000, 1100),
        event("packdata.train", 1100, 2000),
    ]
    r = breakdown(events)
    assert r["steps"] == 2 and r["step_ms"] == pytest.approx(1.0)
    assert r["parts_ms"] == pytest.approx({"data_loading": 0.2, "host_to_device": 0.025,
                                           "augmentation": 0.025, "compute": 0.725,
                                           "other": 0.025})
    assert r["data_loading_share"] == pytest.approx(0.2)


def test_overlapping_ranges_count_in_each_part_and_gpu_kernels_are_counted():
    events = [event("ProfilerStep*", 0, 100), event("packdata.load", 0, 60),
              event("packdata.train", 40, 100),  # overlaps load: counted in both
              event("void gemm_kernel", 50, 80, DeviceType.CUDA),
              event("Memcpy HtoD", 10, 20, DeviceType.CUDA)]
    r = breakdown(events, cuda=True)
    assert r["parts_ms"]["data_loading"] == pytest.approx(0.060)
    assert r["parts_ms"]["compute"] == pytest.approx(0.060)
    assert r["parts_ms"]["other"] == pytest.approx(0.0)
    assert r["gpu_kernels_ms"] == pytest.approx(0.030)  # copies are not compute


def test_no_steps_is_an_error():
    with pytest.raises(BenchError, match="no ProfilerStep"):
        breakdown([event("packdata.load", 0, 1)])
