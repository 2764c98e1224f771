"""A step timer for training loops: how long each step waits for data vs how long it trains.

Per step, ``t1`` is when the loop asks for the next batch, ``t2`` when the batch is ready (on
the device) and ``t3`` when the training step is done. Loading time is ``t2 − t1``, training
time ``t3 − t2``; both are kept as moving averages over the last ``window`` steps and as totals.

>>> timer = StepTimer(window=50)
>>> for images, labels in timer.iterate(loader):   # doctest: +SKIP
...     train_step(images, labels)
>>> timer.summary()                                # doctest: +SKIP
{'steps': 195, 'samples_per_s': 2417.0, 'load_ms': 3.1, 'train_ms': 102.4, 'load_share': 0.03, ...}
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

from packdata.errors import ArgumentError
from packdata.units import count_argument

T = TypeVar("T")


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the length of its first part (``(images, labels)``: the images; a
    dict: its first entry); 1 for something without a length."""
    x = batch
    if isinstance(x, dict) and x:
        x = next(iter(x.values()))
    elif isinstance(x, (tuple, list)) and x:
        x = x[0]
    try:
        return len(x)
    except TypeError:
        return 1


def device_sync(device: str | torch.device | None) -> Callable[[], None]:
    """A function that waits for queued work on ``device`` (CUDA kernels run asynchronously, so
    a timestamp taken without it would measure the launch, not the work); a no-op on CPU."""
    if device is not None and torch.device(device).type == "cuda":
        dev = torch.device(device)
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None


class StepTimer:
    """Loading time vs training time per step, as moving averages over ``window`` steps.

    Use :meth:`iterate` around any iterable of batches, or call :meth:`start`, :meth:`loaded`
    and :meth:`stepped` yourself. ``skip`` first steps (warm-up) are not counted.

    With ``device="cuda"`` the marks are CUDA events on the device's current stream, not
    synchronisations: a synchronisation per mark would stop the host from queuing the next
    steps' kernels while the GPU runs, a stall the loop does not have without the timer. The
    times are then the GPU's: loading is the stream's time from the end of one step's work to
    the end of the next batch's copy and augmentation (idle while the host fetches the batch,
    then copying), training the rest. Times resolve as their events complete; :meth:`summary`
    waits for the last.
    """

    def __init__(self, window: int = 50, device: str | torch.device | None = None,
                 skip: int = 0) -> None:
        if window < 1:
            raise ArgumentError(f"window must be ≥ 1, got {window}")
        self.window = window
        self.skip = count_argument("skip", skip)
        dev = torch.device(device) if device is not None else None
        self._cuda = dev if dev is not None and dev.type == "cuda" else None
        self._load: deque[float] = deque(maxlen=window)
        self._train: deque[float] = deque(maxlen=window)
        self._sizes: deque[int] = deque(maxlen=window)
        self.steps = 0  # counted steps (after skip)
        self.seen = 0  # all steps, skipped ones included
        self.samples = 0
        self.load_total = 0.0
        self.train_total = 0.0
        self._t1: Any = None  # a time, or a CUDA event
        self._t2: Any = None
        self._size = 0
        self._pending: deque[tuple[Any, Any, Any, int]] = deque()  # counted steps' events

    def _mark(self) -> Any:
        if self._cuda is None:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._cuda))
        return event

    def start(self) -> None:
        """``t1``: the loop is about to ask for a batch."""
        self._t1 = self._mark()

    def loaded(self, batch_size: int) -> None:
        """``t2``: the batch of ``batch_size`` samples is ready."""
        self._t2 = self._mark()
        self._size = batch_size

    def stepped(self) -> None:
        """``t3``: the training step on the batch is done."""
        t3 = self._mark()
        if self._t1 is None or self._t2 is None:
            raise RuntimeError("StepTimer: call start() and loaded() before stepped()")
        self.seen += 1
        if self.seen > self.skip:
            self.steps += 1
            self.samples += self._size
            if self._cuda is None:
                self._count(self._t2 - self._t1, t3 - self._t2, self._size)
            else:
                self._pending.append((self._t1, self._t2, t3, self._size))
                self._resolve(wait=False)
        self._t1, self._t2 = t3, None  # the next wait for data starts now

    def _count(self, load: float, train: float, size: int) -> None:
        self._load.append(load)
        self._train.append(train)
        self._sizes.append(size)
        self.load_total += load
        self.train_total += train

    def _resolve(self, wait: bool) -> None:
        """Count the pending CUDA steps whose events have completed (all of them with
        ``wait``)."""
        if wait and self._pending:
            self._pending[-1][2].synchronize()
        while self._pending and self._pending[0][2].query():
            t1, t2, t3, size = self._pending.popleft()
            self._count(t1.elapsed_time(t2) / 1e3, t2.elapsed_time(t3) / 1e3, size)

    def iterate(self, batches: Iterable[T], size: Callable[[T], int] = batch_size_of) -> Iterator[T]:
        """Yield from ``batches``, timing each wait for a batch and each step on it (the step
        is the time until the loop asks for the next batch)."""
        self.start()
        for batch in batches:
            self.loaded(size(batch))
            yield batch
            self.stepped()

    @property
    def load_ms(self) -> float:
        """Moving average of the loading time per step (ms)."""
        self._resolve(wait=False)
        return 1e3 * sum(self._load) / len(self._load) if self._load else float("nan")

    @property
    def train_ms(self) -> float:
        """Moving average of the training time per step (ms)."""
        self._resolve(wait=False)
        return 1e3 * sum(self._train) / len(self._train) if self._train else float("nan")

    @property
    def load_share(self) -> float:
        """Share of the recent step time spent waiting for data (0…1)."""
        self._resolve(wait=False)
        total = sum(self._load) + sum(self._train)
        return sum(self._load) / total if total else float("nan")

    @property
    def samples_per_s(self) -> float:
        """Recent samples per second of the whole loop."""
        self._resolve(wait=False)
        total = sum(self._load) + sum(self._train)
        return sum(self._sizes) / total if total else float("nan")

    def summary(self) -> dict[str, float | int]:
        """Totals over every counted step, and the moving averages (on CUDA, once the device
        has run every step's work)."""
        self._resolve(wait=True)
        total = self.load_total + self.train_total
        return {
            "steps": self.steps,
            "samples": self.samples,
            "seconds": total,
            "samples_per_s": self.samples / total if total else float("nan"),
            "load_ms": 1e3 * self.load_total / self.steps if self.steps else float("nan"),
            "train_ms": 1e3 * self.train_total / self.steps if self.steps else float("nan"),
            "load_share": self.load_total / total if total else float("nan"),
            "recent_load_ms": self.load_ms,
            "recent_train_ms": self.train_ms,
        }

    def __repr__(self) -> str:
        return (f"StepTimer({self.steps} steps, load {self.load_ms:.1f} ms, "
                f"train {self.train_ms:.1f} ms, {self.load_share:.0%} waiting for data)")
