"""Pad and pack collate: hand-checked small cases, and lossless on real token sequences."""

from __future__ import annotations

import doctest

import pytest
import torch

import packdata
from packdata.loading import collate
from packdata.loading.collate import PackCollate, PadCollate, pack_sequences, pad_collate


def test_pad_collate_hand_checked():
    ids, mask = pad_collate([torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([5, 6])],
                            pad_id=-1)
    assert ids.tolist() == [[1, 2, 3], [4, -1, -1], [5, 6, -1]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]] and mask.dtype == torch.bool
    ids, mask = PadCollate(pad_id=0, multiple_of=4)([torch.tensor([7, 8, 9, 10, 11])])
    assert ids.tolist() == [[7, 8, 9, 10, 11, 0, 0, 0]] and int(mask.sum()) == 5
    with pytest.raises(ValueError, match="empty batch"):
        pad_collate([])


def test_pack_hand_checked():
    p = pack_sequences([torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6, 7, 8]), torch.tensor([9])],
                       block_size=4, pad_id=0)
    assert p.input_ids.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 0, 0, 0]]
    assert p.segment_ids.tolist() == [[1, 1, 1, 2], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert p.position_ids.tolist() == [[0, 1, 2, 0], [1, 2, 3, 4], [0, 0, 0, 0]]
    assert p.padding_fraction == 3 / 12
    with pytest.raises(ValueError, match="block_size"):
        pack_sequences([torch.tensor([1])], 0)


def test_collate_is_lossless_on_real_tokens(packed_text):
    ds = packdata.open(packed_text["lmdb"])
    docs = ds[list(range(len(ds)))]
    ids, mask = pad_collate(docs)
    assert [row[m].tolist() for row, m in zip(ids, mask)] == [d.tolist() for d in docs]
    assert ids.shape == (len(docs), int(ds.lengths().max()))
    packed = PackCollate(block_size=1024)(docs)
    real = packed.segment_ids.flatten() > 0
    assert packed.input_ids.flatten()[real].tolist() == torch.cat(docs).tolist()
    starts = (packed.position_ids.flatten()[real] == 0).sum()
    assert starts == len(docs)  # every document starts once, at position 0
    assert packed.padding_fraction < 1024 / packed.input_ids.numel()


def test_docstring_example_runs():
    assert doctest.testmod(collate).failed == 0


@pytest.mark.parametrize(("options", "match"), [
    ({"multiple_of": 0}, "multiple_of must be an integer ≥ 1, got 0"),  # was ZeroDivisionError
    ({"multiple_of": -1}, "multiple_of must be an integer ≥ 1, got -1"),  # was taken as 1
    ({"pad_id": 1.5}, "pad_id must be an integer"),  # was cast into the int64 ids
])
def test_padding_options_that_are_not_counts_or_ids_are_refused_by_name(options, match):
    with pytest.raises(packdata.errors.ArgumentError, match=match):
        PadCollate(**options)
    with pytest.raises(packdata.errors.ArgumentError, match=match):
        pad_collate([torch.arange(3)], **options)
