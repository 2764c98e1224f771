"""The three measurements, each in samples/s.

- **I/O alone** (mock trainer): every batch is moved to the device and discarded.
- **Training alone** (mock loader): one batch stays on the device and is trained on over and over.
- **Both** (the real loop): per step, loading time ``t2 − t1`` and training time ``t3 − t2``,
  timed with :class:`packdata.bench.timer.StepTimer`.

Each measurement skips ``warmup`` steps (worker start-up, cold caches, lazy CUDA init) and then
runs ``steps`` steps; ``max_seconds`` bounds the whole measurement, warm-up included: warm-up
ends after half of it, the timed steps at the end of it (at least one of each), so a
measurement takes at most ``max_seconds`` plus one step.

With ``warm`` (the default) the measurements that read the dataset are *warm*: before timing,
one untimed pass (bounded by ``max_seconds`` too) reads the batches the measurement will time,
and the measurement then replays them. First reads after opening a dataset are slower than any
later ones (the page cache, and LMDB locates each record once per process), so a cold
measurement depends on what was read before; a warm one does not.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from packdata.bench.inputs import BenchInput, LoaderOptions, endless
from packdata.bench.models import describe_batch, loss_of, prepare_inputs, split_batch
from packdata.bench.settings import BenchSettings
from packdata.bench.timer import StepTimer, batch_size_of, device_sync
from packdata.errors import BenchError
from packdata.loading.device import Augment, augment_images, map_tensors, resolve_device


def bench_device(name: str) -> torch.device:
    """``auto`` → cuda when a GPU is visible, else cpu (quietly: a CPU bench is a normal choice);
    a device that is not present is :func:`packdata.loading.device.resolve_device`'s error."""
    if name == "auto" and not torch.cuda.is_available():
        return torch.device("cpu")
    device = resolve_device(name)
    if device.type not in ("cpu", "cuda"):
        raise BenchError(f"device '{name}': the bench runs on cpu or cuda")
    return device


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Every tensor of ``batch`` on ``device`` (the one place the bench copies to the device)."""
    return map_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


class Trainer:
    """One optimiser step on a device batch: forward (autocast when ``amp``), loss, backward."""

    def __init__(self, model: nn.Module, device: torch.device, amp: bool = False,
                 name: str = "model") -> None:
        self.name = name
        self.device = device
        self.model = model.to(device).train()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.amp_dtype: torch.dtype | None = None
        self.scaler: torch.amp.GradScaler | None = None
        if amp:
            # bf16 needs no loss scaling; fp16 (older GPUs) does
            if device.type == "cuda" and not torch.cuda.is_bf16_supported():
                self.amp_dtype = torch.float16
                self.scaler = torch.amp.GradScaler("cuda")
            else:
                self.amp_dtype = torch.bfloat16

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def __call__(self, batch: Any) -> None:
        inputs, target = split_batch(batch)
        with self.autocast():
            loss = loss_of(self.model(*prepare_inputs(inputs)), target)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()

    def check(self, batch: Any) -> None:
        """One step; a model that does not accept the batch raises an error showing it."""
        try:
            self(batch)
        except BenchError:
            raise
        except Exception as exc:  # whatever the user's model raises: report it with the batch
            raise BenchError(f"model '{self.name}' does not accept the batch "
                             f"{describe_batch(batch)}: {type(exc).__name__}: {exc}") from exc

    def state(self) -> dict[str, Any]:
        return copy.deepcopy({"model": self.model.state_dict(),
                              "optimizer": self.optimizer.state_dict()})

    def restore(self, state: dict[str, Any]) -> None:
        """Back to a saved state, so every input is measured from the same weights."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


class Phase:
    """The clock of one measurement: warm-up gets the first half of ``max_seconds`` (at least
    one step), timed steps run to the end of it (at least one)."""

    def __init__(self, settings: BenchSettings, limit: int | None = None) -> None:
        self.settings = settings
        self.start = time.perf_counter()
        # at most this many batches, warm-up and timed together (those the warm pass read)
        self.limit = limit

    def warming(self, done: int) -> bool:
        """Whether warm-up step number ``done`` (0-based) should run."""
        s = self.settings
        if self.limit is not None and done >= self.limit - 1:  # leave one batch to time
            return False
        return done < s.warmup and (
            done == 0 or time.perf_counter() < self.start + s.max_seconds / 2)

    def running(self, done: int, warmed_up: int = 0) -> bool:
        """Whether timed step number ``done`` (0-based), after ``warmed_up`` warm-up steps,
        should run."""
        s = self.settings
        if self.limit is not None and done > 0 and warmed_up + done >= self.limit:
            return False
        return done < s.steps and (
            done == 0 or time.perf_counter() < self.start + s.max_seconds)


