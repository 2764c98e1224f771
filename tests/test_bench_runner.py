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
from tests.conftest import ClockedTrainer

CPU = torch.device("cpu")
TINY = BenchSettings(batch_size=20, steps=4, warmup=1, max_seconds=30)


def trainer_for(inp, amp=False):
    batch = first_batch(inp, TINY, CPU)
    name, model = build_model("small-cnn", inp.kind, batch, inp.num_classes)
    return Trainer(model, CPU, amp=amp, name=name), batch


@pytest.mark.parametrize("which", ["lmdb", "folder"])
def test_three_measurements(packed, png_folder, which, fake_clock):
    """Real batches and a real training step, on a clock that moves only by known costs: each
    batch's augmentation (timed as loading) 50 ms, each training step 10 ms. The figures are
    hand counts: 4 timed steps of 20 samples, the warm-up step left out."""
    inp = open_input(png_folder if which == "folder" else packed["lmdb"])
    assert inp.format == which and inp.count == 120 and inp.num_classes == 10
    trainer, batch = trainer_for(inp)
    trainer = ClockedTrainer(trainer, fake_clock, 0.010)

    def load(images):
        fake_clock.now += 0.050
        return images

    io = measure_io(inp, TINY, LoaderOptions(), CPU, augment=load)
    train = measure_train(trainer, batch, TINY)
    loop = measure_loop(inp, trainer, TINY, LoaderOptions(), augment=load)
    assert io == pytest.approx({"samples_per_s": 400, "steps": 4, "samples": 80, "seconds": 0.2})
    assert train == pytest.approx({"samples_per_s": 2000, "steps": 4, "samples": 80,
                                   "seconds": 0.04})
    assert loop == pytest.approx({"samples_per_s": 80 / 0.24, "steps": 4, "samples": 80,
                                  "seconds": 0.24, "load_ms": 50, "train_ms": 10,
                                  "load_share": 5 / 6})


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
    """Against the wall clock: reading each batch sleeps 100 ms (a batch_transform, inside
    packdata.loader's read) and each training step 10 ms, an order of magnitude apart. The
    loader reads in its feeder process while the step runs, so the loop waits for each batch
    only the read's time beyond the step's (90 ms), less what the feeder read ahead during the
    warm-up (up to 2 batches). A sleep lasts at least its length, however busy the machine:
    each measurement holds at least its steps' sleeps and lies within its call; the loop's
    parts hold at least the waits and the step, and loading outweighs training (a busy machine
    stretches both). No bound rests on a few ms of slack."""
    load_s, train_s, steps = 0.100, 0.010, 6
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

    io, io_wall = timed(measure_io, inp, settings, LoaderOptions(), CPU)
    train, train_wall = timed(measure_train, SlowTrainer(train_s), torch.zeros(20, 3), settings)
    loop, loop_wall = timed(measure_loop, inp, SlowTrainer(train_s), settings, LoaderOptions())
    for result, wall, least in ((io, io_wall, steps * load_s), (train, train_wall, steps * train_s),
                                (loop, loop_wall, steps * load_s - ahead)):
        assert result["steps"] == steps and result["samples"] == steps * 20
        assert least <= result["seconds"] <= wall, (result, wall)
    waited = (load_s - train_s) * 1e3  # a step's wait once the feeder runs at its pace
    assert loop["load_ms"] >= waited - ahead * 1e3 / steps and loop["train_ms"] >= train_s * 1e3
    assert loop["load_share"] > 0.5  # at least 57 of the waits' ms against a 10 ms step


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


def test_io_on_a_fresh_lmdb_is_timed_warm(tmp_path, fake_clock, monkeypatch):
    """First reads of an LMDB just opened are several times slower (its records are located
    once per reader; 4-13× on the 2-core machine): a fresh dataset's first measurement agrees
    with the next one only when the bench reads the batches it times once before timing them.
    Known costs on a fake clock, so that a busy machine cannot blur it: 1 ms a batch, and 10 ms
    more for each record read for the first time."""
    import packdata
    from tests.conftest import copy_sample

    source = packdata.open_source(copy_sample(tmp_path / "png", 500))
    path = packdata.convert(source, tmp_path / "x.lmdb", workers=1).path
    # the fake clock runs in this process: the reads stay here, not in a feeder process
    monkeypatch.setattr("packdata.loading.settings.default_feeder", lambda *_: False)
    rates = {}
    for warm in (True, False):
        inp = open_input(path)
        read, seen = inp.dataset._read, set()

        def costed(indices, read=read, seen=seen, **options):
            fresh = set(indices.tolist()) - seen
            seen.update(fresh)
            fake_clock.now += 0.001 + 0.010 * len(fresh)
            return read(indices, **options)

        inp.dataset._read = costed
        settings = BenchSettings(batch_size=50, steps=10, warmup=0, max_seconds=10, warm=warm)
        first = measure_io(inp, settings, LoaderOptions(), CPU)
        second = measure_io(inp, settings, LoaderOptions(), CPU)
        assert first["samples"] == second["samples"] == 500
        rates[warm] = (first["samples_per_s"], second["samples_per_s"])
    assert rates[True] == pytest.approx((50 / 0.001, 50 / 0.001))  # warm: both at 1 ms a batch
    assert rates[False] == pytest.approx((50 / 0.501, 50 / 0.001))  # cold: the first pays 501
