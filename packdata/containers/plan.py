"""A batch in one step: where every record's fixed fields lie, once a reader knows that (and has
checked it) for all of its records.

A reader reads a batch through layers that each check something: the indices' range, which
records were checked, where each record lies and that it lies inside the file. Once all of that
holds for every record (at open for HDF5 and for LMDB's stored offsets; for tar shards once each
record's index entries were checked, i.e. after a first epoch), a :class:`BatchPlan` reads a batch
as one table lookup per field and one native gather, which itself refuses a row outside its
file; with ``select`` (a point cloud's variant), only the selected entry's bytes. Before the
plan, the containers' readers alone spent 51.5 / 22.4 / 56.0 µs a later-epoch batch over their
gather (lmdb / hdf5 / tar; bench/bench_read_layers.py at commit a26ca72).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from packdata import checksum
from packdata.errors import DatasetError
from packdata.manifest import Field

#: per fixed field, the one entry of its first axis to read for each requested record
Select = dict[str, np.ndarray]
#: per fixed field: its name, a 2-D uint8 view of its bytes, and where each record's bytes begin
#: in it: None where the view has one contiguous row per record (record ``i`` is row ``i``),
#: else a table (int64, one per record) of byte addresses into a view with a row at every byte
PlanColumn = tuple[str, np.ndarray, "np.ndarray | None"]


def selected_entries(select: Select, name: str, field: Field, count: int) -> np.ndarray:
    """``select[name]`` as int64, checked: one entry of ``field``'s first axis for each of the
    ``count`` records read. An IndexError otherwise, for readers that gather an entry at its
    byte offset (an entry past the axis would be another record's bytes)."""
    entries = np.asarray(select[name], dtype=np.int64)
    if entries.shape != (count,) or (count and (entries.min() < 0
                                                or entries.max() >= field.shape[0])):
        raise IndexError(f"select['{name}'] must hold one entry of {field.shape[0]} per record "
                         f"read, got {entries!r:.80}")
    return entries


class BatchPlan:
    """Fixed fields of any records gathered in one native call (see the module docstring); with
    ``select``, one entry of a field's first axis per record, only its bytes read.

    ``check_indices`` is the reader's (an IndexError naming a bad index; negative indices
    counted from the end), run only when the fast lookup refuses the indices; ``damaged`` is
    the error's text for a row outside its view, which only a damaged file makes."""

    def __init__(self, fields: dict[str, Field], columns: Sequence[PlanColumn],
                 check_indices: Callable[[np.ndarray], np.ndarray], damaged: str) -> None:
        self.fields = fields
        self.names = [name for name, _, _ in columns]
        self.views = [view for _, view, _ in columns]
        self.tables = [table for _, _, table in columns]
        self.layouts = [(fields[name].shape, fields[name].np_dtype) for name in self.names]
        self.check_indices = check_indices
        self.damaged = damaged
        self._entry_views: dict[str, np.ndarray] = {}

    def read(self, indices: np.ndarray | Sequence[int], select: Select | None = None,
             out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Records ``indices`` (in that order), each field in a new array or in ``out[name]``
        (C-contiguous, shaped for them); for a field in ``select``, entry ``select[name][j]`` of
        its first axis for record ``j``."""
        idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        entries = {name: selected_entries(select, name, self.fields[name], len(idx))
                   for name in select or {}}
        try:  # the usual batch: numpy's lookup checks the range, the gather each row
            return self._gather(idx, entries, out)
        except IndexError:
            pass
        # a bad or negative index (a row taken as its own number is not counted from the end)
        idx = self.check_indices(idx)
        try:
            return self._gather(idx, entries, out)
        except IndexError:
            raise DatasetError(self.damaged) from None

    def _gather(self, idx: np.ndarray, entries: dict[str, np.ndarray],
                out: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        views, rows, arrays = [], [], []
        for name, view, table, (shape, dtype) in zip(self.names, self.views, self.tables,
                                                     self.layouts):
            at = idx if table is None else table[idx]
            chosen = entries.get(name)
            if chosen is not None:  # rows one entry wide: entry k is k entries into the record
                view, shape = self._entry_view(name, view, table is not None), shape[1:]
                at = at * self.fields[name].shape[0] + chosen if table is None else \
                    at + chosen * view.shape[1]
            views.append(view)
            rows.append(at)
            arrays.append(np.empty((len(idx), *shape), dtype) if out is None else out[name])
        checksum.gather(views, rows, arrays)
        return dict(zip(self.names, arrays))

    def _entry_view(self, name: str, view: np.ndarray, by_byte: bool) -> np.ndarray:
        """``view`` in rows of one entry of the field's first axis: at every byte (``by_byte``),
        or, over a view of one contiguous row per record, as many rows a record as entries."""
        if name not in self._entry_views:
            parts = self.fields[name].shape[0]
            width = view.shape[1] // parts
            if by_byte:  # a row at every byte: as many more as the rows are shorter
                shape, step = (view.shape[0] + view.shape[1] - width, width), 1
            else:
                shape, step = (view.shape[0] * parts, width), width
            self._entry_views[name] = np.lib.stride_tricks.as_strided(
                view, shape=shape, strides=(step, 1), writeable=False)
        return self._entry_views[name]
