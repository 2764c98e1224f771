"""The three measurements end to end on real CIFAR images, on CPU, with the small CNN."""

from __future__ import annotations

import time
import warnings

import pytest
import torch

import packdata
from packdata.bench.inputs import BenchInput, LoaderOptions, open_input
from packdata.bench.models import build_model
from packdata.bench.runner import (
    Trainer,
    bench_device,
    first_batch,
    measure_io,
    measure_loop,
    measure_train,
    to_device,
)
from packdata.bench.settings import BenchSettings
from packdata.errors import BenchError
from packdata.loading.device import DeviceError

CPU = torch.device("cpu")
TINY = BenchSettings(batch_size=20, steps=4, warmup=1, max_seconds=30)


def trainer_for(inp, amp=False):
    batch = first_batch(inp, TINY, CPU)
    name, model = build_model("small-cnn", inp.kind, batch, inp.num_classes)
    return Trainer(model, CPU, amp=amp, name=name), batch


@pytest.mark.parametrize("which", ["lmdb", "folder"])
def test_three_measurements(packed, png_folder, which):
    inp = open_input(png_folder if which == "folder" else packed["lmdb"])
    assert inp.format == which and inp.count == 120 and inp.num_classes == 10
    trainer, batch = trainer_for(inp)
    io = measure_io(inp, TINY, LoaderOptions(), CPU)
    train = measure_train(trainer, batch, TINY)
    loop = measure_loop(inp, trainer, TINY, LoaderOptions())
    for result in (io, train, loop):
        assert result["steps"] == 4 and result["samples"] == 4 * 20
        assert result["samples_per_s"] == pytest.approx(result["samples"] / result["seconds"])
    assert loop["load_ms"] > 0 and loop["train_ms"] > 0
    assert 0 < loop["load_share"] < 1
    # per step, loading plus training is the loop's whole time
    assert (loop["load_ms"] + loop["train_ms"]) * 4 / 1e3 == pytest.approx(loop["seconds"])


def test_training_changes_the_weights_and_amp_runs_on_cpu(packed):
    inp = open_input(packed["hdf5"])
    trainer, batch = trainer_for(inp, amp=True)
    assert trainer.amp_dtype == torch.bfloat16
    before = trainer.state()
    trainer(batch)
    after = trainer.model.state_dict()
    assert any(not torch.equal(before["model"][k], after[k]) for k in after)
    trainer.restore(before)
    assert all(torch.equal(before["model"][k], v) for k, v in trainer.model.state_dict().items())


def test_loop_with_workers_and_a_time_bound(packed):
    inp = open_input(packed["tar"])
    trainer, _ = trainer_for(inp)
    bounded = BenchSettings(batch_size=32, steps=10_000, warmup=1, max_seconds=0.5)
    loop = measure_loop(inp, trainer, bounded, LoaderOptions(num_workers=1, prefetch_factor=2,
                                                             persistent_workers=True))
    assert 1 <= loop["steps"] < 10_000  # stopped by the clock, crossing epochs on the way


class SlowTrainer:
    """A training step of a fixed length, standing in for a model far slower than the budget."""

    device = CPU

    def __init__(self, seconds: float) -> None:
        self.seconds, self.calls = seconds, 0

    def __call__(self, batch) -> None:
        self.calls += 1
        time.sleep(self.seconds)


def test_max_seconds_bounds_the_warm_up_too():
    """50 warm-up and 50 timed steps of 0.1 s under a 0.5 s bound: warm-up ends after half the
    bound, the timed steps at the bound; the whole measurement ends within one step of it."""
    settings = BenchSettings(batch_size=4, steps=50, warmup=50, max_seconds=0.5)
    trainer = SlowTrainer(0.1)
    start = time.perf_counter()
    result = measure_train(trainer, torch.zeros(4, 3), settings)
    elapsed = time.perf_counter() - start
    assert 0.5 <= elapsed < 0.5 + 0.1 + 0.4  # the bound, one step, slack for a busy machine
    assert 2 <= trainer.calls - result["steps"] <= 3  # warm-up: 0.25 s of 0.1 s steps, not 50
    assert result["steps"] >= 1


def test_a_step_longer_than_the_bound_still_runs_once_each():
    """A single step over the whole bound: one warm-up and one timed step, not --warmup + --steps."""
    settings = BenchSettings(batch_size=4, steps=50, warmup=5, max_seconds=0.05)
    trainer = SlowTrainer(0.1)
    result = measure_train(trainer, torch.zeros(4, 3), settings)
    assert trainer.calls == 2 and result["steps"] == 1 and result["samples"] == 4


