"""The per-record checksum: one implementation, used when writing, reading and verifying.

A record's checksum covers its fields' bytes in manifest order (for a variable field, its rows'
bytes). :func:`batch_checksums` computes it for a whole batch; :func:`chunks_checksum` for a record
whose bytes arrive as separate buffers (members fetched from object storage).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

Buffer = Any  # anything exposing the buffer protocol: bytes, memoryview, a contiguous ndarray


def chunks_checksum(chunks: Iterable[Buffer]) -> int:
    """The checksum of a record given its fields' bytes in manifest order."""
    crc = 0
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    return crc


def record_checksum(record: Mapping[str, np.ndarray], fields: Iterable[str]) -> int:
    """The checksum of one record, fields in ``fields``' (the manifest's) order."""
    return chunks_checksum(np.ascontiguousarray(record[name]).data for name in fields)


def batch_checksums(batch: Mapping[str, Any], fields: Mapping[str, Any], n: int) -> list[int]:
    """Each record's checksum over a batch of ``n`` records read in one go: fixed fields as one
    (records, bytes) table each, so the loop over records does nothing but hash."""
    parts = []
    for name, field in fields.items():
        value = batch[name]
        if field.variable:
            parts.append([np.ascontiguousarray(v) for v in value])
        else:
            parts.append(np.ascontiguousarray(value).reshape(n, -1).view(np.uint8))
    return [chunks_checksum(part[j] for part in parts) for j in range(n)]
