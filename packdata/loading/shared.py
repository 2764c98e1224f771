"""State that DataLoader worker processes see change: integers in shared memory, written by the
training process (e.g. the epoch, which point-cloud variants follow) and read by its workers."""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing import sharedctypes
from typing import Any

from packdata.units import count_argument


class SharedState:
    """Integers (``_state``) in memory shared with the DataLoader workers this object is handed
    to, so that what the training process writes later reaches persistent workers. Plain
    pickling (``copy.deepcopy``, sending elsewhere) copies them."""

    def __init__(self, size: int) -> None:
        self._state = sharedctypes.RawArray("q", size)

    def __getitem__(self, i: int) -> int:
        return self._state[i]

    def __setitem__(self, i: int, value: int) -> None:
        self._state[i] = value

    def __getstate__(self) -> dict[str, Any]:
        if mp.context.get_spawning_popen() is not None:  # handed to a new worker: share
            return {"shared": self._state}
        return {"copy": list(self._state)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "shared" in state:
            self._state = state["shared"]
        else:
            self._state = sharedctypes.RawArray("q", state["copy"])


class SharedEpoch(SharedState):
    """An epoch number that DataLoader workers see change (:class:`SharedState`)."""

    def __init__(self, epoch: int = 0) -> None:
        super().__init__(1)
        self._state[0] = epoch

    def set(self, epoch: int) -> None:
        """Every process's next reads are of ``epoch``."""
        self._state[0] = count_argument("epoch", epoch)

    @property
    def value(self) -> int:
        """The epoch last :meth:`set`."""
        return self._state[0]
