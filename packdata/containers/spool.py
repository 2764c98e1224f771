"""Append-only raw files that writers fill during conversion and copy into place at the end.

Spooling keeps conversion memory bounded by one block whatever the dataset size, and lets a
container lay every field out contiguously once the final record count is known.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from packdata.manifest import Field

BLOCK_BYTES = 64 << 20


class Spool:
    """One field's records appended as raw bytes, plus per-record row counts for variable fields."""

    def __init__(self, path: Path, field: Field) -> None:
        self.path = path
        self.field = field
        self.file = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.rows: list[int] = []

    def append(self, value: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(value).data)
        if self.field.variable:
            self.rows.append(len(value))

    def close(self) -> None:
        if not self.file.closed:
            self.file.close()

    def blocks(self, row_bytes: int):
        """Yield the spooled bytes as uint8 arrays of about ``BLOCK_BYTES``, each a whole number
        of ``row_bytes`` rows."""
        self.close()
        size = self.path.stat().st_size
        if size == 0:
            return
        block_bytes = max(row_bytes, BLOCK_BYTES // row_bytes * row_bytes)
        data = np.memmap(self.path, dtype=np.uint8, mode="r")
        for start in range(0, size, block_bytes):
            yield data[start : start + block_bytes]

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
