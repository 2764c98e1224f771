"""The HDF5 writer's half that lets worker processes write records into the file themselves.

Every dataset is made at its final size with its space allocated at once (so that its byte
offset in the file is known: :class:`packdata.containers.placement.FilePlacement`), and the
converting process never writes their bytes through libhdf5 (whose sieve buffer would write a
stale copy of a dataset's first bytes back over what a worker wrote there). Blocks arrive in
order; the first appended otherwise (an input skipped, a record larger than the headers said)
gives the layout up: what is in place moves to the spools, as in the writer's own in-place
path, and blocks the workers write afterwards are read back from the file, kept open.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from packdata.containers.hdf5files import plain_errors
from packdata.containers.hdf5layout import offsets_name
from packdata.containers.placement import FilePlacement, Placement, Slot


class HDF5Placing:
    """Mixed into :class:`packdata.containers.hdf5.HDF5Writer` (whose state it shares)."""

    PLACES_ROWS = True
    placement: FilePlacement | None = None
    #: the layout given up, and the file's descriptor its later blocks are read back from
    given_up: tuple[FilePlacement, int] | None = None

    def place(self: Any, count: int, rows: dict[str, int] | None = None) -> Placement | None:
        variable = [name for name, f in self.fields.items() if f.variable]
        if count <= 0 or self.count or any(name not in (rows or {}) for name in variable):
            return None
        import h5py

        early = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        early.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)  # offsets known before any write
        early.set_fill_time(h5py.h5d.FILL_TIME_NEVER)  # every byte is a record's
        starts, ends = {}, {}
        with plain_errors():
            self.file = h5py.File(self.path, "w", track_order=True)
            for name, f in self.fields.items():
                if f.variable:  # as finish() lays them out: the offsets, then the rows
                    self.offsets[name] = self._dataset(
                        offsets_name(name), shape=(count + 1,), dtype=np.int64, dcpl=early)
                    ends[name] = self.offsets[name].id.get_offset()
                    self.rows[name] = self.flushed_rows[name] = 0
                    self.ends[name] = []
                shape = (rows[name], *f.row_shape) if f.variable else (count, *f.shape)  # type: ignore[index]
                self.datasets[name] = self._dataset(name, shape=shape, dtype=f.np_dtype,
                                                    dcpl=early)
                starts[name] = self.datasets[name].id.get_offset()
            self.file.flush()
        self.expected = count
        self.placement = FilePlacement(os.fspath(self.path), dict(self.fields), starts, ends)
        self.placement.start()
        return self.placement

    def placed(self: Any, slot: Slot) -> None:
        if slot.first != self.count:  # inputs before it were skipped: the layout has a gap
            self.give_up_placement()
        if self.placement is not None:
            self.count = self.flushed = self.count + slot.count
            for name, (_, rows) in slot.rows.items():
                self.rows[name] = self.flushed_rows[name] = self.rows[name] + rows
            return
        layout, fd = self.given_up
        columns = layout.read(fd, slot)
        for name, spool in self.spools.items():
            if layout.fields[name].variable:
                for value in columns[name]:
                    spool.append(value)
            else:
                spool.append(columns[name])
        self.count += slot.count

    def give_up_placement(self: Any) -> None:
        """Records from now on go to the spools (see the module docstring)."""
        if self.placement is None:
            return
        self.given_up = (self.placement, os.open(self.path, os.O_RDONLY))
        self.placement = None
        self._to_spools()

    def let_go(self) -> None:
        """Close the file kept for reading blocks back."""
        if self.given_up is not None:
            os.close(self.given_up[1])
            self.given_up = None
