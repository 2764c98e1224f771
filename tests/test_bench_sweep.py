"""The loader sweep: which configurations, and a table holding every one asked."""

from __future__ import annotations

import torch

from packdata.bench.inputs import LoaderOptions, open_input
from packdata.bench.models import build_model
from packdata.bench.runner import BenchSettings, Trainer, first_batch
from packdata.bench.sweep import default_grid, describe, grid, run_sweep, worker_counts

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


def test_sweep_table_holds_every_configuration(packed):
    inp = open_input(packed["lmdb"])
    settings = BenchSettings(batch_size=32, steps=3, warmup=1)
    batch = first_batch(inp, settings, CPU)
    trainer = Trainer(build_model("small-cnn", "image", batch, 10)[1], CPU)
    asked = grid([0, 1], prefetch_factor=(2,), persistent_workers=(False, True))
    assert len(asked) == 3
    lines = []
    result = run_sweep(inp, trainer, settings, asked, seconds_per_config=2, log=lines.append)
    assert [LoaderOptions(**{k: r[k] for k in LoaderOptions().to_dict()})
            for r in result["rows"]] == asked
    assert all(1 <= r["steps"] <= 3 and r["samples_per_s"] > 0 for r in result["rows"])
    rates = [r["samples_per_s"] for r in result["rows"]]
    assert result["best"] == rates.index(max(rates))
    assert len(lines) == 3 and result["seconds"] > 0
    assert describe(result["rows"][2]) == \
        "num_workers=1, prefetch_factor=2, persistent_workers=True"
