"""StreamingDataset: shard-ordered reads with a shuffle buffer, split across workers."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

import packdata
from packdata.errors import ArgumentError


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


@pytest.mark.parametrize("persistent", [False, True])
def test_each_epoch_reshuffles_in_workers(packed, persistent):
    """Workers hold copies of the dataset: the epoch must still advance (and set_epoch reach them)."""
    stream = packdata.StreamingDataset(packed["lmdb"], shuffle_buffer=40, seed=1, chunk=16)
    lookup = labels_and_pixels(packdata.open(packed["lmdb"]))
    dl = DataLoader(stream, batch_size=16, num_workers=2, persistent_workers=persistent)

    def epoch() -> list[int]:
        return [lookup[img.contiguous().numpy().tobytes()] for images, _ in dl for img in images]

    first, second = epoch(), epoch()
    assert sorted(first) == sorted(second) == list(range(120))
    assert first != second
    stream.set_epoch(0)
    assert epoch() == first


@pytest.mark.parametrize("container", ["tar", "hdf5"])
@pytest.mark.parametrize("world", [2, 3, 4, 7])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_and_workers_get_equal_shares_covering_the_epoch(packed, container, world,
                                                               drop_last):
    stream = packdata.StreamingDataset(packed[container], chunk=32, drop_last=drop_last)
    shares = [[i for worker in range(2) for a, b in stream.spans_for(3, rank, world, worker, 2)
               for i in range(a, b)] for rank in range(world)]
    per_rank = 120 // world if drop_last else -(-120 // world)
    assert all(len(share) == per_rank for share in shares)
    served = [i for share in shares for i in share]
    if drop_last:
        assert len(set(served)) == len(served)  # nothing twice
    else:
        assert set(served) == set(range(120))  # everything, a few wrapped round twice


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("workers", [1, 3])
def test_every_rank_runs_the_same_number_of_batches(packed, world, workers):
    """With a DataLoader each worker batches its own part: the batches of a rank are the sum over
    its workers, the same on every rank because shares and their split are."""
    stream = packdata.StreamingDataset(packed["tar"], chunk=32)
    batch = 8
    counts = [sum(-(-sum(b - a for a, b in stream.spans_for(1, rank, world, w, workers)) // batch)
                  for w in range(workers)) for rank in range(world)]
    assert len(set(counts)) == 1


def sample_key(sample):
    from packdata.resume_check import sample_ids

    return sample_ids([sample])


@pytest.mark.parametrize("k", [1, 50, 119, 130])
@pytest.mark.parametrize("buffer", [1, 40])
def test_stream_resumes_mid_epoch_in_process(packed, k, buffer):
    from packdata.loading.resume import resumable

    ok, why = resumable(lambda: packdata.StreamingDataset(packed["tar"], shuffle_buffer=buffer,
                                                          seed=2, chunk=16),
                        k, epochs=2, key=sample_key)
    assert ok, why


def batch_keys(batch):
    from packdata.resume_check import sample_ids

    return sample_ids(tuple(batch))  # default_collate makes a list of the parts


@pytest.mark.parametrize(("workers", "k", "batch", "world"),
                         [(0, 7, 8, 1), (2, 1, 8, 1), (2, 9, 8, 1), (2, 16, 8, 1), (2, 17, 8, 1),
                          (3, 10, 8, 1), (4, 9, 2, 7)])
def test_stream_loader_resumes_mid_epoch_with_workers(packed, workers, k, batch, world):
    """Each worker skips exactly what the loop took from it; the order is the uninterrupted one,
    also when stopped mid-way through a round of workers (k=9), in the second epoch, or when
    workers run out of batches at different rounds (rank 3 of 7: 18 samples over 4 workers)."""
    from packdata.loading.resume import resumable

    ok, why = resumable(lambda: packdata.StreamingDataset(
        packed["tar"], shuffle_buffer=20, seed=2, chunk=16, rank=world // 2, world_size=world,
    ).loader(batch, num_workers=workers, persistent_workers=workers == 3), k, epochs=2,
        key=batch_keys)
    assert ok, why


def test_a_state_between_epochs_starts_the_next_epoch_afresh_at_any_num_workers(packed):
    def build(n):
        stream = packdata.StreamingDataset(packed["tar"], shuffle_buffer=20, seed=2, chunk=16)
        return stream.loader(8, num_workers=n)

    first = build(0)
    list(first)
    state = first.state_dict()
    assert (state["sampler"]["epoch"], state["sampler"]["position"]) == (1, 0)
    again, reference = build(2), build(2)
    again.load_state_dict(state)
    reference.set_epoch(1)
    assert [batch_keys(b) for b in again] == [batch_keys(b) for b in reference]


@pytest.mark.parametrize(("workers", "new_workers", "k"), [(2, 3, 5), (3, 0, 10), (0, 2, 20)])
def test_stream_resumed_at_another_num_workers_serves_the_rest_once(packed, workers, new_workers,
                                                                    k):
    """Re-planned: the interrupted epoch serves exactly its remaining samples, the next epoch is
    the uninterrupted one at the new num_workers."""
    from packdata.loading.resume import resumable

    def build(n):
        stream = packdata.StreamingDataset(packed["tar"], shuffle_buffer=20, seed=2, chunk=16)
        return stream.loader(8, num_workers=n)

    ok, why = resumable(lambda: build(workers), k, epochs=2, key=batch_keys,
                        rebuild=lambda: build(new_workers))
    assert ok, why


@pytest.mark.parametrize("workers", [(3, 0, 2), (4, 2, 3)])
def test_stream_interrupted_twice_at_other_num_workers_serves_the_epoch_once(packed, workers):
    def build(n):
        stream = packdata.StreamingDataset(packed["tar"], shuffle_buffer=20, seed=2, chunk=16)
        return stream.loader(8, num_workers=n)

    everything = sorted(i for b in build(0) for i in batch_keys(b))
    taken, state = [], None
    for n, k in zip(workers[:2], (5, 3)):
        loader = build(n)
        if state is not None:
            loader.load_state_dict(state)
        batches = iter(loader)
        for _ in range(k):
            taken += batch_keys(next(batches))
        state = loader.state_dict()
        del batches
    last = build(workers[2])
    last.load_state_dict(state)
    assert sorted(taken + [i for b in last for i in batch_keys(b)]) == everything


def test_resumable_into_another_setup_catches_a_changed_order(packed):
    from packdata.loading.resume import resumable

    def build(seed):
        return packdata.StreamingDataset(packed["tar"], shuffle_buffer=20, seed=seed,
                                         chunk=16).loader(8)

    class Forgetful:  # loads nothing: the whole epoch again
        def __init__(self):
            self.loader = build(2)

        def __iter__(self):
            return iter(self.loader)

        def set_epoch(self, epoch):
            self.loader.set_epoch(epoch)

        def load_state_dict(self, state):
            pass

    ok, why = resumable(lambda: build(2), 5, epochs=2, key=batch_keys, rebuild=Forgetful)
    assert not ok and "40 extra" in why


def test_stream_refuses_a_state_of_other_settings_world_size_dataset_or_corrupted(packed,
                                                                                 packed_text):
    from packdata.errors import ResumeError
    from packdata.loading.resume import sealed

    stream = packdata.StreamingDataset(packed["tar"], shuffle_buffer=40, seed=2)
    it = iter(stream)
    next(it)
    state = stream.state_dict()
    assert state["sampler"]["position"] == 1
    with pytest.raises(ResumeError, match="seed 2 .now 3"):
        packdata.StreamingDataset(packed["tar"], shuffle_buffer=40, seed=3).load_state_dict(state)
    with pytest.raises(ResumeError, match="world_size 1 .now 2"):
        packdata.StreamingDataset(packed["tar"], shuffle_buffer=40, seed=2, rank=1,
                                  world_size=2).load_state_dict(state)
    with pytest.raises(ResumeError, match="another dataset"):
        packdata.StreamingDataset(packed_text["tar"], shuffle_buffer=40,
                                  seed=2).load_state_dict(state)
    with pytest.raises(ResumeError, match="checksum"):
        stream.load_state_dict({**state, "sampler": {**state["sampler"], "position": 2}})
    for broken in ({"position": -1}, {"positions": [500]}, {"next": 3}, {"groups": [[0, 0]]}):
        with pytest.raises(ResumeError, match="corrupted stream state"):
            stream.load_state_dict(sealed(stream.dataset, {**state["sampler"], **broken}))


def test_a_plain_dataloader_mid_epoch_position_is_refused_not_guessed(packed):
    from packdata.errors import ResumeError

    stream = packdata.StreamingDataset(packed["tar"], shuffle_buffer=20, seed=2, chunk=16)
    batches = iter(DataLoader(stream, batch_size=8, num_workers=2))
    next(batches)
    with pytest.raises(ResumeError, match="loader"):
        stream.state_dict()
    del batches


def stream_order(stream, lookup, workers: int = 0) -> list[int]:
    """One iteration's samples, in order: in this process, or through DataLoader workers."""
    if not workers:
        return [lookup[image.numpy().tobytes()] for image, _ in stream]
    dl = DataLoader(stream, batch_size=8, num_workers=workers)
    return [lookup[img.contiguous().numpy().tobytes()] for images, _ in dl for img in images]


