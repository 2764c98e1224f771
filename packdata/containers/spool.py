"""Append-only raw files that writers fill during conversion and copy into place at the end.

Spooling keeps conversion memory bounded by one block whatever the dataset size, and lets a
container lay every field out contiguously once the final record count is known.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np

from packdata.manifest import Field
from packdata.recordmeta import FLUSH, map_array

BLOCK_BYTES = 16 << 20


class Spool:
    """One field's records appended as raw bytes, plus per-record row counts for variable fields
    (spooled too: a file beside it, so memory does not grow with the records)."""

    def __init__(self, path: Path, field: Field) -> None:
        self.path = path
        self.field = field
        self.file = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.counts_path = path.with_name(f"{path.name}.rows")
        self.counts = open(self.counts_path, "wb") if field.variable else None  # noqa: SIM115
        self.pending = array("q")  # row counts not written yet

    def append(self, value: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(value).data)
        if self.counts is not None:
            self.pending.append(len(value))
            if len(self.pending) >= FLUSH:
                self._write_counts()

    def _write_counts(self) -> None:
        self.counts.write(self.pending.tobytes())  # type: ignore[union-attr]
        del self.pending[:]

    def row_counts(self) -> np.ndarray:
        """Each record's row count (a variable field's), mapped from the spooled file."""
        if not self.counts.closed:  # type: ignore[union-attr]
            self._write_counts()
            self.counts.close()  # type: ignore[union-attr]
        return map_array(self.counts_path, "<i8")

    def close(self) -> None:
        if not self.file.closed:
            self.file.close()
        if self.counts is not None and not self.counts.closed:
            self.counts.close()

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
        self.close()
        self.path.unlink(missing_ok=True)
        self.counts_path.unlink(missing_ok=True)