def _result(samples: int, steps: int, seconds: float) -> dict[str, float | int]:
    return {"samples_per_s": samples / seconds if seconds > 0 else float("nan"),
            "steps": steps, "samples": samples, "seconds": seconds}


def warm_pass(inp: BenchInput, loader: Any, settings: BenchSettings) -> int | None:
    """Read, untimed, the batches a measurement of ``loader`` will time (at most ``warmup +
    steps``, within ``max_seconds``), then rewind ``loader`` to replay them. The number of
    batches read, or None when that was a whole epoch (then every record has been read)."""
    wanted = settings.warmup + settings.steps
    end = time.perf_counter() + settings.max_seconds
    read = 0
    batches = iter(loader)
    try:
        for _ in batches:
            read += 1
            if read >= wanted or time.perf_counter() >= end:
                break
        else:
            read = -1  # the epoch ended first
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
    inp.rewind(loader, settings.seed)
    return None if read < 0 else read


def _device_batches(inp: BenchInput, settings: BenchSettings, options: LoaderOptions,
                    device: torch.device, augment: Augment | None = None,
                    ) -> tuple[Any, Iterator[Any], int | None]:
    """Batches as the training step receives them: loaded, on the device, augmented; and how
    many of them were read before (None: all of them, or a cold measurement)."""
    loader = inp.loader(settings.batch_size, options, seed=settings.seed)
    limit = warm_pass(inp, loader, settings) if settings.warm else None
    batches = (augment_images(to_device(b, device, options.non_blocking), augment)
               for b in endless(loader))
    return loader, batches, limit


def measure_io(inp: BenchInput, settings: BenchSettings, options: LoaderOptions,
               device: torch.device, augment: Augment | None = None) -> dict[str, float | int]:
    """Mock trainer: samples/s of batches moved to the device, augmented there by ``augment``
    (when given) and dropped."""
    sync = device_sync(device)
    loader, batches, limit = _device_batches(inp, settings, options, device, augment)
    phase = Phase(settings, limit)
    try:
        warm = 0
        while phase.warming(warm):
            next(batches)
            warm += 1
        sync()
        samples = steps = 0
        start = time.perf_counter()
        while phase.running(steps, warm):
            samples += batch_size_of(next(batches))
            steps += 1
        sync()  # non_blocking copies still in flight belong to the measured time
        return _result(samples, steps, time.perf_counter() - start)
    finally:
        batches.close()
        del loader  # persistent workers end with their loader


def measure_train(trainer: Trainer, batch: Any, settings: BenchSettings) -> dict[str, float | int]:
    """Mock loader: samples/s of training on one batch kept on the device."""
    sync = device_sync(trainer.device)
    phase = Phase(settings)
    warm = 0
    while phase.warming(warm):
        trainer(batch)
        warm += 1
    sync()
    size = batch_size_of(batch)
    steps = 0
    start = time.perf_counter()
    while phase.running(steps):
        trainer(batch)
        steps += 1
    sync()
    return _result(size * steps, steps, time.perf_counter() - start)


def measure_loop(inp: BenchInput, trainer: Trainer, settings: BenchSettings,
                 options: LoaderOptions, on_step: Callable[[], None] | None = None,
                 augment: Augment | None = None) -> dict[str, float | int]:
    """The real loop: samples/s, and loading vs training time per step (ms, and the share of
    the step spent loading), from :class:`StepTimer`; the augmentation counts as loading."""
    timer = StepTimer(window=settings.steps, device=trainer.device, skip=settings.warmup)
    loader, batches, limit = _device_batches(inp, settings, options, trainer.device, augment)
    phase = Phase(settings, limit)
    try:
        for batch in timer.iterate(batches):
            if timer.seen < timer.skip and not phase.warming(timer.seen):
                timer.skip = timer.seen  # warm-up has had its half of the time: count from here
            if timer.seen >= timer.skip and not phase.running(timer.steps, timer.skip):
                break
            trainer(batch)
            if on_step is not None:
                on_step()
    finally:
        batches.close()
        del loader
    summary = timer.summary()
    return {key: summary[key] for key in
            ("samples_per_s", "steps", "samples", "seconds", "load_ms", "train_ms", "load_share")}


def first_batch(inp: BenchInput, settings: BenchSettings, device: torch.device,
                augment: Augment | None = None) -> Any:
    """One batch of the input, on the device and augmented, as training sees it (sizes the
    model and feeds the mock loader)."""
    loader = inp.loader(settings.batch_size, LoaderOptions(), seed=settings.seed)
    return augment_images(to_device(next(iter(loader)), device), augment)
