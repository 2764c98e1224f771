"""Batches leaving DataLoader workers through reused shared-memory slots (or by value): plain
tensors on arrival, same values and memory order; a slot reused only once nothing of its batch
is held; only in workers, only small CPU tensors."""

from __future__ import annotations

import gc
import pickle
import subprocess
import sys
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.collate import default_collate

import packdata
import packdata.loading.dataset
from packdata import units
from packdata.loading import arrivals, transfer


def test_a_marked_tensor_arrives_plain_with_its_values_and_memory_order():
    images = torch.arange(2 * 4 * 4 * 3, dtype=torch.uint8).reshape(2, 4, 4, 3).permute(0, 3, 1, 2)
    for t in (images, torch.arange(9)[::2], torch.tensor(7), images[:, 1]):
        got = pickle.loads(ForkingPickler.dumps(t.as_subclass(transfer.ByValueTensor)))
        assert type(got) is torch.Tensor and torch.equal(got, t)
    got = pickle.loads(ForkingPickler.dumps(images.as_subclass(transfer.ByValueTensor)))
    assert got.is_contiguous(memory_format=torch.channels_last)


def test_only_small_cpu_tensors_in_a_worker_are_marked(monkeypatch):
    batch = (torch.zeros(3), [torch.ones(2)])
    assert transfer.by_value(batch) is batch  # the training process: untouched
    monkeypatch.setattr(units, "_READS_FOR_ANOTHER", True)  # as in a worker
    small, (inner,) = transfer.by_value(batch)
    assert type(small) is transfer.ByValueTensor and type(inner) is transfer.ByValueTensor
    big = torch.zeros(transfer.BY_VALUE_MAX_BYTES + 1, dtype=torch.uint8)
    assert type(transfer.by_value(big)) is torch.Tensor


