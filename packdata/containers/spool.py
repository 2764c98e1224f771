"""Append-only raw files that writers fill during conversion and copy into place at the end.

Spooling keeps conversion memory bounded by one block whatever the dataset size, and lets a
container lay every field out contiguously once the final record count is known.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from packdata.manifest import Field
from packdata.spooling import ColumnSpool

BLOCK_BYTES = 16 << 20


class Spool:
    """One field's records appended as raw bytes, plus per-record row counts for variable fields
    (spooled too: a column beside it, so memory does not grow with the records)."""

    def __init__(self, path: Path, field: Field) -> None:
        self.path = path
        self.field = field
        self.file = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.counts = (ColumnSpool(path.with_name(f"{path.name}.rows"), "<i8")
                       if field.variable else None)

    def append(self, value: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(value).data)
        if self.counts is not None:
            self.counts.append(len(value))

    def row_counts(self) -> np.ndarray:
        """Each record's row count (a variable field's), mapped from the spooled file."""
        return self.counts.finish()  # type: ignore[union-attr]

    def close(self) -> None:
        if not self.file.closed:
            self.file.close()

    def blocks(self, row_bytes: int):
        """Yield the spooled bytes as uint8 arrays of about ``BLOCK_BYTES``, each a whole number
        of ``row_bytes`` rows. One buffer is reused, so memory stays at one block."""
        self.close()
        block_bytes = max(row_bytes, BLOCK_BYTES // row_bytes * row_bytes)
        buffer = np.empty(block_bytes, dtype=np.uint8)
        with open(self.path, "rb") as f:
            while got := f.readinto(buffer):  # buffered: full blocks until the end of file
                yield buffer[:got]

    def remove(self) -> None:
        with contextlib.suppress(OSError):  # a flush that fails (a full disk) still closes
            self.close()
        self.path.unlink(missing_ok=True)
        if self.counts is not None:
            self.counts.remove()
