"""The loader sweep: which configurations, each repeated, and a winner only beyond the noise."""

from __future__ import annotations

import statistics

import pytest
import torch
from rich.console import Console

from packdata.bench.inputs import LoaderOptions, open_input
from packdata.bench.models import build_model
from packdata.bench.report import print_sweep, sweep_summary
from packdata.bench.runner import Trainer, first_batch
from packdata.bench.settings import BenchSettings
from packdata.bench.sweep import (
    decide,
    default_grid,
    describe,
    grid,
    run_sweep,
    worker_counts,
)
from packdata.errors import BenchError
from tests.conftest import ClockedTrainer

CPU = torch.device("cpu")


def test_worker_counts_cover_zero_to_cores():
    assert worker_counts(1) == [0, 1]
    assert worker_counts(2) == [0, 1, 2]
    assert worker_counts(12) == [0, 1, 2, 4, 8, 12]


def test_grid_drops_settings_that_cannot_matter():
    configs = default_grid(2, CPU)
    # workers 0 once; 1 and 2 × prefetch {2, 4} × persistent {no, yes}
    assert len(configs) == 1 + 2 * 2 * 2
    assert configs[0] == LoaderOptions(num_workers=0)
    assert not any(c.pin_memory for c in configs)  # no GPU: pinning means nothing
    cuda = default_grid(2, torch.device("cuda"))
    assert len(cuda) == 9 * 3  # pin no; pin yes × non_blocking no/yes
    assert not any(c.non_blocking and not c.pin_memory for c in cuda)
    assert len(set(cuda)) == len(cuda)


def test_sweep_repeats_every_configuration_within_its_budget(packed, fake_clock):
    """Real loops on a clock that moves by known costs: each batch's augmentation (loading)
    10 ms, each training step a cost set per run (10, 30, 40 and 90 ms, in the order the runs
    are made). Each run times 3 steps, after one of warm-up: 32, 32 and 24 samples (120
    records in batches of 32), so its rate, the median, the spread and the medians of the parts
    are hand counts."""
    inp = open_input(packed["lmdb"])
    settings = BenchSettings(batch_size=32, steps=3, warmup=1)
    batch = first_batch(inp, settings, CPU)
    trainer = Trainer(build_model("small-cnn", "image", batch, 10)[1], CPU)
    costs = iter([0.010, 0.030, 0.040, 0.090])
    train = ClockedTrainer(trainer, fake_clock, next(costs))

    def load(images):
        fake_clock.now += 0.010
        return images

    lines = []

    def log(line):
        lines.append(line)
        train.seconds = next(costs, 0.0)

    asked = grid([0, 1], prefetch_factor=(2,), persistent_workers=(True,))
    assert len(asked) == 2
    result = run_sweep(inp, train, settings, asked, seconds=100.0, log=log, repeats=2,
                       augment=load)
    assert [LoaderOptions(**{k: r[k] for k in LoaderOptions().to_dict()})
            for r in result["rows"]] == asked
    # runs in order: workers 0 (train 10 ms), 1 (30), 0 (40), 1 (90); steps of 10 ms + train
    first, second = result["rows"]
    assert first["rates"] == pytest.approx([88 / 0.060, 88 / 0.150])  # 1,466.7 and 586.7
    assert second["rates"] == pytest.approx([88 / 0.120, 88 / 0.300])  # 733.3 and 293.3
    assert first["samples_per_s"] == pytest.approx(1026.67, abs=0.01)
    assert first["spread"] == pytest.approx(880 / 1026.67, abs=1e-5)
    assert second["samples_per_s"] == pytest.approx(513.33, abs=0.01)
    assert second["spread"] == pytest.approx(440 / 513.33, abs=1e-5)
    assert first["train_ms"] == pytest.approx(25) and first["load_ms"] == pytest.approx(10)
    assert second["load_share"] == pytest.approx((10 / 40 + 10 / 100) / 2)
    assert first["steps"] == second["steps"] == 6 and first["samples"] == 176
    # workers 0's slowest run (586.7) does not beat workers 1's fastest (733.3): a tie, the
    # cheapest of the tied is picked
    assert result["best"] is None and result["tied"] == [0, 1] and result["pick"] == 0
    assert result["repeats"] == 2 and len(lines) == 4
    # rounds are interleaved: each configuration once, then each again
    assert [line.split(": ")[1] for line in lines] == [describe(c) for c in asked] * 2
    assert describe(result["rows"][1]) == \
        "num_workers=1, prefetch_factor=2, persistent_workers=True"
    with pytest.raises(BenchError, match="repeats must be ≥ 2"):
        run_sweep(inp, trainer, settings, asked, repeats=1)


def row(workers: int, *rates: float) -> dict:
    return {**LoaderOptions(num_workers=workers, prefetch_factor=2 if workers else None
                            ).to_dict(), "rates": list(rates),
            "samples_per_s": statistics.median(rates), "load_ms": 1.0, "train_ms": 9.0,
            "load_share": 0.1, "spread": (max(rates) - min(rates)) / statistics.median(rates)}


def test_a_winner_only_beyond_the_noise():
    clear = [row(0, 80, 85, 90), row(1, 100, 104, 110), row(2, 70, 75, 99)]
    assert decide(clear) == {"best": 1, "tied": [1], "pick": 1}
    # 102 vs 88 median, but the ranges overlap: a tie, settled on the fewest workers
    noisy = [row(0, 80, 88, 101), row(1, 95, 102, 110), row(2, 60, 70, 80)]
    assert decide(noisy) == {"best": None, "tied": [0, 1], "pick": 0}
    rows = noisy + [row(0, 1, 2, 3)]
    report = Console(record=True, width=200)
    print_sweep({"rows": rows, **decide(rows), "repeats": 3, "seconds": 10.0}, report)
    text = report.export_text()
    assert "no clear winner: 2 configurations (≈) are within noise of the fastest" in text
    assert "the cheapest of them: num_workers=0 (88 samples/s)" in text
    assert "80–101" in text
    rows = clear
    assert sweep_summary({"rows": rows, **decide(rows), "repeats": 3}).startswith(
        "best: num_workers=1, prefetch_factor=2, persistent_workers=False (104 samples/s; its "
        "slowest of 3 runs beats every other configuration's fastest)")


def test_the_sweep_fits_its_budget_or_says_up_front_that_it_will_not(packed):
    """Runs that start worker processes cannot be shorter than the start: a budget below that
    is said before the first run, with the time the sweep will take (and it takes about that);
    a budget that holds the runs is kept, and shared by them."""
    import re

    inp = open_input(packed["lmdb"])
    settings = BenchSettings(batch_size=8, steps=200, warmup=2)
    linear = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    trainer = Trainer(linear, CPU)  # steps of a millisecond: the loader sets the floor
    with_workers = grid([0, 1], prefetch_factor=(2,), persistent_workers=(False,))
    lines = []
    tight = run_sweep(inp, trainer, settings, with_workers, seconds=0.01, log=lines.append,
                      repeats=2)
    assert lines[0].startswith("warning: 2 configurations × 2 runs take at least "), lines
    assert "more than --sweep-seconds 0.01" in lines[0]
    said = float(re.search(r"at least ([\d,]+) s", lines[0]).group(1).replace(",", ""))
    assert tight["seconds"] <= 3 * said + 2
    lines.clear()
    roomy = run_sweep(inp, trainer, settings, [LoaderOptions(), LoaderOptions()], seconds=3.0,
                      log=lines.append, repeats=2)
    assert not any(line.startswith("warning") for line in lines)
    assert roomy["seconds"] <= 3.0 * 1.3
