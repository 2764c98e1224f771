"""EpochBatchSampler: deterministic shuffles, every index once per epoch, even rank shares."""

from __future__ import annotations

import numpy as np
import pytest

from packdata.errors import ArgumentError
from packdata.loading.buckets import LengthBucketBatchSampler
from packdata.loading.sampling import EpochBatchSampler


def flat(sampler) -> list[int]:
    return [i for batch in sampler for i in batch]


def test_every_index_once_and_reshuffled_per_epoch():
    s = EpochBatchSampler(103, 10, seed=3)
    first, second = flat(s), flat(s)
    assert sorted(first) == sorted(second) == list(range(103))
    assert first != second and len(list(s)) == len(s) == 11
    s.set_epoch(0)
    assert flat(s) == first  # same seed and epoch, same order


def test_same_seed_same_batches():
    a, b = EpochBatchSampler(50, 8, seed=7), EpochBatchSampler(50, 8, seed=7)
    assert list(a) == list(b)
    assert list(EpochBatchSampler(50, 8, seed=8)) != list(EpochBatchSampler(50, 8, seed=7))


@pytest.mark.parametrize("value", [-1, 1.5, "2", True, None])
def test_a_seed_or_epoch_that_is_not_a_count_is_refused_by_name(value):
    # numpy's generators would raise their own ValueError at the first batch, deep in an epoch
    with pytest.raises(ArgumentError, match=f"seed must be an integer ≥ 0, got {value!r}"):
        EpochBatchSampler(50, 8, seed=value)
    s = EpochBatchSampler(50, 8, seed=np.int64(4))
    with pytest.raises(ArgumentError, match=f"epoch must be an integer ≥ 0, got {value!r}"):
        s.set_epoch(value)
    s.set_epoch(np.int64(2))  # numpy integers are counts too
    plain = EpochBatchSampler(50, 8, seed=4)
    plain.set_epoch(2)
    assert flat(s) == flat(plain) != flat(EpochBatchSampler(50, 8, seed=4))


@pytest.mark.parametrize("value", [0, -2, 2.5, "8", None])
def test_a_batch_size_that_is_not_a_positive_integer_is_refused_by_name(value):
    with pytest.raises(ArgumentError, match=f"batch_size must be an integer ≥ 1, got {value!r}"):
        EpochBatchSampler(50, value)


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_partition_the_epoch(drop_last):
    world = 3
    samplers = [EpochBatchSampler(100, 7, seed=1, rank=r, world_size=world, drop_last=drop_last)
                for r in range(world)]
    shares = [flat(s) for s in samplers]
    assert len({len(list(s)) for s in samplers}) == 1  # same number of batches on every rank
    assert all(len(list(s)) == len(s) for s in samplers)
    everything = sorted(i for share in shares for i in share)
    if drop_last:
        assert len(set(everything)) == len(everything) == world * (100 // world // 7 * 7)
    else:
        assert set(everything) == set(range(100)) and len(everything) == 102  # 2 wrapped


def test_sequential_and_drop_last():
    s = EpochBatchSampler(10, 4, shuffle=False, drop_last=True)
    assert list(s) == [[0, 1, 2, 3], [4, 5, 6, 7]] and len(s) == 2
    with pytest.raises(ValueError, match="rank 3"):
        EpochBatchSampler(10, 4, rank=3, world_size=2)


@pytest.mark.parametrize("size", [97, 101, 130])
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_rank_runs_the_same_number_of_batches(size, world, drop_last):
    ranks = [EpochBatchSampler(size, 8, drop_last=drop_last, seed=1, rank=r, world_size=world)
             for r in range(world)]
    counts = [len(list(s)) for s in ranks]
    assert len(set(counts)) == 1 and counts[0] == len(ranks[0])
    # after a mid-epoch resume too: the rest of the epoch at another world size
    state = ranks[0].state_dict(position=2)
    others = [EpochBatchSampler(size, 8, drop_last=drop_last, seed=1, rank=r, world_size=5 - world)
              for r in range(5 - world)]
    for s in others:
        s.load_state_dict(state)
    assert len({len(list(s)) for s in others}) == 1


@pytest.mark.parametrize("size", [-5, 2.5])
def test_a_dataset_size_that_is_not_a_count_is_refused_by_name(size):
    with pytest.raises(ArgumentError, match=f"size must be an integer ≥ 0, got {size!r}"):
        EpochBatchSampler(size, 4)


@pytest.mark.parametrize("lengths", [[3.5, 4, 5], [3, -4, 5]])
def test_document_lengths_that_are_not_counts_are_refused_not_truncated(lengths):
    with pytest.raises(ArgumentError, match="lengths must be integers ≥ 0"):
        LengthBucketBatchSampler(lengths, batch_size=2)
    assert len(LengthBucketBatchSampler([3, 4, 5], batch_size=2)) == 2
