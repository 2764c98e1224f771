"""bench/bench_read_layers.py's layers over real datasets: each layer reads whole epochs of its
own shuffled batches, and the summary counts each layer's own cost against the one inside it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import packdata
from tests.conftest import FakeClock, load_bench, needs_native_rows


@pytest.fixture(scope="module")
def read_layers():
    return load_bench("bench_read_layers")


def test_every_layer_reads_an_epoch_of_its_own_batches(read_layers, packed, container,
                                                      monkeypatch):
    """Each layer times what it names, against a known cost on a clock that moves only by it:
    the dataset's batch_transform costs 100 ms a batch, so the layers from ``get_batch`` up
    (which run it) take exactly that per batch, and those under it (which do not) nothing."""
    needs_native_rows()
    clock, cost = FakeClock(), 0.100
    monkeypatch.setattr(read_layers, "time", SimpleNamespace(perf_counter=clock))

    def costly(images):
        clock.now += cost
        return images

    ds = packdata.open(packed[container], batch_transform=costly)
    for _ in packdata.loader(ds, 256, shuffle=True):  # epoch 0: every record checked, as main()
        pass
    images, labels = ds.get_batch(np.arange(len(ds)))
    limit = read_layers.SortedGather(images.numpy(), labels.numpy())
    runs = read_layers.layers(ds, limit, seed=0)
    assert list(runs) == ["limit", *read_layers.INSIDE, "stock DataLoader", "torch sampler",
                          "torch profiler scope"]
    transformed = {"get_batch", "packdata.loader", "__getitems__ + collate", "stock DataLoader"}
    for layer, run in runs.items():
        per_batch = [run(), run()]  # one batch of 256 holds the 120 records
        assert per_batch == pytest.approx([cost if layer in transformed else 0.0] * 2), layer
    # each layer drew its own batches, each an epoch of every record once
    draws = [read_layers.shuffled_batches(len(ds), k) for k in range(2)]
    assert sorted(np.concatenate(draws[0]).tolist()) == list(range(len(ds)))
    assert not all(np.array_equal(a, b) for a, b in zip(*draws))


def test_the_summary_counts_each_layers_own_cost(read_layers):
    """Hand-made rounds (seconds per batch): medians in µs, and each layer's own cost by hand."""
    us = {"limit": 200, "gather": 190, "container read": 215, "checked read": 220,
          "get_batch": 250, "packdata.loader": 262, "__getitems__ + collate": 310,
          "stock DataLoader": 430, "torch sampler": 38, "torch profiler scope": 16}
    rounds = {layer: [(t + 7) * 1e-6, t * 1e-6, (t - 3) * 1e-6] for layer, t in us.items()}
    result = read_layers.summary(rounds)
    assert result["us_per_batch"] == pytest.approx(us)
    assert result["own_us_per_batch"] == pytest.approx({
        "container read": 25, "checked read": 5, "get_batch": 30, "packdata.loader": 12,
        "__getitems__ + collate": 60, "stock DataLoader": 142,
        "stock DataLoader, beyond its profiler scope": 126,
        "stock DataLoader, beyond its sampler, profiler scope and hand-over": 66})
    assert result["rounds_us"]["gather"] == pytest.approx([197, 190, 187])
