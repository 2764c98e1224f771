"""StreamingDataset: shard-ordered reads with a shuffle buffer, split across workers."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

import packdata


def labels_and_pixels(ds) -> dict[bytes, int]:
    return {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}


@pytest.mark.parametrize("workers", [0, 2])
def test_stream_yields_each_sample_once(packed, workers):
    stream = packdata.StreamingDataset(packed["tar"], shuffle_buffer=40, seed=1)
    lookup = labels_and_pixels(packdata.open(packed["tar"]))
    dl = DataLoader(stream, batch_size=16, num_workers=workers)
    order = [lookup[img.contiguous().numpy().tobytes()] for images, _ in dl for img in images]
    assert sorted(order) == list(range(120))
    assert order != list(range(120))


def test_stream_over_single_file_container_is_chunked(packed):
    stream = packdata.StreamingDataset(packed["hdf5"], shuffle_buffer=1, chunk=32)
    assert len(stream.spans) == 4
    assert len(list(stream)) == 120
