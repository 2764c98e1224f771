"""Batches leaving DataLoader workers by value: plain tensors on arrival, same values and
memory order; only in workers, only small CPU tensors."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import torch
from torch.utils.data import DataLoader, Dataset

from packdata import transfer


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
    monkeypatch.setattr(transfer, "get_worker_info", lambda: object())
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
