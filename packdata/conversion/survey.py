"""The survey: every input's header read before any is loaded, block by block in worker
processes (a header read is a file opened and a few bytes read: microseconds each, but millions
of them would be the converting process's largest serial cost).

What the headers tell settles the source's choices (images of one size or several) and the rows
each input's variable-length fields will hold, from which a writer lays its output out and
each worker knows where its records go (:mod:`.placing`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from packdata.conversion.costs import Costs, WorkerClock
from packdata.conversion.pool import WorkerPool
from packdata.errors import PackdataError, WorkerDied
from packdata.sources.base import BLOCK, Item, Source, Survey
from packdata.units import available_cores

#: survey tasks a worker at most (a few: the ends of the slowest wait for no one long)
TASKS = 8

# the source, sent once per worker (forked), not once per block
_worker_source: Source | None = None


def _set_worker_source(source: Source) -> None:
    global _worker_source
    _worker_source = source


def _survey_block(items: list[Item]) -> tuple[Survey, dict[str, float]]:
    clock = WorkerClock()
    with clock.phase("survey"):
        survey = _worker_source.survey(items)  # type: ignore[union-attr]
    return survey, clock.spent


def survey(source: Source, items: Sequence[Item], workers: int | None = None,
           costs: Costs | None = None) -> dict[str, np.ndarray] | None:
    """Survey ``items`` where ``source`` surveys its inputs: in ``workers`` processes (default:
    the cores this process may use), here with one; the source settles what the surveys decide
    (:meth:`Source.surveyed`). Returns each input's rows of each variable-length field, where
    every header told them (else None). In ``costs``: the workers' phase "survey", and the
    parent's "survey" (reading headers itself, which more workers would spread) or "surveying"
    (waiting for the workers' results, and receiving them)."""
    if not source.surveying:
        return None
    costs = costs if costs is not None else Costs()
    workers = max(1, workers or available_cores())
    # a header read costs microseconds: tasks far larger than loading's, TASKS a worker
    size = max(BLOCK, -(-len(items) // (TASKS * workers)))
    blocks = [items[a : a + size] for a in range(0, len(items), size)]
    workers = min(workers, len(blocks))
    if workers <= 1:
        with costs.phase("survey"):
            surveys = [source.survey(block) for block in blocks]
    else:
        surveys = []
        try:
            with WorkerPool(workers, _set_worker_source, (source,)) as pool:
                results = pool.ordered(_survey_block, blocks, 2 * workers)
                while True:
                    with costs.phase("surveying"):
                        _, (found, spent) = next(results, (None, (None, None)))
                    if found is None:
                        break
                    costs.add_workers(spent)
                    surveys.append(found)
        except WorkerDied:  # reading headers kills no process: a kill from outside
            raise PackdataError("a conversion worker stopped unexpectedly (killed, or out of "
                                "memory) while reading the inputs' headers") from None
    with costs.phase("surveying"):
        source.surveyed(surveys)
        if not surveys or any(s.rows is None for s in surveys):
            return None
        return {name: np.concatenate([s.rows[name] for s in surveys])  # type: ignore[index]
                for name in surveys[0].rows}  # type: ignore[union-attr]
