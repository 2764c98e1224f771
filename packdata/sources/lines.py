"""Text inputs as arrays: one row per document (its file, line number and byte range), so that
listing millions of lines costs a few bytes each, not a Python object each.

:func:`scan_lines` finds the non-blank lines of a file block by block (memory stays at one
block whatever the file's size); :class:`DocTable` holds the rows and builds the
:class:`TextItem` of a row only when it is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packdata.sources.base import Item, ItemTable

SCAN_BYTES = 1 << 20  # bytes of a file looked at a time while finding its lines
#: bytes that ``bytes.strip()`` removes: a line of only these is blank
WHITESPACE = np.zeros(256, dtype=bool)
WHITESPACE[list(b" \t\n\r\x0b\x0c")] = True


def scan_lines(path: Path, dtype: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The non-blank lines of ``path``: their 1-based numbers, start and end byte offsets (end
    past the line ending), as ``dtype`` arrays, and the number of blank lines. Line endings are
    those of ``bytes.splitlines``: ``\\n``, ``\\r\\n`` and a lone ``\\r``."""
    # the three columns grow in place by a quarter (a large array is remapped, not copied; numpy
    # zeroes what it adds) and shrink to their lines at the end: joining a piece per chunk held
    # every line's entries twice
    columns = [np.empty(1 << 16, dtype) for _ in range(3)]
    count = 0
    blank, line, base = 0, 0, 0  # base: the file offset of ``carry``'s first byte
    carry = b""
    with path.open("rb") as f:  # a file at a URL (remote.files.RemotePath) opens as one
        while True:
            chunk = f.read(SCAN_BYTES)
            data = carry + chunk
            last = not chunk
            if not data:
                break
            b = np.frombuffer(data, dtype=np.uint8)
            cr = b == 13
            # a \r ends a line unless a \n follows; the last byte's follower is in the next read
            nxt = np.append(b[1:] == 10, False)
            breaks = np.flatnonzero((b == 10) | (cr & ~nxt))
            if not last and len(b) and b[-1] == 13:  # \r or \r\n: decided by the next read
                breaks = breaks[breaks < len(b) - 1]
            line_ends = breaks + 1
            if last and (not len(line_ends) or line_ends[-1] != len(b)):
                line_ends = np.append(line_ends, len(b))  # a last line without an ending
            line_starts = np.concatenate([[0], line_ends[:-1]]).astype(np.int64)
            if len(line_ends):
                solid = np.logical_or.reduceat(~WHITESPACE[b[: line_ends[-1]]], line_starts)
                keep = np.flatnonzero(solid)
                if count + len(keep) > len(columns[0]):
                    for column in columns:
                        column.resize(max(len(column) * 5 // 4, count + len(keep)),
                                      refcheck=False)
                at = slice(count, count + len(keep))
                columns[0][at] = keep + line + 1
                columns[1][at] = line_starts[keep] + base
                columns[2][at] = line_ends[keep] + base
                count += len(keep)
                blank += len(line_ends) - len(keep)
                line += len(line_ends)
            done = int(line_ends[-1]) if len(line_ends) else 0
            carry, base = data[done:], base + done
            if last:
                break
    for column in columns:
        column.resize(count, refcheck=False)
    return (*columns, blank)


@dataclass(frozen=True)
class TextItem(Item):
    """A document: a whole file (``line`` None) or the bytes ``[start, end)`` of one line."""

    line: int | None = None
    start: int = 0
    end: int = 0  # for a whole file: its size when listed (used to balance worker tasks)

    @property
    def origin(self) -> str:
        return f"{self.path}:{self.line}" if self.line else str(self.path)


class DocTable(ItemTable):
    """Documents as rows: ``files`` (key and path of each input file), ``first[f]`` the first row
    of file ``f`` (``len(files) + 1`` entries), and per row its ``line`` (0: the whole file) and
    byte range ``[start, end)``. Slices are tables over views of the same arrays.

    Keys are unique by construction: ``FILE`` for a whole file, ``FILE:LINE`` for a line (FILE
    ends in its suffix, LINE in digits)."""

    def __init__(self, files: list[tuple[str, Path]], first: np.ndarray, line: np.ndarray,
                 start: np.ndarray, end: np.ndarray) -> None:
        self.files, self.first = files, first
        self.line, self.start, self.end = line, start, end

    def __len__(self) -> int:
        return len(self.line)

    def file_of(self, i: int) -> int:
        return int(np.searchsorted(self.first, i, "right")) - 1

    def _item(self, i: int) -> Item:
        key, path = self.files[self.file_of(i)]
        line = int(self.line[i])
        return TextItem(f"{key}:{line}" if line else key, path, line=line or None,
                        start=int(self.start[i]), end=int(self.end[i]))

    def _rows(self, a: int, b: int) -> DocTable:
        if a == b:
            return DocTable([], np.zeros(1, np.int64), self.line[:0], self.start[:0], self.end[:0])
        f0, f1 = self.file_of(a), self.file_of(b - 1) + 1
        first = np.clip(self.first[f0 : f1 + 1].astype(np.int64) - a, 0, b - a)
        return DocTable(self.files[f0:f1], first, self.line[a:b], self.start[a:b],
                        self.end[a:b])

    def cost_blocks(self, block_bytes: int, per_item: int) -> list[DocTable]:
        """Consecutive slices of about ``block_bytes`` of text each (``per_item`` added per row,
        for per-item costs); a row larger than that makes a slice of its own."""
        cuts, total, last = [0], 0, 0
        step = 1 << 20  # rows at a time: the running sums stay small
        for a in range(0, len(self), step):
            cost = (self.end[a : a + step].astype(np.int64) - self.start[a : a + step]
                    + per_item)
            block = (np.cumsum(cost) - cost + total) // block_bytes  # by the text before a row
            cuts.extend((np.flatnonzero(np.diff(block, prepend=last)) + a).tolist())
            total, last = total + int(cost.sum()), int(block[-1])
        cuts.append(len(self))
        return [self[x:y] for x, y in zip(cuts, cuts[1:]) if y > x]


def build(rows: list[tuple[str, Path, tuple[np.ndarray, np.ndarray, np.ndarray] | int]],
          dtype: Any) -> DocTable:
    """A table from each file's ``(key, path, (lines, starts, ends))``, or ``(key, path, size)``
    for a file that is one document."""
    files, counts = [], []
    line, start, end = [], [], []
    whole: list[int] = []  # sizes of consecutive whole files, gathered into one array

    def flush() -> None:
        if whole:
            line.append(np.zeros(len(whole), dtype))
            start.append(np.zeros(len(whole), dtype))
            end.append(np.asarray(whole, dtype))
            whole.clear()

    for key, path, got in rows:
        if isinstance(got, tuple):
            if not len(got[0]):
                continue
            flush()
            line.append(got[0])
            start.append(got[1])
            end.append(got[2])
            counts.append(len(got[0]))
        else:
            whole.append(got)
            counts.append(1)
        files.append((key, path))
    flush()
    first = np.zeros(len(files) + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    return DocTable(files, first, _joined(line, dtype), _joined(start, dtype),
                    _joined(end, dtype))


def _joined(arrays: list[np.ndarray], dtype: Any) -> np.ndarray:
    if len(arrays) == 1:  # one file's: no copy
        return arrays[0]
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype)
