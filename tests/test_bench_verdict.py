"""Verdict and advice from fixed timings."""

from __future__ import annotations

import math

import pytest

from packdata.bench.verdict import Facts, advice, verdict


def test_io_outruns_training_says_by_how_much():
    f = Facts(io_rate=3100, train_rate=1000, device="cuda", pin_memory=True, amp=True)
    assert verdict(f) == ("I/O alone delivers 3.1× what training consumes: the GPU need not wait "
                          "for data (the real loop was not measured).")
    assert not any("worker" in tip for tip in advice(f))


@pytest.mark.parametrize("loop", [400, 700, 899, 949, 950, 990, 1000])
@pytest.mark.parametrize("io", [500, 31_000])
def test_the_real_loop_decides_whether_the_gpu_waits(io, loop):
    """The H200 run that prompted this: I/O alone 10× training, the loop at 0.87× of it; the
    verdict said the GPU never waits. Now it says what the loop shows, and why."""
    f = Facts(io_rate=io, train_rate=1000, loop_rate=loop, load_share=0.04, device="cuda")
    text = verdict(f)
    share = loop / f.train_rate
    assert ("The GPU does not wait for data" in text) == (share >= 0.95)
    if share < 0.95:
        assert text.startswith(f"The GPU waits for data {1 - share:.0%} of each step: the real "
                               f"loop runs at {loop:,} samples/s, {share:.2f}× training alone")
        why = "I/O is the limit" if f.ratio < 1.1 else "the loader's work on the training thread"
        assert why in text
        assert any("real loop" in tip for tip in advice(f)) == (f.ratio >= 1.1)
    assert "never waits" not in text


def test_io_bound_says_how_much_more_training_could_take():
    f = Facts(io_rate=1000, train_rate=2400, device="cuda", format="folder", num_workers=0,
              cores=8, batch_size=256)
    text = verdict(f)
    assert text.startswith("I/O-bound: training could take 2.4× more samples/s")
    assert "1,000 vs 2,400" in text
    tips = " ".join(advice(f))
    assert "packdata convert" in tips  # per-file folder → packed format
    assert "num_workers=3" in tips  # 0 workers counted as 1 × ceil(2.4) = 3 processes
    assert "pin_memory=True" in tips  # CUDA without pinned memory
    assert "augment" in tips


def test_balanced_band():
    assert verdict(Facts(io_rate=1050, train_rate=1000)).startswith("Balanced: I/O alone delivers 1.05×")
    assert verdict(Facts(io_rate=950, train_rate=1000)).startswith("Balanced")
    assert verdict(Facts(io_rate=850, train_rate=1000)).startswith("I/O-bound")


def test_advice_follows_the_setup():
    base = dict(io_rate=500, train_rate=1000, device="cpu", cores=4)
    packed_workers = " ".join(advice(Facts(**base, format="lmdb", num_workers=2)))
    assert "num_workers=0" in packed_workers  # raw packed batches: workers cost more
    assert "packdata convert" not in packed_workers
    encoded = " ".join(advice(Facts(**base, format="lmdb", encoded=True)))
    assert "--encoding raw" in encoded and "num_workers=2" in encoded
    small = " ".join(advice(Facts(**base, batch_size=32)))
    assert "Larger batches (now 32)" in small
    assert "pin_memory" not in small  # no GPU, nothing to pin for


def test_training_bound_advice():
    tips = advice(Facts(io_rate=10_000, train_rate=1000, device="cuda", amp=False, num_workers=8))
    assert any("--amp" in t for t in tips)
    assert any("num_workers=4" in t for t in tips)  # 10× headroom: fewer workers
    assert not any("--amp" in t for t in advice(Facts(io_rate=10_000, train_rate=1000,
                                                       device="cuda", amp=True)))


def test_loop_that_waits_despite_fast_io_is_called_out():
    f = Facts(io_rate=5000, train_rate=1000, loop_rate=800, load_share=0.2)
    assert "20% of each step spent taking the next batch" in verdict(f)
    assert any("not overlapped" in t for t in advice(f))
    fed = Facts(io_rate=5000, train_rate=1000, loop_rate=800, load_share=0.2, feeder=True,
                device="cuda")
    assert any("feeder process" in t and "pin_memory=True" in t for t in advice(fed))
    pinned = Facts(**{**vars(fed), "pin_memory": True})  # the H200 run advised what it had
    said = [t for t in advice(pinned) if "feeder process" in t]
    assert said and not any("pin_memory" in t for t in advice(pinned))
    quiet = Facts(io_rate=5000, train_rate=1000, loop_rate=990, load_share=0.01)
    assert not any("not overlapped" in t for t in advice(quiet))


def test_cpu_contention_noted_only_below_serial_rate():
    # serial rate = 1 / (1/2000 + 1/1000) = 667 samples/s
    slow = Facts(io_rate=2000, train_rate=1000, loop_rate=400, load_share=0.3)
    assert "compete for the same CPU cores" in verdict(slow)
    ok = Facts(io_rate=2000, train_rate=1000, loop_rate=650, load_share=0.3)
    assert "compete" not in verdict(ok)


@pytest.mark.parametrize("io,train,expected", [
    (1, 0, "No verdict: training processed no samples"),
    (0, 0, "No verdict: training processed no samples"),
    (1, math.nan, "No verdict: training processed no samples"),
    (0, 1, "I/O-bound: the loader delivered no samples in the time allowed."),
    (math.nan, 1, "I/O-bound: the loader delivered no samples in the time allowed."),
])
def test_degenerate_rates_say_what_was_not_measured(io, train, expected):
    text = verdict(Facts(io_rate=io, train_rate=train))
    assert text.startswith(expected) and "inf" not in text and "nan" not in text


def test_advice_says_whether_the_io_figures_include_augmentation():
    slow = {"io_rate": 500, "train_rate": 1000, "format": "lmdb"}
    without = " ".join(advice(Facts(**slow)))
    assert "These I/O figures are without augmentation (--augment adds it)" in without
    augmented = " ".join(advice(Facts(**slow, augmented=True)))
    assert "this I/O rate includes the augmentation" in augmented and "--augment" not in augmented
