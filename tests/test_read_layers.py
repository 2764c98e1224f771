"""bench/bench_read_layers.py's layers over real datasets: each layer reads whole epochs of its
own shuffled batches, and the summary counts each layer's own cost against the one inside it."""

from __future__ import annotations

import numpy as np
import pytest

import packdata
from packdata import checksum
from tests.conftest import load_bench


@pytest.fixture(scope="module")
def read_layers():
    return load_bench("bench_read_layers")


@pytest.mark.skipif(not checksum.NATIVE_ROWS, reason="the gather layer is the C extension's")
def test_every_layer_reads_an_epoch_of_its_own_batches(read_layers, packed, container):
    ds = packdata.open(packed[container])
    for _ in packdata.loader(ds, 256, shuffle=True):  # epoch 0: every record checked, as main()
        pass
    images, labels = ds.get_batch(np.arange(len(ds)))
    limit = read_layers.SortedGather(images.numpy(), labels.numpy())
    runs = read_layers.layers(ds, limit, seed=0)
    assert list(runs) == ["limit", *read_layers.INSIDE, "stock DataLoader", "torch sampler",
                          "torch profiler scope"]
    times = {layer: [run(), run()] for layer, run in runs.items()}
    assert all(t > 0 for pair in times.values() for t in pair)
    result = read_layers.summary(times)
    us = result["us_per_batch"]
    assert result["own_us_per_batch"]["checked read"] == pytest.approx(
        us["checked read"] - us["container read"])
    assert result["own_us_per_batch"]["stock DataLoader"] == pytest.approx(
        us["stock DataLoader"] - us["get_batch"] - us["torch sampler"])
    assert result["own_us_per_batch"]["stock DataLoader, beyond its profiler scope"] == \
        pytest.approx(us["stock DataLoader"] - us["get_batch"] - us["torch sampler"]
                      - us["torch profiler scope"])
    assert result["own_us_per_batch"]["__getitems__ + collate"] == pytest.approx(
        us["__getitems__ + collate"] - us["get_batch"])
    # each layer drew its own batches, each an epoch of every record once
    draws = [read_layers.shuffled_batches(len(ds), k) for k in range(2)]
    assert sorted(np.concatenate(draws[0]).tolist()) == list(range(len(ds)))
    assert not all(np.array_equal(a, b) for a, b in zip(*draws))
