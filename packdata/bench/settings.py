"""What ``packdata bench`` takes: :data:`OPTIONS`, every option of
:func:`packdata.bench.suite.run_bench` (the command line has one flag each, generated: an option
is one line here, read where it is used), and :class:`BenchSettings`, those that say how each
measurement runs."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packdata.errors import ArgumentTypeError, BenchError
from packdata.options import Option


@dataclass(frozen=True)
class BenchSettings:
    """How to measure: model, batch, device and how long."""

    model: str = "auto"
    batch_size: int = 256
    device: str = "auto"
    amp: bool = False
    steps: int = 50
    warmup: int = 5
    max_seconds: float = 20.0  # per measurement, warm-up included
    workers: int = 0
    seed: int = 0
    warm: bool = True  # read the batches a measurement times once, untimed, before timing them

    def __post_init__(self) -> None:
        for name in ("batch_size", "steps"):
            if getattr(self, name) < 1:
                raise BenchError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.warmup < 0 or self.workers < 0 or not 0 < self.max_seconds < math.inf:
            raise BenchError("warmup and workers must be ≥ 0 and max_seconds finite and > 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_S = BenchSettings  # its fields' defaults, given once
OPTIONS = (
    Option("model", str, _S.model, "small-cnn, resnet18, fast-cifar, pointnet, transformer, or "
           "module:callable / file.py:callable returning a torch.nn.Module. 'auto': by sample "
           "kind (images: resnet18 on a GPU, small-cnn on a CPU)."),
    Option("batch_size", int, _S.batch_size, "Samples per batch."),
    Option("device", str, _S.device, "Where to train.", ("auto", "cpu", "cuda")),
    Option("amp", bool, _S.amp, "Mixed precision (bfloat16 autocast; float16 with loss scaling "
           "on older GPUs)."),
    Option("steps", int, _S.steps, "Timed steps per measurement."),
    Option("warmup", int, _S.warmup, "Untimed steps before each measurement."),
    Option("max_seconds", float, _S.max_seconds, "Bound of each measurement, warm-up included "
           "(it ends within this plus one step even if --steps are not done)."),
    Option("workers", int, _S.workers, "DataLoader worker processes."),
    Option("warm", bool, _S.warm, "Warm: each measurement first reads, untimed, the batches it "
           "times (first reads after opening a dataset are slower); --cold times first reads.",
           flags=("--warm/--cold",)),
    Option("augment", str, None, "Augmentation on the I/O side, on the device after the copy, "
           "as training runs it: 'cifar' (random crop with padding 4, flip, normalise; from "
           "Python, any callable taking a batch of images)."),
    Option("decode", str, None, "Decode stage images are batched through: "
           "random-resized-crop:SIZE (training), center-crop:SIZE[:RESIZE] (evaluation) or "
           "resize:SIZE. Images of mixed sizes get random-resized-crop:224 when none is given."),
    Option("sweep", bool, False, "Also time the real loop for num_workers from 0 to the cores × "
           "prefetch_factor × persistent_workers (× pin_memory × non_blocking on CUDA), each "
           "several times."),
    Option("sweep_seconds", float, 60.0, "Time budget of the whole sweep, shared by every run "
           "of every configuration."),
    Option("sweep_repeats", int, 3, "Runs of each sweep configuration (interleaved), to tell a "
           "winner from noise."),
    Option("target_gpu", str, None, "Estimate whether this GPU would wait for your I/O: A100, "
           "H100, H200, L4, V100, RTX 4090 (peak bf16 with --amp, fp32 without)."),
    Option("target_flops", float, None, "The same for any accelerator: its peak FLOP/s, e.g. "
           "312e12."),
    Option("mfu", float, 0.4, "Share of the target's peak the model would reach (model FLOPs "
           "utilisation), in (0, 1]."),
    Option("profile", Path, None, "Profile a few steps with torch.profiler; write the trace to "
           "this directory and print the step-time breakdown."),
    Option("compare", bool, False, "Image folder only: convert it into every container (in a "
           "temporary directory) and measure each beside the folder."),
)


def resolve(settings: BenchSettings | None, given: dict[str, Any]
            ) -> tuple[BenchSettings, dict[str, Any]]:
    """``settings`` (default: the defaults) with the given options that are its fields, and
    every other option of :data:`OPTIONS`: the given value, checked, or its default."""
    table = {o.name: o for o in OPTIONS}
    unknown = sorted(set(given) - set(table))
    if unknown:
        raise ArgumentTypeError(f"run_bench() got unexpected keyword arguments {unknown} (its "
                                f"options: {', '.join(table)})")
    values = {name: o.check(given.get(name, o.default)) for name, o in table.items()}
    fields = {f.name for f in dataclasses.fields(BenchSettings)}
    settings = dataclasses.replace(settings or BenchSettings(),
                                   **{k: v for k, v in given.items() if k in fields})
    return settings, {k: v for k, v in values.items() if k not in fields}
