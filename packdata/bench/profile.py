"""``--profile DIR``: a few real-loop steps under ``torch.profiler``, a trace for TensorBoard or
Chrome's trace viewer, and the step time broken down by packdata from the profiler's events
(the TensorBoard profiler plugin that used to do this is deprecated).

Each step runs labelled ranges, ``packdata.load`` (waiting for the next batch),
``packdata.to_device`` (host-to-device copy), ``packdata.augment`` (the ``--augment``
augmentation on the device, when given) and ``packdata.train`` (forward, backward, optimiser;
on CUDA each range ends with a synchronisation, so it spans its GPU kernels). ``other`` is
the part of the step (the profiler's ``ProfilerStep#N`` range) that none of them covers. On CUDA
the summed duration of the GPU kernels is reported beside the breakdown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, record_function, schedule, tensorboard_trace_handler

from packdata.bench.inputs import BenchInput, LoaderOptions, endless
from packdata.bench.runner import Trainer, to_device
from packdata.bench.settings import BenchSettings
from packdata.bench.timer import device_sync
from packdata.errors import BenchError
from packdata.loading.device import Augment, augment_images

#: range name → breakdown part
RANGES = {"packdata.load": "data_loading", "packdata.to_device": "host_to_device",
          "packdata.augment": "augmentation", "packdata.train": "compute"}
PARTS = (*RANGES.values(), "other")


def profile_loop(inp: BenchInput, trainer: Trainer, settings: BenchSettings,
                 options: LoaderOptions, out_dir: str | Path, wait: int = 1, warmup: int = 2,
                 active: int = 5, augment: Augment | None = None) -> dict[str, Any]:
    """Profile ``wait + warmup + active`` steps of the real loop; write the trace to ``out_dir``
    and return the breakdown of the active steps (see :func:`breakdown`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = trainer.device
    sync = device_sync(device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    loader = inp.loader(settings.batch_size, options, seed=settings.seed)
    batches = endless(loader)
    try:
        with torch.profiler.profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=tensorboard_trace_handler(str(out_dir), worker_name="packdata-bench"),
        ) as prof:
            for _ in range(wait + warmup + active):
                with record_function("packdata.load"):
                    batch = next(batches)
                with record_function("packdata.to_device"):
                    batch = to_device(batch, device, options.non_blocking)
                    sync()
                with record_function("packdata.augment"):
                    batch = augment_images(batch, augment)
                    sync()
                with record_function("packdata.train"):
                    trainer(batch)
                    sync()
                prof.step()
        events = list(prof.events())
    finally:
        batches.close()
        del loader
    result = breakdown(events, cuda=device.type == "cuda")
    result["trace_dir"] = str(out_dir)
    result["trace_files"] = sorted(p.name for p in out_dir.glob("*.pt.trace.json*"))
    return result


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def breakdown(events: list[Any], cuda: bool = False) -> dict[str, Any]:
    """Mean time per step of each part (ms) from profiler events (anything with ``name``,
    ``time_range.start/end`` in µs and ``device_type``). ``other`` is the step's time no
    labelled range covers, so the parts account for the whole step by construction (a range
    that overlaps another is counted in both)."""
    steps = [e for e in events if e.name.startswith("ProfilerStep")]
    if not steps:
        raise BenchError("no ProfilerStep events: the profiler recorded no active step")
    totals = dict.fromkeys(PARTS, 0.0)
    step_total = kernels = 0.0
    for step in steps:
        s0, s1 = step.time_range.start, step.time_range.end
        step_total += s1 - s0
        covered = []
        for e in events:
            part = RANGES.get(e.name)
            if part is None or e.device_type != torch.autograd.DeviceType.CPU:
                continue
            a, b = max(e.time_range.start, s0), min(e.time_range.end, s1)
            if b > a:
                totals[part] += b - a
                covered.append((a, b))
        totals["other"] += (s1 - s0) - _union_length(covered)
        if cuda:
            kernels += sum(
                min(e.time_range.end, s1) - max(e.time_range.start, s0) for e in events
                if e.device_type == torch.autograd.DeviceType.CUDA
                and e.time_range.end > s0 and e.time_range.start < s1
                and "memcpy" not in e.name.lower())
    n = len(steps)
    parts_ms = {k: v / n / 1e3 for k, v in totals.items()}
    step_ms = step_total / n / 1e3
    out: dict[str, Any] = {
        "steps": n,
        "step_ms": step_ms,
        "parts_ms": parts_ms,
        "data_loading_share": parts_ms["data_loading"] / step_ms if step_ms else float("nan"),
    }
    if cuda:
        out["gpu_kernels_ms"] = kernels / n / 1e3
    return out
