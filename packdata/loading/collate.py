"""Collate functions for variable-length token sequences: pad to the batch's longest, or pack.

Both take what a text dataset returns for a batch — a list of 1-D integer tensors — so they work
as ``collate_fn`` of a DataLoader fed whole batches (``batch_size=None`` with a batch sampler such
as :class:`packdata.loading.buckets.LengthBucketBatchSampler`) and of a stock per-sample DataLoader.
No Python loop over tokens: one C++ copy per sequence (padding) or one concatenation (packing).

>>> pad_collate([torch.tensor([5, 6, 7]), torch.tensor([8])], pad_id=0)
(tensor([[5, 6, 7],
        [8, 0, 0]]), tensor([[ True,  True,  True],
        [ True, False, False]]))
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from packdata.errors import ArgumentError
from packdata.units import count_argument


def _lengths_and_flat(seqs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    if not len(seqs):
        raise ArgumentError("cannot collate an empty batch")
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    return lengths, torch.cat(list(seqs)).to(torch.int64)


def pad_collate(
    seqs: Sequence[torch.Tensor], pad_id: int = 0, multiple_of: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask)``: ids int64 B×L padded with ``pad_id`` to the longest sequence
    (rounded up to ``multiple_of``, which some kernels prefer), mask bool B×L, True on tokens."""
    _check_padding(pad_id, multiple_of)
    if not len(seqs):
        raise ArgumentError("cannot collate an empty batch")
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    # pad_sequence copies row by row in C++, with no mask over the padded batch
    ids = pad_sequence(list(seqs), batch_first=True, padding_value=pad_id).to(torch.int64)
    extra = -ids.shape[1] % multiple_of
    if extra:
        ids = torch.nn.functional.pad(ids, (0, extra), value=pad_id)
    return ids, torch.arange(ids.shape[1]) < lengths[:, None]


@dataclass(frozen=True)
class PadCollate:
    """:func:`pad_collate` with its options bound, for ``DataLoader(collate_fn=...)``."""

    pad_id: int = 0
    multiple_of: int = 1

    def __post_init__(self) -> None:
        _check_padding(self.pad_id, self.multiple_of)  # here, not at the first batch

    def __call__(self, seqs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return pad_collate(seqs, self.pad_id, self.multiple_of)


def _check_padding(pad_id: int, multiple_of: int) -> None:
    count_argument("multiple_of", multiple_of, 1)  # 0 divided by zero, -1 was taken as 1
    if isinstance(pad_id, bool) or not isinstance(pad_id, numbers.Integral):
        raise ArgumentError(f"pad_id must be an integer (a token id), got {pad_id!r}")


@dataclass(frozen=True)
class PackedBatch:
    """Sequences concatenated into fixed-length blocks.

    ``segment_ids[b, t]`` numbers the documents inside block ``b`` from 1 (0 marks padding at the
    end of the last block), so a token may attend to ``t'`` only where the segment ids match;
    ``position_ids`` count from 0 at each document's start and carry on across a block boundary
    when a document continues into the next block.
    """

    input_ids: torch.Tensor  # int64 N×block_size
    segment_ids: torch.Tensor  # int32 N×block_size
    position_ids: torch.Tensor  # int64 N×block_size

    @property
    def padding_fraction(self) -> float:
        return float((self.segment_ids == 0).sum()) / self.segment_ids.numel()


def pack_sequences(seqs: Sequence[torch.Tensor], block_size: int, pad_id: int = 0) -> PackedBatch:
    """Concatenate ``seqs`` and cut the stream into blocks of ``block_size`` tokens; only the last
    block is padded. Documents are kept in order and whole, though one may span two blocks."""
    if block_size < 1:
        raise ArgumentError(f"block_size must be ≥ 1, got {block_size}")
    lengths, flat = _lengths_and_flat(seqs)
    total = len(flat)
    blocks = max(1, -(-total // block_size))
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    position = torch.arange(total) - starts[doc]
    size = blocks * block_size
    ids = torch.full((size,), pad_id, dtype=torch.int64)
    ids[:total] = flat
    positions = torch.zeros(size, dtype=torch.int64)
    positions[:total] = position
    segments = torch.zeros(size, dtype=torch.int32)
    first_doc = doc[::block_size]  # the document each block starts in
    within = doc - first_doc.repeat_interleave(block_size)[:total] + 1
    segments[:total] = within.to(torch.int32)
    shape = (blocks, block_size)
    return PackedBatch(ids.view(shape), segments.view(shape), positions.view(shape))


@dataclass(frozen=True)
class PackCollate:
    """:func:`pack_sequences` with its options bound, for ``DataLoader(collate_fn=...)``."""

    block_size: int
    pad_id: int = 0

    def __call__(self, seqs: Sequence[torch.Tensor]) -> PackedBatch:
        return pack_sequences(seqs, self.block_size, self.pad_id)
