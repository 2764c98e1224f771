"""packdata.loading.feeder: the loader's reads in a background process, the training process
only taking each batch; the same batches, order and position as in process; errors, a killed
feeder, an epoch left early and an exception in the loop each end cleanly."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

import packdata
from packdata.errors import DatasetError, WorkerDied
from packdata.loading.dataset import PackedDataset
from tests.test_verify import damaged_copy


def _epochs(loader, count):
    return [[tuple(part.clone() for part in batch) for batch in loader] for _ in range(count)]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_feeder_serves_the_in_process_batches_epoch_after_epoch(packed, container, workers):
    ds = packdata.open(packed[container])
    fed = packdata.loader(ds, 16, shuffle=True, seed=3, num_workers=workers)
    here = packdata.loader(ds, 16, shuffle=True, seed=3, num_workers=workers, feeder=False)
    assert fed.feeder and not here.feeder
    for ours, theirs in zip(_epochs(fed, 2), _epochs(here, 2), strict=True):
        assert len(ours) == len(theirs) == len(fed)
        for (x, y), (rx, ry) in zip(ours, theirs, strict=True):
            assert torch.equal(x, rx) and torch.equal(y, ry)
    fed.close()


def test_the_training_process_reads_nothing_once_the_feeder_runs(packed, monkeypatch):
    ds = packdata.open(packed["hdf5"])
    loader = packdata.loader(ds, 32)
    first = [x.clone() for x, _ in loader]  # starts the feeder (forked with the class as it is)
    pid = loader._feeder.pid
    monkeypatch.setattr(PackedDataset, "read_samples", _refuse)  # here only, not in the feeder
    again = [x for x, _ in loader]
    assert loader._feeder.pid == pid != os.getpid()  # the same process, kept across epochs
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    loader.close()


def _refuse(self, indices):
    raise AssertionError("the training process read a batch")


def test_an_epoch_left_early_then_a_resumed_one_serve_the_rest(packed):
    ds = packdata.open(packed["lmdb"])
    reference = [y.clone() for _, y in packdata.loader(ds, 8, shuffle=True, seed=1, feeder=False)]
    loader = packdata.loader(ds, 8, shuffle=True, seed=1)
    taken = []
    for _, y in loader:
        taken.append(y.clone())
        if len(taken) == 5:
            state = loader.state_dict()
            break
    rebuilt = packdata.loader(ds, 8, shuffle=True, seed=1)
    rebuilt.load_state_dict(state)
    rest = [y.clone() for _, y in rebuilt]
    assert all(torch.equal(a, b) for a, b in zip(taken + rest, reference, strict=True))
    # the feeder that was stopped mid-epoch serves a whole next epoch
    assert len(list(loader)) == len(loader)
    loader.close()
    rebuilt.close()


def test_a_damaged_record_is_the_datasets_error_raised_here(tmp_path, packed, container):
    """Checked in the feeder, raised in the training process as the dataset's own error."""
    copy = damaged_copy(tmp_path, packed, container)  # record 3's first pixel flipped
    loader = packdata.loader(packdata.open(copy), 2, feeder=True)
    seen = 0
    with pytest.raises(DatasetError, match=rf"record 3 \('{loader.dataset.keys[3]}'\) does not "
                       "match its checksum"):
        for _ in loader:
            seen += 1
    assert seen == 1  # records 0-1 served, then the batch of records 2-3 refused
    assert len(list(packdata.loader(packdata.open(packed[container]), 2))) == 60
    loader.close()


def test_a_killed_feeder_is_an_error_not_a_hang(packed):
    ds = packdata.open(packed["tar"])
    loader = packdata.loader(ds, 4)
    batches = iter(loader)
    next(batches)
    os.kill(loader._feeder.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDied, match="feeder process.*signal 9"):
        for _ in batches:
            pass
    assert time.monotonic() - start < 30
    assert len(list(loader)) == len(loader)  # the next epoch starts a new feeder


def test_an_exception_in_the_loop_and_closing_end_the_feeder(packed):
    ds = packdata.open(packed["hdf5"])
    loader = packdata.loader(ds, 4)
    with pytest.raises(RuntimeError, match="in the step"):
        for _ in loader:
            raise RuntimeError("in the step")
    pid = loader._feeder.pid
    loader.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waits only for its parent's wait
        return f.read().split()[2] != "Z"


def test_variable_length_batches_without_a_collate_are_read_in_process(packed_text):
    ds = packdata.open(packed_text["hdf5"])
    assert not packdata.loader(ds, 4).feeder
    assert packdata.loader(ds, 4, collate=packdata.PadCollate(pad_id=0)).feeder
    with pytest.raises(ValueError, match="feeder=True reads in one background process"):
        packdata.loader(ds, 4, feeder=True, num_workers=2, workers="process")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batches_for_a_gpu_arrive_page_locked_and_are_copied_exactly(packed, container):
    ds = packdata.open(packed[container])
    host = packdata.loader(ds, 16, pin_memory=True)
    images, labels = next(iter(host))
    assert images.is_pinned() and labels.is_pinned()  # the feeder's slots, registered with CUDA
    reference = list(packdata.loader(ds, 16, feeder=False))
    for epoch in range(2):  # slots reused while copies are in flight must not change a batch
        copied = [tuple(t.cpu() for t in b) for b in packdata.loader(ds, 16, device="cuda")]
        for (x, y), (rx, ry) in zip(copied, reference, strict=True):
            assert torch.equal(x, rx) and torch.equal(y, ry), epoch
    host.close()