def test_peeking_at_a_stream_does_not_move_its_epochs(packed):
    lookup = labels_and_pixels(packdata.open(packed["tar"]))
    reference = packdata.StreamingDataset(packed["tar"], shuffle_buffer=40, seed=3)
    epochs = [stream_order(reference, lookup) for _ in range(2)]
    stream = packdata.StreamingDataset(packed["tar"], shuffle_buffer=40, seed=3)
    image, _ = next(iter(stream))
    assert lookup[image.numpy().tobytes()] == epochs[0][0]
    assert [stream_order(stream, lookup) for _ in range(2)] == epochs


@pytest.mark.parametrize("first, then", [(0, 2), (2, 0)])
def test_in_process_and_worker_iterations_count_the_same_epochs(packed, first, then):
    lookup = labels_and_pixels(packdata.open(packed["tar"]))
    stream = packdata.StreamingDataset(packed["tar"], shuffle_buffer=40, seed=3)
    done = [stream_order(stream, lookup, first) for _ in range(2)]
    reference = packdata.StreamingDataset(packed["tar"], shuffle_buffer=40, seed=3)
    assert done == [stream_order(reference, lookup, first) for _ in range(2)]
    reference.set_epoch(2)  # switching readers goes on with epoch 2, not epoch 0 again
    assert stream_order(stream, lookup, then) == stream_order(reference, lookup, then)


@pytest.mark.parametrize(("option", "value", "least"), [
    ("shuffle_buffer", -1, 0), ("shuffle_buffer", 1.5, 0), ("chunk", 0, 1), ("chunk", -5, 1),
    ("seed", -1, 0), ("seed", "a", 0),
])
def test_a_stream_setting_that_is_not_a_count_is_refused_by_name(packed, option, value, least):
    # a chunk of 0 failed in range() at the first epoch, a negative seed in numpy's generator;
    # a negative chunk or buffer was taken without a word
    with pytest.raises(ArgumentError, match=f"{option} must be an integer ≥ {least}, got {value!r}"):
        packdata.StreamingDataset(packed["tar"], **{option: value})


def test_a_stream_epoch_or_worker_count_that_is_not_a_count_is_refused_by_name(packed):
    stream = packdata.StreamingDataset(packed["tar"])
    with pytest.raises(ArgumentError, match="epoch must be an integer ≥ 0, got 'a'"):
        stream.set_epoch("a")
    with pytest.raises(ArgumentError, match="num_workers must be an integer ≥ 0, got -1"):
        stream.loader(8, num_workers=-1)
