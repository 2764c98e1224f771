"""LengthBucketBatchSampler: every index once per epoch (over ranks too), seeded, low padding."""

from __future__ import annotations

import numpy as np
import pytest

from packdata.loading.buckets import LengthBucketBatchSampler, padding_fraction
from packdata.loading.sampling import EpochBatchSampler


@pytest.fixture(scope="module")
def lengths(peps_dir) -> np.ndarray:
    """Real, long-tailed lengths: bytes per line of the PEP slice (about 10,000 lines)."""
    lines = [len(line) for p in sorted(peps_dir.glob("*.txt"))
             for line in p.read_bytes().splitlines() if line.strip()]
    return np.array(lines)


def flat(batches) -> list[int]:
    return [int(i) for b in batches for i in b]


@pytest.mark.parametrize("size", [{"batch_size": 64}, {"max_tokens": 4096}])
def test_every_index_once_per_epoch(lengths, size):
    s = LengthBucketBatchSampler(lengths, **size, seed=3)
    first, second = list(s), list(s)
    assert sorted(flat(first)) == sorted(flat(second)) == list(range(len(lengths)))
    assert first != second and len(first) == len(s)
    s.set_epoch(0)
    assert list(s) == first
    if "max_tokens" in size:  # the budget holds, except for a document longer than it alone
        assert all(len(b) * lengths[b].max() <= 4096 or len(b) == 1 for b in first)
    else:
        assert sorted(len(b) for b in first)[1] == 64  # one partial batch at most


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("size", [{"batch_size": 50}, {"max_tokens": 3000}])
def test_ranks_split_the_epoch_exactly(lengths, world, size):
    samplers = [LengthBucketBatchSampler(lengths, **size, seed=5, rank=r, world_size=world)
                for r in range(world)]
    for epoch in (0, 1):
        shares = [list(s) for s in samplers]
        assert len({len(share) for share in shares}) == 1  # same number of steps on every rank
        everything = flat(b for share in shares for b in share)
        assert sorted(everything) == list(range(len(lengths)))  # once each, none repeated
        assert epoch == samplers[0].epoch


def test_tiny_world_edge_cases():
    s = [LengthBucketBatchSampler([5, 9, 3], batch_size=8, rank=r, world_size=3) for r in range(3)]
    assert sorted(flat(b for x in s for b in x)) == [0, 1, 2] and all(len(x) == 1 for x in s)
    with pytest.raises(ValueError, match="cannot be split over 4 ranks"):
        LengthBucketBatchSampler([5, 9, 3], batch_size=8, world_size=4, rank=0)
    with pytest.raises(ValueError, match="exactly one of"):
        LengthBucketBatchSampler([5, 9], batch_size=2, max_tokens=10)
    with pytest.raises(ValueError, match="exactly one of"):
        LengthBucketBatchSampler([5, 9])


@pytest.mark.parametrize(("docs", "size", "world"), [
    ([5, 9, 3, 7, 2], {"batch_size": 1}, 2),      # single-document batches: cannot be halved
    ([20, 30, 40], {"max_tokens": 8}, 2),           # every document over the budget
    ([5, 9, 3, 7, 2], {"batch_size": 4}, 4),
])
def test_ranks_never_get_an_empty_batch(docs, size, world):
    shares = [list(LengthBucketBatchSampler(docs, **size, rank=r, world_size=world))
              for r in range(world)]
    assert all(batch for share in shares for batch in share)
    assert len({len(share) for share in shares}) == 1
    assert set(flat(b for share in shares for b in share)) == set(range(len(docs)))


def test_same_seed_same_batches(lengths):
    a = LengthBucketBatchSampler(lengths, max_tokens=5000, seed=7)
    b = LengthBucketBatchSampler(lengths, max_tokens=5000, seed=7)
    assert [list(a), list(a)] == [list(b), list(b)]
    assert list(LengthBucketBatchSampler(lengths, max_tokens=5000, seed=8)) != list(
        LengthBucketBatchSampler(lengths, max_tokens=5000, seed=7))


def test_padding_fraction_hand_checked():
    lengths = np.array([2, 4, 4, 8, 1])
    # batch [0,1]: 2 + 4 real, padded to 2×4 → 2 pads; batch [2,3,4]: 13 real, 3×8 → 11 pads
    assert padding_fraction([[0, 1], [2, 3, 4]], lengths) == pytest.approx(13 / 32)
    s = LengthBucketBatchSampler(lengths, batch_size=2, shuffle=False, bucket_width=0)
    assert list(s) == [[4, 0], [1, 2], [3]]  # ascending length, no shuffle
    # [1,2] → 1 pad of 4; [4,4] → 0; [8] → 0: 1 pad in 20 padded tokens
    assert s.padding_fraction(0) == pytest.approx(1 / 20)
    assert padding_fraction([], lengths) == 0.0


def test_bucketing_pads_far_less_than_random(lengths):
    random = padding_fraction(EpochBatchSampler(len(lengths), 64, seed=0), lengths)
    bucketed = LengthBucketBatchSampler(lengths, 64, seed=0)
    assert random > 0.4 and bucketed.padding_fraction() < 0.02
    budget = LengthBucketBatchSampler(lengths, max_tokens=8192, seed=0)
    assert budget.padding_fraction() < 0.05
    wide = LengthBucketBatchSampler(lengths, 64, seed=0, bucket_width=0.5)
    assert bucketed.padding_fraction() < wide.padding_fraction() < random


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("size", [57, 203])
def test_every_rank_runs_the_same_number_of_batches(world, size):
    lengths = np.random.default_rng(size).integers(1, 500, size=size)
    for options in ({"batch_size": 8}, {"max_tokens": 1500}):
        ranks = [LengthBucketBatchSampler(lengths, seed=4, rank=r, world_size=world, **options)
                 for r in range(world)]
        counts = [len(list(s)) for s in ranks]
        assert len(set(counts)) == 1 and counts[0] == len(ranks[0])
