"""StepTimer: loading vs training time per step, on a fake clock so the figures are exact."""

from __future__ import annotations

import math
import time

import pytest
import torch

import packdata
from packdata.bench.timer import StepTimer, batch_size_of
from tests.conftest import FakeClock


@pytest.fixture
def clock(fake_clock) -> FakeClock:
    return fake_clock


def batches(clock: FakeClock, load_s: list[float], size: int = 8):
    for s in load_s:
        clock.now += s
        yield torch.zeros(size, 3)


def test_exported_from_package():
    assert packdata.StepTimer is StepTimer


def test_iterate_splits_load_and_train_time(clock):
    t = StepTimer(window=10)
    for _ in t.iterate(batches(clock, [0.010, 0.010, 0.030])):
        clock.now += 0.040  # the training step
    s = t.summary()
    assert s["steps"] == 3 and s["samples"] == 24
    assert s["load_ms"] == pytest.approx(50 / 3)
    assert s["train_ms"] == pytest.approx(40)
    assert s["load_share"] == pytest.approx(0.050 / 0.170)
    assert s["samples_per_s"] == pytest.approx(24 / 0.170)


def test_moving_average_keeps_the_last_window(clock):
    t = StepTimer(window=2)
    for i, _ in enumerate(t.iterate(batches(clock, [0.1, 0.001, 0.001]))):
        clock.now += 0.01 * (i + 1)
    assert t.load_ms == pytest.approx(1.0)  # the slow first load left the window
    assert t.train_ms == pytest.approx(25.0)
    assert t.summary()["load_ms"] == pytest.approx(102 / 3)  # totals keep everything


def test_skip_leaves_warmup_out(clock):
    t = StepTimer(skip=2)
    for _ in t.iterate(batches(clock, [1.0, 1.0, 0.002, 0.002])):
        clock.now += 0.01
    assert t.steps == 2 and t.seen == 4
    assert t.summary()["load_ms"] == pytest.approx(2.0)


def test_manual_marks_and_misuse(clock):
    t = StepTimer()
    assert math.isnan(t.load_ms) and math.isnan(t.summary()["samples_per_s"])
    with pytest.raises(RuntimeError, match="start"):
        t.stepped()
    t.start()
    clock.now += 0.005
    t.loaded(16)
    clock.now += 0.015
    t.stepped()
    assert t.load_share == pytest.approx(0.25)
    assert "25% waiting" in repr(t)
    with pytest.raises(ValueError):
        StepTimer(window=0)


def test_batch_size_of_every_batch_shape():
    images, labels = torch.zeros(6, 3, 4, 4), torch.zeros(6)
    assert batch_size_of(images) == 6
    assert batch_size_of((images, labels)) == batch_size_of([images, labels]) == 6
    assert batch_size_of({"image": images, "label": labels}) == 6  # not the number of keys
    assert batch_size_of(([torch.zeros(5, 3)] * 4, labels[:4])) == 4  # variable-length samples
    assert batch_size_of(object()) == 1


def gpu_seconds(cycles: int) -> float:
    """GPU time of one ``torch.cuda._sleep(cycles)``, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_marks_are_events_that_time_the_gpu_without_stalling_the_host():
    gpu_seconds(200_000_000)  # clocks up from idle before the spin is sized
    per_s = 50_000_000 / gpu_seconds(50_000_000)
    step = int(0.030 * per_s)  # a training step of about 30 ms on the GPU

    def loader(host_s: float, count: int):
        for _ in range(count):
            time.sleep(host_s)  # the host fetching a batch
            yield torch.zeros(8, 3)

    # the GPU is the limit: the host queues the next steps while it runs, and waits for no data
    t = StepTimer(window=10, device="cuda")
    begin = time.perf_counter()
    for _ in t.iterate(loader(0.005, 6)):
        torch.cuda._sleep(step)
    queued = time.perf_counter() - begin
    s = t.summary()
    wall = time.perf_counter() - begin
    assert s["steps"] == 6
    # a synchronising timer would have waited for each step; one of host time, timed none
    assert queued < 0.5 * s["seconds"] and s["train_ms"] > 0.5e3 * gpu_seconds(step)
    assert s["load_share"] < 0.1  # only the first batch's fetch left the GPU idle
    assert s["seconds"] == pytest.approx(wall, rel=0.25)
    # the host is the limit: the GPU idles while each batch is fetched
    t = StepTimer(window=10, device="cuda")
    for _ in t.iterate(loader(0.060, 6)):
        torch.cuda._sleep(step // 6)
    assert t.summary()["load_share"] > 0.6


def test_a_skip_that_is_not_a_count_is_refused_by_name():
    with pytest.raises(packdata.errors.ArgumentError, match="skip must be an integer ≥ 0, got -1"):
        StepTimer(skip=-1)
