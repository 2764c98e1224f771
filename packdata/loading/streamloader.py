"""Batches of a :class:`~packdata.loading.streaming.StreamingDataset` through a DataLoader, with the
position the training loop reached: a DataLoader takes batches from its workers in turn, so the
batches taken fix each worker's position in its stream (see :mod:`packdata.loading.streaming`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from packdata.errors import ArgumentError
from packdata.units import count_argument

#: what one reader streams: (role, samples of that role's stream already delivered), in order
RoleProgress = list[tuple[int, int]]


class StreamingLoader:
    """Batches of a :class:`StreamingDataset` through a DataLoader (``num_workers`` workers),
    owning the epoch and the position: :meth:`state_dict` mid-epoch, :meth:`load_state_dict` on
    a rebuilt one serves exactly the rest, also at another ``num_workers`` (then in another
    order: each worker batches its own stream). Iterate it once per epoch.

    ``stream`` is the :class:`~packdata.loading.streaming.StreamingDataset` (which builds this loader
    with its ``loader()``: this module does not import it, so the two do not import each other)."""

    def __init__(self, stream: Any, batch_size: int, *, num_workers: int = 0,
                 drop_last: bool = False, **dataloader_options: Any) -> None:
        if dataloader_options.get("in_order", True) is not True:
            raise ArgumentError("in_order=False takes batches in the order workers finish them: "
                                "no position can be saved")
        self.stream = stream
        self.dataset = stream
        self.batch_size = count_argument("batch_size", batch_size, 1)
        self.num_workers = count_argument("num_workers", num_workers)
        self.drop_last = drop_last
        self._options = dataloader_options
        self._dataloader: DataLoader | None = None
        self._next_epoch = 0
        self._loaded: dict[str, Any] | None = None
        self._epoch_plan: tuple[int, int, list[RoleProgress]] | None = None  # (epoch, roles, per reader)
        self._delivered: int | None = None  # batches taken in the epoch in progress

    @property
    def readers(self) -> int:
        return max(self.num_workers, 1)

    @property
    def dataloader(self) -> DataLoader:
        if self._dataloader is None:
            self._dataloader = DataLoader(self.stream, batch_size=self.batch_size,
                                          num_workers=self.num_workers, drop_last=self.drop_last,
                                          **self._options)
        return self._dataloader

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs."""
        self._next_epoch = epoch
        self.stream.set_epoch(epoch)

    def _batches(self, samples: int) -> int:
        return samples // self.batch_size if self.drop_last else -(-samples // self.batch_size)

    def __len__(self) -> int:
        """Batches per epoch (each worker batches its own stream)."""
        return sum(self._batches(self.stream.role_size(r, self.readers))
                   for r in range(self.readers))

    def __iter__(self) -> Iterator[Any]:
        epoch = self._next_epoch
        self.stream.set_epoch(epoch)  # keeps a loaded state of this epoch
        plans = [self.stream.plan(epoch, j, self.readers) for j in range(self.readers)]
        self._epoch_plan = (epoch, plans[0][0], [p for _, p in plans])
        batches = iter(self.dataloader)  # workers start here, each with the loaded state
        self.stream.drop_loaded_position()
        self._loaded = None
        self._next_epoch = epoch + 1
        return self._counted(batches)

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        self._delivered = 0
        for batch in batches:
            self._delivered += 1
            yield batch
        self._delivered = None

    def state_dict(self) -> dict[str, Any]:
        """The stream's state after the batches taken so far (plain JSON, O(workers))."""
        if self._loaded is not None:
            return self._loaded
        if self._delivered is None or self._epoch_plan is None:
            return self.stream.fresh_state(self._next_epoch)
        epoch, roles, plans = self._epoch_plan
        left = [sum(self.stream.role_size(role, roles) - skip for role, skip in plan)
                for plan in plans]
        taken, nxt = _round_robin([self._batches(n) for n in left], self._delivered)
        positions = [self.stream.role_size(r, roles) for r in range(roles)]
        for plan, batches, n in zip(plans, taken, left):
            done = min(batches * self.batch_size, n)  # samples this reader delivered
            for role, skip in plan:
                size = self.stream.role_size(role, roles)
                positions[role] = skip + min(done, size - skip)
                done -= positions[role] - skip
        groups = [[role for role, _ in plan] for plan in plans]
        return self.stream.position_state(epoch, roles, groups, positions, nxt)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (or the stream's own)."""
        self.stream.load_state_dict(state)
        self._next_epoch = self.stream.next_epoch
        self._loaded, self._delivered, self._epoch_plan = state, None, None
        self._dataloader = None  # persistent workers would keep the old position


def _round_robin(batches: list[int], k: int) -> tuple[list[int], int]:
    """Batches each reader delivered after a DataLoader handed out ``k``, taking one from each
    reader with batches left in turn (from reader 0), and the reader whose turn is next."""
    n = len(batches)
    k = min(k, sum(batches))
    full = min(k // n, min(batches))  # rounds where every reader delivered
    taken = [full] * n
    k -= full * n
    j = 0
    while k > 0:
        if taken[j] < batches[j]:
            taken[j] += 1
            k -= 1
        j = (j + 1) % n
    return taken, j