class Squares(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return transfer.by_value(torch.full((2, 3), i))


def test_through_worker_processes():
    got = list(DataLoader(Squares(), batch_size=None, num_workers=2))
    assert [type(t) for t in got] == [torch.Tensor] * 8
    assert [int(t[0, 0]) for t in got] == list(range(8))


class Batches(Dataset):
    """Batch ``i``: a channels-last image batch and labels, both made from ``i``."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        images = torch.arange(4 * 3 * 5 * 6, dtype=torch.uint8).reshape(4, 5, 6, 3) + i
        return transfer.leave_worker((images.permute(0, 3, 1, 2), torch.full((4,), i)))


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_slots_are_reused_only_once_nothing_of_their_batch_is_held(start):
    loader = DataLoader(Batches(), batch_size=None, num_workers=2, multiprocessing_context=start)
    # this process may hold other tests' segments (a feeder's batch kept by a test before, in
    # the same pytest worker): only the segments this loader maps are looked at
    before = [m for segments in arrivals._mapped.values() for m in segments.values()]
    # all 40 held: more than a worker's slots, so some go by value; none is overwritten
    got = list(loader)
    for i, (images, labels) in enumerate(got):
        expected = torch.arange(4 * 3 * 5 * 6, dtype=torch.uint8).reshape(4, 5, 6, 3) + i
        assert type(images) is torch.Tensor and torch.equal(images, expected.permute(0, 3, 1, 2))
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert labels.tolist() == [i] * 4
    flags = [m.buf[:transfer.SLOTS_PER_WORKER] for segments in arrivals._mapped.values()
             for m in segments.values()
             if len(m.buf) == 2 * transfer.SLOTS_PER_WORKER + 1
             and not any(m is b for b in before)]
    assert flags and any(f.tobytes() != bytes(len(f)) for f in flags)  # held batches keep slots
    view, kept = got[3][0][1:2], got[3][0][1:2].clone()  # a view of a batch keeps its slot
    del got, images, labels
    gc.collect()
    assert sum(f.tobytes().count(1) for f in flags) == 1 and torch.equal(view, kept)
    del view
    gc.collect()
    assert all(f.tobytes() == bytes(len(f)) for f in flags)  # every slot free again


KILL_A_WORKER = r"""
import os, re, signal, sys, time
from pathlib import Path
from torch.utils.data import DataLoader
import packdata

def segments(pid):  # the shared-memory segments a process has mapped
    maps = Path(f"/proc/{pid}/maps").read_text()
    return sorted(set(re.findall(r"/dev/shm/(psm_\w+)", maps)))

loader = DataLoader(packdata.open(sys.argv[1]), batch_size=8, shuffle=True, num_workers=2,
                    prefetch_factor=4)
batches = iter(loader)
held = next(batches)
time.sleep(float(sys.argv[2]))  # the workers fill their prefetch: batches in slots on their way
worker = batches._workers[0].pid
names = segments(worker)
print("SEGMENTS", *names)
print("ON DISK", *[n for n in names if os.path.exists("/dev/shm/" + n)])
os.kill(worker, signal.SIGKILL)
try:
    while True:
        next(batches)
except RuntimeError as exc:
    print("ERROR", exc)
del batches, loader
time.sleep(0.5)
print("LEFT", *[n for n in names if os.path.exists("/dev/shm/" + n)])
"""


@pytest.mark.skipif(sys.platform != "linux", reason="/dev/shm and /proc are Linux's")
@pytest.mark.parametrize(("container", "wait"), [("hdf5", 0.0), ("hdf5", 0.5), ("tar", 0.5)])
def test_a_killed_worker_leaves_nothing_in_dev_shm(packed, wait, container):
    """A stock DataLoader's worker SIGKILLed with batches in its slots: the loader fails naming
    it, and none of the worker's segments is left in /dev/shm, neither once the loader is gone
    (the training process still running) nor after the training process exits. Over an HDF5
    dataset, and a tar dataset (whose records are read from their shards' map)."""
    # the kill must find a segment of the worker still on disk for the case to test anything:
    # with no wait, every segment it had mapped was already unlinked once (in a CI run), so a run
    # without one is made again, up to three times
    for _attempt in range(3):
        run = subprocess.run([sys.executable, "-c", KILL_A_WORKER, str(packed[container]),
                              str(wait)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        lines = {line.split(" ", 1)[0]: line.split()[1:] for line in run.stdout.splitlines()
                 if line.split(" ", 1)[0] in ("SEGMENTS", "ON", "ERROR", "LEFT")}
        if lines["ON"][1:]:
            break
    names = lines["SEGMENTS"]
    assert len(names) >= 2  # its ring's flags and at least one slot
    assert lines["ON"][1:], "no segment of the worker was on disk when it was killed"
    # torch names the death by whichever path sees it first: its SIGCHLD handler ("is killed by
    # signal") or its check of the workers' status ("exited unexpectedly"); both name the worker
    error = " ".join(lines["ERROR"])
    assert "DataLoader worker (pid" in error
    assert "exited unexpectedly" in error or "is killed by signal: Killed" in error
    assert lines["LEFT"] == []
    assert not [n for n in names if (Path("/dev/shm") / n).exists()]


def test_batches_read_into_slots_arrive_as_read_in_place(packed, container):
    """A stock DataLoader's workers read each batch of a packed dataset straight into a slot
    (each container's reader gathers into it): every batch, all held at once (more than the
    workers' slots, so some go by value), equals the batch read in this process."""
    ds = packdata.open(packed[container])

    def batches(**options):
        return list(DataLoader(ds, batch_size=4, shuffle=True, **options,
                               generator=torch.Generator().manual_seed(3)))

    reference, workers = batches(), batches(num_workers=2)
    assert len(workers) == len(reference) > 2 * transfer.SLOTS_PER_WORKER
    for (x, y), (rx, ry) in zip(workers, reference, strict=True):
        assert type(x) is torch.Tensor and torch.equal(x, rx) and torch.equal(y, ry)


def test_a_batch_gathered_into_a_slot_leaves_without_a_copy(packed, container, monkeypatch):
    """In a process that sends its batches (made one here, as a feeder is), the collated
    batch's tensors are the slot's bytes the reader gathered into, marked with their places in
    it; arrays gathered into a slot and dropped without being sent free it again."""
    def in_worker(yes: bool) -> None:
        monkeypatch.setattr(units, "_READS_FOR_ANOTHER", yes)

    in_worker(True)
    monkeypatch.setattr(transfer, "_RING", None)
    ds = packdata.open(packed[container])
    try:
        images, labels = default_collate(ds.__getitems__([7, 2, 30, 11]))
        slot, offset = images._packdata_slot[:2]
        assert type(images) is transfer.SlotTensor and slot.lease.sent
        assert images.data_ptr() == slot.address + offset  # in the slot: nothing was copied
        assert labels._packdata_slot[0] is slot
        in_worker(False)
        expected = ds[[7, 2, 30, 11]]
        assert torch.equal(images, expected[0]) and torch.equal(labels, expected[1])
        in_worker(True)
        ring = transfer._ring()
        arrays = transfer.worker_arrays([((4, 3), np.dtype(np.int64))])
        index = ring.holding([torch.from_numpy(arrays[0])]).index
        assert ring.flags.buf[index] == 1
        del arrays
        gc.collect()
        assert ring.flags.buf[index] == 0  # never sent: free once its arrays are gone
    finally:
        transfer._ring().close()