def test_timings_agree_with_the_wall_clock(packed):
    """Against an independent clock: reading each batch sleeps 30 ms (a batch_transform, inside
    packdata.loader's read) and each training step 15 ms. Each measurement's seconds must lie
    within the wall-clock time of its call, and the loop must put the sleeps in their parts:
    the loader reads in its feeder process while the step runs, so the loop waits for each
    batch only the read's time beyond the step's (15 ms), not the whole read.
    A sleep on a busy machine can overrun by more than the slack: up to three attempts, each
    checked in full (a measurement that counts wrongly fails all three)."""
    load_s, train_s, steps = 0.030, 0.015, 5
    slack = 0.012  # s per step: a read of 20 CIFAR records and Python's overhead on a busy machine
    ahead = 2 * load_s  # what the feeder may have read before the timed steps (the warm-up's)

    def slow_read(images):
        time.sleep(load_s)
        return images

    ds = packdata.open(packed["lmdb"], batch_transform=slow_read)
    inp = BenchInput("lmdb", packed["lmdb"], "lmdb", "image", ds, 10)
    settings = BenchSettings(batch_size=20, steps=steps, warmup=1, max_seconds=30)

    def timed(measure, *args):
        start = time.perf_counter()
        result = measure(*args)
        return result, time.perf_counter() - start

    def attempt() -> list[str]:
        wrong = []
        io, io_wall = timed(measure_io, inp, settings, LoaderOptions(), CPU)
        train, train_wall = timed(measure_train, SlowTrainer(train_s), torch.zeros(20, 3),
                                  settings)
        loop, loop_wall = timed(measure_loop, inp, SlowTrainer(train_s), settings,
                                LoaderOptions())
        # (name, result, its call's wall time, least and most seconds a step takes)
        for name, result, wall, least, most in (
                ("io", io, io_wall, steps * load_s, steps * (load_s + slack)),
                ("train", train, train_wall, steps * train_s, steps * (train_s + slack)),
                ("loop", loop, loop_wall, steps * load_s - ahead, steps * (load_s + slack))):
            assert result["steps"] == steps and result["samples"] == steps * 20
            # the timed steps, not the warm-up: at least the sleeps, at most the call's time
            if not least <= result["seconds"] <= min(wall - least / steps, most):
                wrong.append(f"{name}: {result['seconds']:.4f} s, call {wall:.4f} s")
        waited = (load_s - train_s) * 1e3  # a step's wait once the feeder runs at its pace
        if not waited - ahead * 1e3 / steps <= loop["load_ms"] < waited + slack * 1e3:
            wrong.append(f"load_ms {loop['load_ms']:.2f}")
        if not train_s * 1e3 <= loop["train_ms"] < (train_s + slack) * 1e3:
            wrong.append(f"train_ms {loop['train_ms']:.2f}")
        if loop["load_share"] != pytest.approx(waited / (waited + train_s * 1e3), abs=0.12):
            wrong.append(f"load_share {loop['load_share']:.3f}")
        return wrong

    attempts = []
    for _ in range(3):
        attempts.append(attempt())
        if not attempts[-1]:
            break
    assert not attempts[-1], attempts


def test_model_that_does_not_accept_the_batch(packed):
    inp = open_input(packed["lmdb"])
    batch = first_batch(inp, TINY, CPU)
    trainer = Trainer(torch.nn.Linear(10, 2), CPU, name="mymodels:linear")
    with pytest.raises(BenchError, match=r"'mymodels:linear' does not accept the batch "
                       r"\(uint8 20×3×32×32, int64 20\)"):
        trainer.check(batch)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_gpu_is_a_clear_error():
    with pytest.raises(DeviceError, match="'cuda' was asked for but"):
        bench_device("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a CPU bench is a normal choice: no warning
        assert bench_device("auto") == CPU


def test_device_names_and_settings():
    with pytest.raises(DeviceError, match="'gpu0': not a device name"):
        bench_device("gpu0")
    with pytest.raises(BenchError, match="runs on cpu or cuda"):
        bench_device("meta")
    with pytest.raises(BenchError, match="batch_size"):
        BenchSettings(batch_size=0)
    for seconds in (0.0, float("nan"), float("inf")):  # nan would end every measurement at once
        with pytest.raises(BenchError, match="max_seconds finite"):
            BenchSettings(max_seconds=seconds)
    nested = to_device((torch.ones(2), [torch.zeros(1)], {"a": torch.ones(1)}, "key"), CPU)
    assert nested[3] == "key" and isinstance(nested[1], list)


def test_io_on_a_fresh_lmdb_is_timed_warm(tmp_path):
    """First reads of an LMDB just opened are several times slower (its records are located
    once per reader): a fresh dataset's first measurement agrees with the next one only when the
    bench reads the batches it times once before timing them."""
    import packdata
    from tests.conftest import copy_sample

    source = packdata.open_source(copy_sample(tmp_path / "png", 500))
    path = packdata.convert(source, tmp_path / "x.lmdb", workers=1).path
    settings = BenchSettings(batch_size=50, steps=10, warmup=0, max_seconds=10)
    assert settings.warm
    ratios = []
    for _ in range(3):  # a busy machine: the best of three pairs
        inp = open_input(path)
        first = measure_io(inp, settings, LoaderOptions(), CPU)
        second = measure_io(inp, settings, LoaderOptions(), CPU)
        assert first["samples"] == second["samples"] == 500
        ratios.append(second["samples_per_s"] / first["samples_per_s"])
    assert min(ratios) < 2.5, ratios  # cold, the second ran 4-13× faster
