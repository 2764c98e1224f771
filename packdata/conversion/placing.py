"""Workers that write their records into the output themselves, where the writer lays it out
ahead (``Writer.PLACES_ROWS``; :mod:`packdata.containers.placement`).

Before the first block is loaded, the converting process loads one input itself (the probe:
the records' fields), makes the writer and has it lay the output out for every input, each
variable-length field at the rows the survey of the headers counted (:mod:`.survey`). Each block
then travels with its :class:`Slot`: the worker that loads it checks its records as the
converting process would (one record an input, every field matching the conversion's, the rows
its slot holds) and writes them there, sending back only their checksums (:class:`Placed`). A
block that does not fit its slot is sent back as loaded and stored by the converting process,
which gives the layout up (the writer keeps what is in place, see ``Writer.place``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from packdata.containers.base import Writer, columns_of
from packdata.containers.placement import Column, Placement, Slot
from packdata.conversion.costs import Costs, WorkerClock
from packdata.conversion.rows import Hashed, Rows
from packdata.errors import SampleError
from packdata.manifest import Field
from packdata.recordmeta import packed_keys
from packdata.sources.base import Item, Loaded, keys_of, safe_load

if TYPE_CHECKING:
    from packdata.conversion.job import Job

#: inputs the probe loads at most before giving placement up (all failed: they are reported
#: by the blocks that load them again)
PROBES = 16

#: what travels with a block to its worker: where its records go
Placing = tuple[Placement, Slot]


@dataclass
class Placed:
    """A block whose records a worker wrote into ``slot``, with their checksums and keys
    (packed and hashed there: :func:`packdata.recordmeta.packed_keys`)."""

    slot: Slot
    checksums: np.ndarray  # uint64, one a record
    keys: tuple[np.ndarray, np.ndarray, np.ndarray]

    @property
    def nbytes(self) -> int:
        """What crossed from the worker: the checksums and the keys."""
        return self.checksums.nbytes + sum(a.nbytes for a in self.keys)


def probe(job: Job, costs: Costs) -> tuple[dict[str, Field], Item] | None:
    """The fields of the first input that loads as one record (and that input), loaded here;
    None where the first :data:`PROBES` fail or one makes several records."""
    source = job.source
    with costs.phase("probe"):
        kept = source.take_notes()
        try:
            for item in job.items[:PROBES]:
                loaded = safe_load(source, item)
                if isinstance(loaded, dict):
                    return source.fields(loaded), item
                if not isinstance(loaded, SampleError):
                    return None
        finally:  # what the probe noted is noted again by the worker that loads its input
            source.take_notes()  # (and the workers forked next would each inherit it)
            source.add_notes(kept)
    return None


def slots(job: Job, writer: Writer) -> Callable[[list[Item]], Placing | None]:
    """Each block's place in the layout of ``writer`` (asked block by block, in order, as the
    block's task is made): none once the writer has given its layout up."""
    placement = writer.placement
    assert placement is not None
    ends = {name: np.concatenate([[0], np.cumsum(job.rows[name], dtype=np.int64)])  # type: ignore[index]
            for name, field in placement.fields.items() if field.variable}
    first = 0

    def slot_of(block: list[Item]) -> Placing | None:
        nonlocal first
        a, first = first, first + len(block)
        if writer.placement is None:
            return None
        rows = {name: (int(e[a]), int(e[first] - e[a])) for name, e in ends.items()}
        return placement, Slot(a, first - a, rows)

    return slot_of


def put(items: list[Item], loaded: Rows | Hashed | list[Loaded], placing: Placing,
        clock: WorkerClock) -> Placed | Rows | Hashed | list[Loaded]:
    """In a worker: the records ``items`` loaded written into their slot where they fit it
    exactly (:class:`Placed`); else ``loaded`` as it is, for the converting process."""
    placement, slot = placing
    found = _columns(loaded, placement.fields, slot)
    if found is None:
        return loaded
    columns, checksums = found
    with clock.phase("place"):
        if not placement.write(slot, columns):
            return loaded
        return Placed(slot, checksums, packed_keys(keys_of(items)))


def _columns(loaded: Rows | Hashed | list[Loaded], fields: dict[str, Field], slot: Slot
             ) -> tuple[dict[str, Column], np.ndarray] | None:
    """Each field's values of the block's records and their checksums, where every input
    made one record of ``fields`` and the block's rows are its slot's; else None."""
    if isinstance(loaded, Rows):
        if not loaded.fit(fields) or len(loaded) != slot.count:
            return None
        return dict(columns_of(loaded.table, fields)), loaded.checksums
    if not isinstance(loaded, Hashed) or not loaded.fit(fields) or len(loaded.loaded) != slot.count:
        return None
    records = loaded.loaded
    if not all(isinstance(one, dict) for one in records) or any(
            sums is None or len(sums) != 1 for sums in loaded.checksums):
        return None
    columns: dict[str, Column] = {}
    for name, field in fields.items():
        values = [one.get(name) for one in records]  # type: ignore[union-attr]
        try:
            for value in values:
                field.check(name, value)  # type: ignore[arg-type]
        except (ValueError, TypeError, AttributeError):  # a record unlike the first: named there
            return None
        if field.variable:
            if sum(len(v) for v in values) != slot.rows[name][1]:  # type: ignore[arg-type]
                return None
            columns[name] = values  # type: ignore[assignment]
        else:
            columns[name] = np.stack(values)  # type: ignore[arg-type]
    return columns, np.array([sums[0] for sums in loaded.checksums], dtype=np.uint64)  # type: ignore[index]
