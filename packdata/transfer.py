"""How batches cross from DataLoader worker processes to the training process.

Torch sends a tensor between processes by moving its storage into a new shared-memory segment
and passing the segment's file descriptor over a socket, one round trip per tensor; for a batch
of small records that handshake, not the bytes, is the cost (measured at several milliseconds a
batch on a busy 2-core machine for a 0.8 MB CIFAR batch, against 0.2 ms to pickle and unpickle
its bytes). :func:`by_value` marks a batch's small tensors to be pickled with their bytes
instead, through the worker's result pipe, and rebuilt as plain tensors on arrival.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from packdata.device import map_tensors

#: larger tensors go through shared memory, where the fixed cost is spread over more bytes (a
#: limit chosen, not measured: by value, each byte is copied about four times on its way)
BY_VALUE_MAX_BYTES = 4 << 20
ENABLED = True  # False: torch's shared-memory transfer (for measuring one against the other)


class ByValueTensor(torch.Tensor):
    """A CPU tensor pickled as its bytes (a numpy array), arriving as a plain tensor."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # ops give plain tensors

    def __reduce_ex__(self, protocol: int) -> tuple:
        plain = self.as_subclass(torch.Tensor)
        # its memory order kept (a channels-last batch arrives channels-last)
        order = sorted(range(plain.ndim), key=lambda d: -plain.stride(d))
        dense = plain.permute(order)
        if not dense.is_contiguous():
            dense, order = plain.contiguous(), list(range(plain.ndim))
        return _from_numpy, (dense.numpy(), tuple(np.argsort(order).tolist()))


def _from_numpy(array: np.ndarray, inverse: tuple) -> torch.Tensor:
    return torch.from_numpy(array).permute(inverse)


def by_value(batch: Any) -> Any:
    """``batch`` with its CPU tensors sent by value when it leaves a DataLoader worker; in the
    training process (or for tensors that cannot be viewed as numpy), unchanged."""
    if not ENABLED or get_worker_info() is None:
        return batch
    return map_tensors(batch, _mark)


def _mark(t: torch.Tensor) -> torch.Tensor:
    if (t.device.type != "cpu" or t.requires_grad or type(t) is not torch.Tensor
            or t.nbytes > BY_VALUE_MAX_BYTES):
        return t
    return t.as_subclass(ByValueTensor)
