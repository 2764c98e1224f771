"""A batch in one step: where every record's fixed fields lie, once a reader knows that (and has
checked it) for all of its records.

A reader reads a batch through layers that each check something: the indices' range, which
records were checked, where each record lies and that it lies inside the file. Once all of that
holds for every record (at open for HDF5 and for LMDB's stored offsets; for tar shards once each
record's index entries were checked, i.e. after a first epoch), a :class:`BatchPlan` reads a batch
as one table lookup per field and one native gather, which itself refuses a row outside its
file. That Python work per batch is what separated a later epoch from the in-RAM limit
(bench/bench_read_layers.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from packdata import checksum
from packdata.errors import DatasetError
from packdata.manifest import Field

#: per fixed field: its name, its records' bytes as rows of a 2-D uint8 view, and each record's
#: row in it (int64, one per record), or None where record ``i`` is row ``i``
PlanColumn = tuple[str, np.ndarray, "np.ndarray | None"]


class BatchPlan:
    """Fixed fields of any records gathered in one native call (see the module docstring).

    ``check_indices`` is the reader's (an IndexError naming a bad index; negative indices
    counted from the end), run only when the fast lookup refuses the indices; ``damaged`` is
    the error's text for a row outside its view, which only a damaged file makes."""

    def __init__(self, fields: dict[str, Field], columns: Sequence[PlanColumn],
                 check_indices: Callable[[np.ndarray], np.ndarray], damaged: str) -> None:
        self.names = [name for name, _, _ in columns]
        self.views = [view for _, view, _ in columns]
        self.tables = [table for _, _, table in columns]
        self.layouts = [(fields[name].shape, fields[name].np_dtype) for name in self.names]
        self.check_indices = check_indices
        self.damaged = damaged

    def read(self, indices: np.ndarray | Sequence[int],
             out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Records ``indices`` (in that order), each field in a new array or in ``out[name]``
        (C-contiguous, shaped for them)."""
        try:  # the usual batch: numpy's lookup checks the range, the gather each row
            return self._gather(np.ascontiguousarray(indices, dtype=np.int64).reshape(-1), out)
        except IndexError:
            pass
        # a bad or negative index (a row taken as its own number is not counted from the end)
        idx = self.check_indices(np.asarray(indices))
        try:
            return self._gather(idx, out)
        except IndexError:
            raise DatasetError(self.damaged) from None

    def _gather(self, idx: np.ndarray, out: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        rows = [idx if table is None else table[idx] for table in self.tables]
        if out is None:
            arrays = [np.empty((len(idx), *shape), dtype) for shape, dtype in self.layouts]
        else:
            arrays = [out[name] for name in self.names]
        checksum.gather(self.views, rows, arrays)
        return dict(zip(self.names, arrays))

